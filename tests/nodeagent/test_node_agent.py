"""`vramfit node` in its dry-run form (inventory file + snapshot pods) against the fake kubelet.

The kubelet stand-in speaks the real device plugin and pod-resources protocols on unix sockets and admits pods
in its own order; the MPS control daemons are the stand-in executable. Every mode's answer, a kubelet
restart (re-registration), an agent restart (the ledger), an MPS daemon crash and reconciliation; and a forged
pod or a held unit refused on the wire. The pods are signed as the extender's Binding signs them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kubelet import FakeKubelet, cleanup_socket_dir, short_socket_dir
from node_signing import KEY_TEXT, KEYS, sign_pod
from waiting import wait_for

from nodeagent.agent import NodeAgent
from nodeagent.allocate import GPU_RESOURCE, Trust, admission_candidates
from nodeagent.cli import add_node_parser, build_agent
from nodeagent.devices import TICKETS_PER_PLACE, tickets
from packing.k8s.trust import ANN_SIGNATURE

NODE = "gpu-node-1"
MPS_FAKE = Path(__file__).resolve().parents[1] / "fakes" / "mps_control.py"
GPUS: list[dict[str, Any]] = [
    {"index": 0, "uuid": "GPU-a100", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "mode": "mig",
     "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a100-0", "memory_mib": 40192},
             {"profile": "3g.40gb", "start": 4, "uuid": "MIG-a100-4", "memory_mib": 40192}]},
    {"index": 1, "uuid": "GPU-h100", "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "mode": "mps",
     "replicas": 4},
    {"index": 2, "uuid": "GPU-t4-ts", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice",
     "replicas": 4},
    {"index": 3, "uuid": "GPU-t4", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"},
]


def pod(name: str, grants: list[dict[str, Any]], created: str, *, containers: int = 1) -> dict[str, Any]:
    return sign_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "creationTimestamp": created,
                     "annotations": {"vramfit.io/assignment": json.dumps({"gpus": grants}),
                                     "vramfit.io/phase": "allocating"}},
        "spec": {"nodeName": NODE, "schedulerName": "vramfit-scheduler", "containers": [
            {"name": f"main{i}", "image": "cuda", "resources": {"limits": {GPU_RESOURCE: str(len(grants))}}}
            for i in range(containers)]},
        "status": {"phase": "Pending"},
    })


def grant(index: int, vram: int, mig: str | None = None) -> dict[str, Any]:
    return {"index": index, "mig": mig, "vram_mib": vram}


def wait(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    wait_for(cond, timeout_s, poll_s=0.02)


class Rig:
    """An agent in dry-run mode, a fake kubelet, and the files between them."""

    def __init__(self, tmp: Path, sockets: Path, gpus: list[dict[str, Any]] | None = None) -> None:
        self.tmp = tmp
        self.gpus = GPUS if gpus is None else gpus
        self.plugin_dir = sockets / "dp"
        self.pr_dir = sockets / "pr"
        self.plugin_dir.mkdir()
        self.pr_dir.mkdir()
        self.snapshot = tmp / "pods.yaml"
        self.inventory = tmp / "gpus.json"
        self.inventory.write_text(json.dumps(self.gpus))
        self.control = tmp / "nvidia-cuda-mps-control"
        self.control.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{MPS_FAKE}" "$@"\n')
        self.control.chmod(self.control.stat().st_mode | stat.S_IXUSR)
        self.key = tmp / "signing-key"
        self.key.write_text(KEY_TEXT)
        self.config = tmp / "agent.yaml"
        self.config.write_text(yaml.safe_dump({"mps": {"root": str(tmp / "mps"), "active_thread_percentage": "auto"},
                                               "allocate_lookup_s": 1.0, "reconcile_interval_s": 3600}))
        self.pods: list[dict[str, Any]] = []
        self.write_pods()
        self.kubelet = FakeKubelet(self.plugin_dir, self.pr_dir).start()
        self.agent: NodeAgent | None = None

    def write_pods(self) -> None:
        self.snapshot.write_text(yaml.safe_dump_all(self.pods))

    def add(self, *pods: dict[str, Any]) -> None:
        self.pods.extend(pods)
        self.write_pods()

    def start_agent(self) -> NodeAgent:
        parser = argparse.ArgumentParser()
        add_node_parser(parser.add_subparsers())
        args = parser.parse_args([
            "node", "--node-name", NODE, "--inventory-file", str(self.inventory), "--snapshot", str(self.snapshot),
            "--device-plugin-dir", str(self.plugin_dir), "--config", str(self.config),
            "--pod-resources-socket", str(self.pr_dir / "kubelet.sock"), "--mps-control", str(self.control),
            "--state-dir", str(self.tmp / "state"), "--signing-key", str(self.key)])
        agent = build_agent(args)
        agent.plugin.poll_s = 0.05
        agent.start()
        self.agent = agent
        self.kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
        advertised = sum(tickets(g) for g in self.gpus)
        self.kubelet.wait_for_devices(GPU_RESOURCE, lambda d: len(d) == advertised, timeout_s=10)
        if any(g["mode"] == "mps" for g in self.gpus):
            wait(lambda: agent.mps is not None and bool(agent.mps.pipe_dirs()))
        return agent

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.kubelet.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    sockets = short_socket_dir()
    r = Rig(tmp_path, sockets)
    try:
        yield r
    finally:
        r.stop()
        cleanup_socket_dir(sockets)
        for pid_file in (tmp_path / "mps").rglob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


LONE_GPU: list[dict[str, Any]] = [GPUS[3]]  # a node whose only GPU is exclusive


@pytest.fixture
def lone_gpu(tmp_path: Path) -> Iterator[Rig]:
    sockets = short_socket_dir()
    r = Rig(tmp_path, sockets, gpus=LONE_GPU)
    try:
        yield r
    finally:
        r.stop()
        cleanup_socket_dir(sockets)


def envs(result: Any, container: str = "main0") -> dict[str, str]:
    return dict(result.container(container).allocations[GPU_RESOURCE].envs)


def admit_one(rig: Rig, p: dict[str, Any]) -> Any:
    rig.add(p)
    (result,) = rig.kubelet.admit([p])
    p["status"]["startTime"] = "2026-12-03T10:00:00Z"  # the kubelet's first status write
    rig.write_pods()
    return result


def test_every_mode_gets_exactly_its_unit(rig: Rig) -> None:
    rig.start_agent()
    devices = rig.kubelet.devices(GPU_RESOURCE)
    assert len(devices) == (2 + 4 + 4 + 1) * TICKETS_PER_PLACE and set(devices.values()) == {"Healthy"}
    mig = admit_one(rig, pod("mig", [grant(0, 30000, "3g.40gb@4")], "2026-12-03T10:00:01Z"))
    assert mig.admitted and envs(mig)["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-4"
    mps = admit_one(rig, pod("mps", [grant(1, 20000)], "2026-12-03T10:00:02Z"))
    e = envs(mps)
    assert e["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100" and e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    mounts = {m.container_path: m.host_path for m in mps.container("main0").allocations[GPU_RESOURCE].mounts}
    assert mounts[e["CUDA_MPS_PIPE_DIRECTORY"]] == str(rig.tmp / "mps" / "GPU-h100" / "pipe")
    ts = admit_one(rig, pod("ts", [grant(2, 4096)], "2026-12-03T10:00:03Z"))
    assert envs(ts) == {"NVIDIA_VISIBLE_DEVICES": "GPU-t4-ts", "VRAMFIT_VRAM_MIB": "4096"}
    two = admit_one(rig, pod("two", [grant(0, 30000, "3g.40gb@0"), grant(3, 15000)], "2026-12-03T10:00:04Z"))
    assert envs(two) == {"NVIDIA_VISIBLE_DEVICES": "MIG-a100-0,GPU-t4"}
    # The preferred tickets named the pod's own GPUs, so the kubelet's accounting matches the hardware.
    ids = two.container("main0").allocations[GPU_RESOURCE].device_ids
    assert sorted(i.split("::")[0] for i in ids) == ["GPU-a100", "GPU-t4"]


def test_a_pod_nobody_marked_is_rejected_not_guessed(rig: Rig) -> None:
    rig.start_agent()
    stray = pod("stray", [grant(3, 1000)], "2026-12-03T10:00:01Z")
    del stray["metadata"]["annotations"]["vramfit.io/phase"]
    rig.add(stray)
    (result,) = rig.kubelet.admit([stray])
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert "refusing to guess" in result.message


def test_a_forged_pod_is_rejected_and_a_held_unit_is_never_handed_out_again(rig: Rig) -> None:
    rig.start_agent()
    assert admit_one(rig, pod("victim", [grant(0, 30000, "3g.40gb@4")], "2026-12-03T10:00:01Z")).admitted
    thief = pod("thief", [grant(0, 30000, "3g.40gb@4")], "2026-12-03T10:00:02Z")
    del thief["metadata"]["annotations"][ANN_SIGNATURE]  # written by its author: nodeName, phase, assignment
    rig.add(thief)
    (result,) = rig.kubelet.admit([thief])
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert "team-a/thief" in result.message and ANN_SIGNATURE in result.message
    # Signed but for a unit the running pod holds (a stale or duplicated booking): refused as well.
    late = pod("late", [grant(0, 30000, "3g.40gb@4")], "2026-12-03T10:00:03Z")
    rig.add(late)
    (result,) = rig.kubelet.admit([late])
    assert not result.admitted and "held by team-a/victim" in result.message


def test_multi_container_pod_each_container_gets_the_pods_units(rig: Rig) -> None:
    rig.start_agent()
    r = admit_one(rig, pod("pair", [grant(3, 1000)], "2026-12-03T10:00:01Z", containers=2))
    assert envs(r, "main0")["NVIDIA_VISIBLE_DEVICES"] == envs(r, "main1")["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4"


def _gpu_container(name: str, n: int, *, sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda", "resources": {"limits": {GPU_RESOURCE: str(n)}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def test_a_pod_of_many_gpu_containers_fits_a_node_whose_only_gpu_is_exclusive(lone_gpu: Rig) -> None:
    lone_gpu.start_agent()
    p = pod("many", [grant(3, 1000)], "2026-12-03T10:00:01Z", containers=2)
    p["spec"]["initContainers"] = [_gpu_container("setup", 1), _gpu_container("proxy", 1, sidecar=True)]
    p = sign_pod(p)
    # kube-scheduler's resource fit (and the kubelet's): 2 app containers + 1 sidecar ask 3 tickets.
    assert lone_gpu.kubelet.scheduler_fit(p, GPU_RESOURCE) is None
    r = admit_one(lone_gpu, p)
    assert r.admitted, r.message
    for c in ("setup", "proxy", "main0", "main1"):
        assert envs(r, c)["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4"
    # The exclusive GPU is held: the next pod booked on it is refused, whatever tickets are left.
    late = pod("late", [grant(3, 1000)], "2026-12-03T10:00:02Z")
    assert lone_gpu.kubelet.scheduler_fit(late, GPU_RESOURCE) is None
    lone_gpu.add(late)
    (refused,) = lone_gpu.kubelet.admit([late])
    assert not refused.admitted and "held whole by team-a/many" in refused.message


def test_a_pod_with_more_gpu_containers_than_tickets_per_place_is_refused_by_name(lone_gpu: Rig) -> None:
    lone_gpu.start_agent()
    p = pod("crowd", [grant(3, 1000)], "2026-12-03T10:00:01Z", containers=TICKETS_PER_PLACE + 1)
    r = admit_one(lone_gpu, p)
    assert not r.admitted and f"more than {TICKETS_PER_PLACE} containers" in r.message


def test_kubelet_restart_means_register_again_and_admission_goes_on(rig: Rig) -> None:
    rig.start_agent()
    first = admit_one(rig, pod("before", [grant(3, 1000)], "2026-12-03T10:00:01Z"))
    assert first.admitted
    incarnation = rig.kubelet.incarnation
    rig.kubelet.restart()
    assert rig.kubelet.incarnation == incarnation + 1
    rig.kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
    rig.kubelet.wait_for_devices(GPU_RESOURCE, lambda d: len(d) == 11 * TICKETS_PER_PLACE, timeout_s=10)
    after = admit_one(rig, pod("after", [grant(0, 30000, "3g.40gb@0")], "2026-12-03T10:00:02Z"))
    assert after.admitted and envs(after)["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-0"


def test_agent_restart_keeps_its_answers_so_a_pod_is_never_answered_twice(rig: Rig) -> None:
    agent = rig.start_agent()
    p = pod("answered", [grant(3, 1000)], "2026-12-03T10:00:01Z")
    rig.add(p)
    (r,) = rig.kubelet.admit([p])
    assert r.admitted
    # The kubelet has not written startTime yet when the agent restarts.
    agent.stop()
    rig.start_agent()
    again = pod("answered-twin", [grant(3, 1000)], "2026-12-03T10:00:02Z")
    again["metadata"]["uid"] = "uid-answered"  # the same pod, seen again: its answer is in the ledger
    assert rig.agent is not None
    cands, _ = admission_candidates(rig.pods, NODE, rig.agent.ledger.answered(), Trust(KEYS))
    assert cands == []


def test_mps_daemon_crash_is_restarted_and_the_next_mps_pod_still_gets_its_share(rig: Rig) -> None:
    agent = rig.start_agent()
    assert agent.mps is not None
    pid_file = rig.tmp / "mps" / "GPU-h100" / "pipe" / "nvidia-cuda-mps-control.pid"
    old = int(pid_file.read_text())
    os.kill(old, signal.SIGKILL)
    agent.mps.check_once()
    wait(lambda: agent.mps is not None and agent.mps.health()["GPU-h100"]["restarts"] >= 1, timeout_s=15)
    r = admit_one(rig, pod("mps-after", [grant(1, 10000)], "2026-12-03T10:00:01Z"))
    assert r.admitted and envs(r)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"
    assert int(pid_file.read_text()) != old
    agent.publish()
    health = json.loads(agent.publisher.published["vramfit.io/node-health"])  # type: ignore[attr-defined]
    assert health["mps"]["GPU-h100"]["restarts"] >= 1


def test_reconcile_finds_a_container_the_agent_never_answered(rig: Rig) -> None:
    agent = rig.start_agent()
    admit_one(rig, pod("ok", [grant(3, 1000)], "2026-12-03T10:00:01Z"))
    assert agent.reconciler is not None
    assert agent.reconciler.run_once() == []
    # Forget the answer (as a lost state dir would): the kubelet's record now has no matching answer.
    agent.ledger._answers.clear()  # noqa: SLF001 - simulating a lost ledger
    found = agent.reconciler.run_once()
    assert found is not None and [(d.pod, d.answered_devices) for d in found] == [("ok", None)]
    events = agent.publisher.events  # type: ignore[attr-defined]
    assert events and events[-1][2] == "VramfitDeviceDivergence"
