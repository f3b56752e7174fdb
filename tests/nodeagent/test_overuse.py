"""Over-use: flagged within one sample, evicted (opt-in, time-slice only) after the grace, never within booking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.apiserver import FakeApiServer
from fakes.eviction_api import set_pdb_blocks
from fakes.proc_tree import ProcTree
from fakes.pynvml_fake import FakeGpu, FakeNvml, FakeProcess
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as kclient

from nodeagent.agent import AgentOptions, NodeAgent
from nodeagent.allocate import Trust
from nodeagent.config import AgentConfig
from nodeagent.overuse import KubeEvictor, LogEvictor, OverUseWatch, act
from nodeagent.publish import LogPublisher
from packing.k8s.pod_usage import ANN_POD_USAGE, NodeUsageReport, PodUsage, parse_pod_usage

GIB = 1024 ** 3
UID = "8d3e2c1a-0b4f-4c6d-9e7f-112233445566"
CID = "a" * 64


def _report(used: int | None, booked: int = 4 * GIB, unit: str = "timeslice") -> NodeUsageReport:
    over = used is not None and used > booked
    return NodeUsageReport(sampled_at="2026-12-06T07:00:00Z", period_s=5, pods=(
        PodUsage("team-a", "chat-0", UID, "main", "GPU-ts", unit, used, used, booked, over),))


@given(st.lists(st.tuples(st.none() | st.integers(0, 8 * GIB), st.integers(1, 30)), min_size=1, max_size=30),
       st.sampled_from([0.0, 10.0, 60.0]))
def test_only_a_pod_over_for_the_whole_grace_is_evicted(samples: list[tuple[int | None, int]], grace: float) -> None:
    watch = OverUseWatch(policy="evict", grace_s=grace)
    now = 0.0
    over_since: float | None = None
    for used, step in samples:
        now += step
        is_over = used is not None and used > 4 * GIB
        over_since = (over_since if over_since is not None else now) if is_over else None
        actions = watch.step(_report(used), now)
        for o in actions.evict:
            assert is_over and o.used_bytes > o.booked_bytes  # never a pod within its booking
            assert over_since is not None and now - over_since >= grace
            watch.done(o.uid)
        if is_over and over_since is not None and now - over_since >= grace and UID not in watch.evicted:
            raise AssertionError("an over-booking pod past its grace was not evicted")


def test_warned_once_per_episode_and_report_policy_never_evicts() -> None:
    watch = OverUseWatch(policy="report", grace_s=0)
    assert len(watch.step(_report(5 * GIB), 0).warn) == 1
    assert watch.step(_report(5 * GIB), 5).warn == ()
    assert watch.step(_report(5 * GIB), 500).evict == ()
    assert watch.step(_report(3 * GIB), 505).warn == ()
    assert len(watch.step(_report(6 * GIB), 510).warn) == 1


def test_mps_pods_are_flagged_not_evicted() -> None:
    watch = OverUseWatch(policy="evict", grace_s=0)
    actions = watch.step(_report(5 * GIB, unit="mps"), 0)
    assert len(actions.warn) == 1 and actions.evict == ()


def test_a_blocking_pdb_is_retried_and_eviction_goes_through_the_api() -> None:
    pod = {"metadata": {"name": "chat-0", "namespace": "team-a", "uid": UID},
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}
    fake = FakeApiServer(pods=[pod]).start()
    try:
        api = kclient.ApiClient(kclient.Configuration(host=fake.url))
        evictor = KubeEvictor(api)
        blocked = [True]
        set_pdb_blocks(fake, lambda ns, name: blocked[0])
        watch = OverUseWatch(policy="evict", grace_s=0)
        counts: list[str] = []
        lines = act(watch.step(_report(5 * GIB), 0), watch, evictor, lambda o: None, counts.append)
        assert lines and "PodDisruptionBudget" in lines[0]
        assert counts == ["event"] and fake.get_pod("team-a", "chat-0") is not None
        blocked[0] = False
        assert act(watch.step(_report(5 * GIB), 5), watch, evictor, lambda o: None, counts.append) == []
        assert counts == ["event", "eviction"] and fake.get_pod("team-a", "chat-0") is None
        evictions = [r for r in fake.requests if r.path.endswith("/eviction")]
        assert evictions[-1].json()["deleteOptions"]["preconditions"]["uid"] == UID
        assert evictor.evict("team-a", "chat-0", UID) == "gone"
    finally:
        fake.stop()


class _Pods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self._pods = pods

    def pods(self) -> list[dict[str, Any]]:
        return list(self._pods)

    def refresh(self) -> list[dict[str, Any]]:
        return list(self._pods)


class _Inventory:
    def read(self) -> list[dict[str, Any]]:
        return [{"index": 0, "uuid": "GPU-ts", "mode": "timeslice", "replicas": 4, "memory_mib": 15360,
                 "product": "Tesla-T4"}]


def test_the_agent_flags_a_pod_1_gib_over_within_one_sample(tmp_path: Path) -> None:
    ProcTree(tmp_path / "proc").container_process(100, UID, CID)
    pod = {"metadata": {"name": "chat-0", "namespace": "team-a", "uid": UID},
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]},
           "status": {"phase": "Running", "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}]}}
    gpu = FakeGpu(name="Tesla T4", uuid="GPU-ts", memory_mib=15360, processes=[FakeProcess(100, 5 * GIB)])
    config = AgentConfig(proc_root=str(tmp_path / "proc"), over_use="evict", over_use_grace_s=60,
                         usage_publish_s=15)
    publisher = LogPublisher()
    evictor = LogEvictor()
    clock = [0.0]
    agent = NodeAgent(AgentOptions(node_name="gpu-1", plugin_dir=str(tmp_path), pod_resources_socket=None,
                                   trust=Trust(keys=None, allow_unsigned=True)),
                      config, _Inventory(), _Pods([pod]), publisher, usage_nvml=FakeNvml([gpu]), evictor=evictor,
                      clock=lambda: clock[0])
    agent.refresh_inventory()
    agent.ledger.record(UID, "team-a/chat-0", "main", ["d"], ("GPU-ts",), (4096,))
    report = agent.sample_usage()
    assert report is not None and report.pods[0].over
    assert [e[2] for e in publisher.events] == ["VramfitOverBooking"]
    text = agent.metrics.exposition().decode()
    for name in ("vramfit_pod_vram_used_bytes", "vramfit_pod_vram_booked_bytes", "vramfit_pod_vram_peak_bytes",
                 "vramfit_pod_vram_over_booking", "vramfit_overuse_events_total", "vramfit_overuse_evictions_total"):
        assert name in text
    assert 'vramfit_pod_vram_over_booking{container="main",gpu_uuid="GPU-ts",namespace="team-a",pod="chat-0",' \
           'unit="timeslice"} 1.0' in text
    published = parse_pod_usage(publisher.published[ANN_POD_USAGE], "node gpu-1")
    assert published.pods[0].used_bytes == 5 * GIB
    clock[0] = 10.0
    gpu.processes = [FakeProcess(100, 6 * GIB)]
    agent.sample_usage()
    assert evictor.asked == []  # within the grace
    assert parse_pod_usage(publisher.published[ANN_POD_USAGE], "n").pods[0].used_bytes == 5 * GIB  # rate-limited
    clock[0] = 61.0
    agent.sample_usage()
    assert evictor.asked == [("team-a", "chat-0", UID)]
    assert parse_pod_usage(publisher.published[ANN_POD_USAGE], "n").pods[0].used_bytes == 6 * GIB
