"""`vramfit node` with `timeslice_enforcement: hami-core`, through the fake kubelet's Allocate on the wire.

The agent is built as the CLI builds it (config file, inventory file, snapshot pods, signing key); the kubelet
stand-in admits signed pods and records each container's ContainerAllocateResponse. A time-slice container gets
HAMi-core's library, preload file, its own cache directory and the node's lock directory as mounts, its booked
MiB per CUDA ordinal (PCI bus order, from the published bus ids) as env, and the host paths exist before the
kubelet hears of them. Units of other modes get none of it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kubelet import AdmitResult, FakeKubelet, cleanup_socket_dir, short_socket_dir
from node_signing import KEY_TEXT, sign_pod

from nodeagent.agent import NodeAgent
from nodeagent.allocate import (
    GPU_RESOURCE,
    HAMI_CACHE_FILE,
    HAMI_CACHE_IN_CONTAINER,
    HAMI_LIBRARY_IN_CONTAINER,
    HAMI_LOCK_IN_CONTAINER,
    PRELOAD_IN_CONTAINER,
)
from nodeagent.cli import add_node_parser, build_agent
from nodeagent.devices import tickets

NODE = "gpu-node-1"
# NVML's index and the PCI bus disagree on purpose: GPU 0 sits on the higher bus.
GPUS: list[dict[str, Any]] = [
    {"index": 0, "uuid": "GPU-ts-0", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice", "replicas": 4,
     "pci_bus_id": "00000000:81:00.0"},
    {"index": 1, "uuid": "GPU-ts-1", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice", "replicas": 4,
     "pci_bus_id": "00000000:41:00.0"},
    {"index": 2, "uuid": "GPU-ex", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"},
]


class HamiRig:
    """The agent (HAMi-core on), the fake kubelet, the snapshot file the agent reads its pods from."""

    def __init__(self, tmp: Path, sockets: Path) -> None:
        self.library = tmp / "host" / "libvgpu.so"
        self.library.parent.mkdir()
        self.library.write_bytes(b"\x7fELF")
        self.cache_dir = tmp / "host" / "hami"
        (sockets / "dp").mkdir()
        (sockets / "pr").mkdir()
        self.snapshot = tmp / "pods.yaml"
        self.pods: list[dict[str, Any]] = []
        self.snapshot.write_text("")
        (tmp / "gpus.json").write_text(json.dumps(GPUS))
        (tmp / "key").write_text(KEY_TEXT)
        (tmp / "agent.yaml").write_text(yaml.safe_dump({
            "timeslice_enforcement": "hami-core", "hami_core_library": str(self.library),
            "hami_core_cache_dir": str(self.cache_dir), "mps": {"root": str(tmp / "mps")},
            "allocate_lookup_s": 1.0, "reconcile_interval_s": 3600, "usage_period_s": 0}))
        self.kubelet = FakeKubelet(sockets / "dp", sockets / "pr").start()
        parser = argparse.ArgumentParser()
        add_node_parser(parser.add_subparsers())
        args = parser.parse_args([
            "node", "--node-name", NODE, "--inventory-file", str(tmp / "gpus.json"), "--snapshot", str(self.snapshot),
            "--device-plugin-dir", str(sockets / "dp"), "--config", str(tmp / "agent.yaml"),
            "--state-dir", str(tmp / "state"), "--signing-key", str(tmp / "key")])
        self.agent: NodeAgent = build_agent(args)
        self.agent.plugin.poll_s = 0.05
        self.agent.start()
        self.kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
        advertised = sum(tickets(g) for g in GPUS)
        self.kubelet.wait_for_devices(GPU_RESOURCE, lambda d: len(d) == advertised, timeout_s=10)

    def admit(self, name: str, grants: list[tuple[int, int]], containers: int = 1) -> AdmitResult:
        pod = sign_pod({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-12-03T10:00:0{len(self.pods)}Z",
                         "annotations": {"vramfit.io/assignment": json.dumps(
                             {"gpus": [{"index": i, "mig": None, "vram_mib": v} for i, v in grants]}),
                             "vramfit.io/phase": "allocating"}},
            "spec": {"nodeName": NODE, "schedulerName": "vramfit-scheduler", "containers": [
                {"name": f"c{n}", "image": "vllm", "resources": {"limits": {GPU_RESOURCE: str(len(grants))}}}
                for n in range(containers)]},
            "status": {"phase": "Pending"}})
        self.pods.append(pod)
        self.snapshot.write_text(yaml.safe_dump_all(self.pods))
        (result,) = self.kubelet.admit([pod])
        assert result.admitted, result.message
        pod["status"]["startTime"] = "2026-12-03T10:00:00Z"
        self.snapshot.write_text(yaml.safe_dump_all(self.pods))
        return result

    def stop(self) -> None:
        self.agent.stop()
        self.kubelet.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[HamiRig]:
    sockets = short_socket_dir()
    r = HamiRig(tmp_path, sockets)
    try:
        yield r
    finally:
        r.stop()
        cleanup_socket_dir(sockets)


def allocation(result: AdmitResult, container: str) -> tuple[dict[str, str], dict[str, tuple[str, bool]]]:
    """(envs, container path -> (host path, read-only)) of the container's answer as the kubelet got it."""
    got = result.container(container).allocations[GPU_RESOURCE]
    return got.envs, {m.container_path: (m.host_path, m.read_only) for m in got.mounts}


def test_each_time_slice_container_gets_hami_core_and_its_host_paths_exist(rig: HamiRig) -> None:
    result = rig.admit("vllm", [(1, 4096)], containers=2)
    preload = rig.cache_dir / "ld.so.preload"
    locks = rig.cache_dir / "vgpulock"
    for container in ("c0", "c1"):
        envs, mounts = allocation(result, container)
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
        assert envs["CUDA_DEVICE_SM_LIMIT"] == "100"
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == HAMI_CACHE_FILE
        assert envs["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-ts-1"
        cache = rig.cache_dir / "containers" / f"uid-vllm_{container}"
        assert mounts == {HAMI_LIBRARY_IN_CONTAINER: (str(rig.library), True),
                          PRELOAD_IN_CONTAINER: (str(preload), True),
                          HAMI_CACHE_IN_CONTAINER: (str(cache), False),
                          HAMI_LOCK_IN_CONTAINER: (str(locks), False)}
        # The runtime bind-mounts these as they are: they exist, writable by the workload's user.
        assert cache.is_dir() and os.stat(cache).st_mode & 0o777 == 0o777
    assert locks.is_dir() and os.stat(locks).st_mode & 0o777 == 0o777
    assert preload.read_text() == HAMI_LIBRARY_IN_CONTAINER + "\n"


def test_a_two_gpu_time_slice_pod_is_capped_per_ordinal_in_bus_order(rig: HamiRig) -> None:
    envs, _ = allocation(rig.admit("ddp", [(0, 2048), (1, 6144)]), "c0")
    # GPU 1 sits on the lower bus: CUDA's device 0 under PCI_BUS_ID, whatever NVML's index says.
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-ts-1,GPU-ts-0"
    assert (envs["CUDA_DEVICE_MEMORY_LIMIT_0"], envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("6144m", "2048m")


def test_a_whole_gpu_gets_nothing_of_hami_core(rig: HamiRig) -> None:
    envs, mounts = allocation(rig.admit("trainer", [(2, 15360)]), "c0")
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-ex"}
    assert mounts == {}
    assert not (rig.cache_dir / "containers").exists()
