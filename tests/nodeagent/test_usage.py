"""Per-pod VRAM: NVML's processes (GPUs, MIG devices, MPS clients) mapped to pods through real cgroup paths."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from fakes.proc_tree import DRIVERS, QOS, RUNTIMES, VERSIONS, Layout, ProcTree
from fakes.pynvml_fake import A100_80GB_PROFILES, FakeGpu, FakeMig, FakeNvml, FakeProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.allocate import Trust
from nodeagent.cgroups import ProcessOwner, parse_cgroup, read_owner
from nodeagent.ledger import Answer
from nodeagent.usage import UsageSampler, sample_processes

GIB = 1024 ** 3
MIB = 1024 ** 2
UID_A = "8d3e2c1a-0b4f-4c6d-9e7f-112233445566"
UID_B = "0f1e2d3c-4b5a-4697-8877-aabbccddeeff"
STATIC_UID = "6f1c3b0e9d2a4f5b8c7d6e5f4a3b2c1d"  # a static pod's: the manifest's hash
CID = "a" * 64
CID2 = "b" * 64


@pytest.mark.parametrize(("runtime", "driver", "version", "qos", "namespaced"),
                         list(itertools.product(RUNTIMES, DRIVERS, VERSIONS, QOS, (False, True))))
def test_every_runtime_and_driver_names_pod_and_container(tmp_path: Path, runtime: str, driver: str, version: int,
                                                          qos: str, namespaced: bool) -> None:
    tree = ProcTree(tmp_path)
    tree.container_process(10, UID_A, CID, Layout(runtime, driver, version, qos, namespaced))
    tree.container_process(11, STATIC_UID, CID2, Layout(runtime, driver, version, qos, namespaced))
    assert read_owner(tmp_path, 10) == (ProcessOwner(UID_A, CID), "")
    assert read_owner(tmp_path, 11) == (ProcessOwner(STATIC_UID, CID2), "")


def test_what_is_no_container_of_a_pod(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path)
    tree.conmon_process(20, UID_A, CID)
    tree.host_process(21)
    tree.host_process(22, "/system.slice/nvidia-persistenced.service", version=1)
    assert read_owner(tmp_path, 20) == (ProcessOwner(UID_A, None), "")
    assert read_owner(tmp_path, 21) == (None, "no pod cgroup")
    assert read_owner(tmp_path, 22) == (None, "no pod cgroup")
    owner, why = read_owner(tmp_path, 23)
    assert owner is None and "hostPID" in why


def test_v1_prefers_a_hierarchy_that_names_the_container() -> None:
    text = ("1:name=systemd:/kubepods.slice/kubepods-pod8d3e2c1a_0b4f_4c6d_9e7f_112233445566.slice\n"
            f"11:memory:/kubepods.slice/kubepods-pod8d3e2c1a_0b4f_4c6d_9e7f_112233445566.slice/cri-containerd-{CID}"
            ".scope\n")
    assert parse_cgroup(text) == ProcessOwner(UID_A, CID)


# ---- a node ---------------------------------------------------------------------------------------------------

PUBLISHED: list[dict[str, Any]] = [
    {"index": 0, "uuid": "GPU-mig", "mode": "mig", "memory_mib": 81920,
     "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-0"}, {"profile": "3g.40gb", "start": 4, "uuid": "MIG-4"}]},
    {"index": 1, "uuid": "GPU-mps", "mode": "mps", "memory_mib": 81920},
    {"index": 2, "uuid": "GPU-ts", "mode": "timeslice", "replicas": 4, "memory_mib": 15360},
]


def _nvml(ts: list[FakeProcess], mps: list[FakeProcess], mig0: tuple[FakeProcess, ...] = ()) -> FakeNvml:
    mig = FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-mig", memory_mib=81920, mig_capable=True,
                  mig_enabled=True, profiles=A100_80GB_PROFILES,
                  mig=[FakeMig("3g.40gb", 0, "MIG-0", 40192, processes=mig0), FakeMig("3g.40gb", 4, "MIG-4", 40192)])
    return FakeNvml([mig, FakeGpu(name="NVIDIA H100", uuid="GPU-mps", memory_mib=81920, processes=mps),
                     FakeGpu(name="Tesla T4", uuid="GPU-ts", memory_mib=15360, processes=ts)])


def _pod(name: str, uid: str, containers: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": c} for c in containers]},
            "status": {"phase": "Running", "startTime": "2026-12-06T06:00:00Z",
                       "containerStatuses": [{"name": c, "containerID": f"containerd://{cid}"}
                                             for c, cid in containers.items()]}}


def _answer(uid: str, pod: str, container: str, unit: str, mib: int) -> Answer:
    return Answer(uid=uid, pod=f"team-a/{pod}", container=container, device_ids=("d",), units=(unit,), at=0.0,
                  vram_mib=(mib,))


def test_sample_reads_mig_devices_one_by_one_and_mps_clients() -> None:
    nvml = _nvml([FakeProcess(1, 2 * GIB)], [FakeProcess(2, 300 * MIB), FakeProcess(3, None, mps_client=True)],
                 (FakeProcess(4, GIB),))
    processes, problems = sample_processes(nvml)
    assert problems == []
    by_pid = {p.pid: p for p in processes}
    assert by_pid[4].unit_uuid == "MIG-0" and by_pid[4].gpu_uuid == "GPU-mig"
    assert by_pid[3].mps_client and by_pid[3].used_bytes is None  # unknown stays unknown
    assert "nvmlDeviceGetMPSComputeRunningProcesses_v3" in nvml.calls
    assert nvml.initialised == 0


def test_the_sampler_makes_no_nvml_call_that_writes() -> None:
    source = (Path(__file__).resolve().parents[2] / "nodeagent" / "usage.py").read_text()
    calls = set(re.findall(r"nvml(?:Device|GpuInstance|ComputeInstance)?(\w*)", source))
    assert not {c for c in calls if re.match(r"(Set|Create|Destroy|Reset|Clear)", c)}


def test_pods_processes_and_strangers(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path)
    tree.container_process(100, UID_A, CID, Layout("containerd", "systemd", 2, "burstable"))
    tree.container_process(101, UID_B, CID2, Layout("crio", "cgroupfs", 1, "besteffort"))
    tree.host_process(102)
    tree.container_process(103, "11111111-2222-3333-4444-555555555555", "c" * 64)  # a pod not on this node
    nvml = _nvml([FakeProcess(100, 5 * GIB), FakeProcess(102, 100 * MIB), FakeProcess(103, MIB)],
                 [FakeProcess(101, 2 * GIB, mps_client=True)])
    pods = [_pod("chat-0", UID_A, {"main": CID}), _pod("embed-0", UID_B, {"srv": CID2})]
    answers = [_answer(UID_A, "chat-0", "main", "GPU-ts", 4096), _answer(UID_B, "embed-0", "srv", "GPU-mps", 4096)]
    report = UsageSampler(proc_root=tmp_path, nvml=nvml).sample(PUBLISHED, pods, answers, Trust(keys=None))
    chat = report.for_pod("team-a", "chat-0")[0]
    assert (chat.unit, chat.used_bytes, chat.booked_bytes, chat.over) == ("timeslice", 5 * GIB, 4 * GIB, True)
    embed = report.for_pod("team-a", "embed-0")[0]
    assert (embed.unit, embed.container, embed.used_bytes, embed.over) == ("mps", "srv", 2 * GIB, False)
    assert {(u.pid, u.why.split()[0]) for u in report.unmapped} == {(102, "no"), (103, "pod")}


def test_peak_is_kept_while_the_pod_lives(tmp_path: Path) -> None:
    ProcTree(tmp_path).container_process(100, UID_A, CID)
    pods = [_pod("chat-0", UID_A, {"main": CID})]
    answers = [_answer(UID_A, "chat-0", "main", "GPU-ts", 4096)]
    sampler = UsageSampler(proc_root=tmp_path)
    for used in (GIB, 3 * GIB, 2 * GIB):
        sampler.nvml = _nvml([FakeProcess(100, used)], [])
        report = sampler.sample(PUBLISHED, pods, answers, Trust(keys=None))
    (u,) = report.pods
    assert (u.used_bytes, u.peak_bytes) == (2 * GIB, 3 * GIB)
    sampler.nvml = _nvml([], [])
    assert sampler.sample(PUBLISHED, [], answers, Trust(keys=None)).pods == ()
    assert sampler.book.peaks == {}


def test_a_booked_pod_with_no_process_uses_nothing(tmp_path: Path) -> None:
    pods = [_pod("idle-0", UID_A, {"main": CID})]
    report = UsageSampler(proc_root=tmp_path, nvml=_nvml([], [])).sample(
        PUBLISHED, pods, [_answer(UID_A, "idle-0", "main", "MIG-4", 40192)], Trust(keys=None))
    (u,) = report.pods
    assert (u.unit, u.gpu_uuid, u.used_bytes, u.booked_bytes) == ("mig:3g.40gb@4", "GPU-mig", 0, 40192 * MIB)


# ---- invariants ---------------------------------------------------------------------------------------------

_UIDS = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(1, 5)]
_procs = st.lists(st.tuples(st.integers(0, len(_UIDS)), st.sampled_from(["ts", "mps"]), st.integers(0, 8 * GIB)),
                  max_size=12)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_procs)
def test_each_process_once_and_each_gpu_adds_up(tmp_path_factory: Any, procs: list[tuple[int, str, int]]) -> None:
    root = tmp_path_factory.mktemp("proc")
    tree = ProcTree(root)
    ts: list[FakeProcess] = []
    mps: list[FakeProcess] = []
    for pid, (owner, where, used) in enumerate(procs, start=1000):
        if owner == len(_UIDS):
            tree.host_process(pid)
        else:
            tree.container_process(pid, _UIDS[owner], f"{owner:064x}")
        (ts if where == "ts" else mps).append(FakeProcess(pid, used, mps_client=where == "mps"))
    pods = [_pod(f"p{i}", uid, {"main": f"{i:064x}"}) for i, uid in enumerate(_UIDS)]
    answers = [_answer(uid, f"p{i}", "main", "GPU-ts", 2048) for i, uid in enumerate(_UIDS)]
    report = UsageSampler(proc_root=root, nvml=_nvml(ts, mps)).sample(PUBLISHED, pods, answers, Trust(keys=None))
    # no process counted for two pods: an entry per (pod, container, unit), each process in exactly one
    keys = [(u.uid, u.container, u.gpu_uuid) for u in report.pods]
    assert len(keys) == len(set(keys))
    for gpu, processes in (("GPU-ts", ts), ("GPU-mps", mps)):
        counted = sum(u.used_bytes or 0 for u in report.pods if u.gpu_uuid == gpu)
        counted += sum(p.used_bytes or 0 for p in report.unmapped if p.gpu_uuid == gpu)
        assert counted == sum(p.used_bytes or 0 for p in processes)
    for u in report.pods:
        if u.unit == "timeslice":
            pod_used = sum(v.used_bytes or 0 for v in report.pods if v.uid == u.uid and v.gpu_uuid == u.gpu_uuid)
            assert u.over == (pod_used > 2048 * MIB)
