"""Two extender replicas against one API server: one leader on a Lease, fenced binds, failover mid-burst.

Both replicas are what `vramfit serve --in-cluster` assembles (`extender.replica.cluster_replica`); the API
stand-in serves Leases with the registry's optimistic concurrency. A "kubelet" thread admits bound pods
(`status.startTime`), and the scheduler's calls go through a "Service" that picks a ready replica, as
Endpoints would — plus stray calls to the standby, as a lagging endpoint list would send them.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer

from benchmarks.local_server import LocalServer
from extender.config import Settings
from extender.kube import Backoff, api_client
from extender.leader import LeaderElector, LeaseConfig
from extender.replica import Replica, cluster_replica
from packing.catalog import load_catalog

NS = "vramfit-system"
LEASE = LeaseConfig(namespace=NS, name="vramfit-extender", lease_duration_s=1.5, renew_deadline_s=1.0,
                    retry_period_s=0.2)
GPUS = {
    "mig-node": [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "mig",
                  "mig": [{"profile": "1g.10gb", "start": s} for s in range(7)]} for i in range(2)],
    "mps-node": [{"index": i, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mps", "replicas": 4} for i in range(2)],
    "ts-node": [{"index": i, "product": "Tesla-T4", "mode": "timeslice", "replicas": 4} for i in range(2)],
}
MEMORY = {"mig-node": 9728, "mps-node": 81559 // 4, "ts-node": 15360}


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"vramfit.io/gpus": json.dumps(GPUS[name])}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}}


def pod(name: str, tenant: str, vram_mib: int, isolation: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": tenant, "annotations": {"vramfit.io/isolation": isolation}},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"vramfit.io/vram": str(vram_mib), "vramfit.io/gpu": "1"}}}]}}


def wait(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} not reached in time")
        time.sleep(0.01)
    return time.monotonic() - start


@dataclass
class Running:
    replica: Replica
    server: LocalServer
    client: httpx.Client
    killed: bool = False


class Cluster:
    def __init__(self) -> None:
        self.fake = FakeApiServer(nodes=[node(n) for n in GPUS]).start()
        self.replicas: list[Running] = []
        self.stop = threading.Event()
        self.kubelet = threading.Thread(target=self._admit, daemon=True)
        self.kubelet.start()

    def add_replica(self, identity: str) -> Running:
        api = api_client(host=self.fake.url)
        lease = LeaseConfig(**{**LEASE.__dict__, "identity": identity})
        settings = Settings(admission_wait_s=3.0, emit_events=False)
        replica = cluster_replica(api, settings, load_catalog(), lease=lease,
                                  backoff=lambda: Backoff(initial_s=0.01, max_s=0.05)).start()
        server = LocalServer(replica.asgi).start()
        running = Running(replica, server, httpx.Client(base_url=server.url, timeout=20))
        self.replicas.append(running)
        return running

    def _admit(self) -> None:
        """The kubelets: every bound pod is admitted a moment later."""
        while not self.stop.wait(0.02):
            with self.fake._lock:  # noqa: SLF001 - a consistent read of the stand-in's storage
                todo = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.fake.pods
                        if p["spec"].get("nodeName") and not (p.get("status") or {}).get("startTime")]
            for ns, name in todo:
                self.fake.set_pod_status(ns, name, startTime="2026-12-03T10:00:00Z", phase="Running")

    def ready(self) -> list[Running]:
        return [r for r in self.replicas if not r.killed and r.client.get("/readyz").status_code == 200]

    def leader(self) -> Running:
        wait(lambda: len(self.ready()) == 1, what="one ready replica")
        (leader,) = self.ready()
        return leader

    def schedule(self, p: dict[str, Any], stray: Running | None = None, attempts: int = 40) -> str:
        """kube-scheduler's cycles for one pod until it binds (or gives up): filter, prioritize, bind."""
        meta = p["metadata"]
        last = ""
        for _ in range(attempts):
            targets = self.ready()
            if stray is not None and not stray.killed:
                targets = [stray, *targets]  # a lagging endpoint list still names the standby
            if not targets:
                time.sleep(0.05)
                continue
            c = targets[0].client
            current = self.fake.get_pod(meta["namespace"], meta["name"])
            assert current is not None
            if current["spec"].get("nodeName"):
                return ""
            try:
                f = c.post("/filter", json={"Pod": current, "NodeNames": list(GPUS)})
                if f.status_code != 200:
                    last = f.text
                    stray = None
                    continue
                names = f.json().get("NodeNames") or []
                if not names:
                    return "unschedulable: " + json.dumps(f.json().get("FailedNodes"))
                prio = c.post("/prioritize", json={"Pod": current, "NodeNames": names}).json()
                best = max(prio, key=lambda h: h["Score"])["Host"] if isinstance(prio, list) else names[0]
                b = c.post("/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                          "PodUID": current["metadata"]["uid"], "Node": best})
                last = b.text
                if b.status_code == 200 and not b.json().get("Error"):
                    return ""
            except httpx.HTTPError as err:  # a replica killed mid-call
                last = str(err)
            stray = None
            time.sleep(0.05)
        return last

    def kill(self, r: Running) -> None:
        """kill -9: no lease release, the process and its port are gone."""
        r.killed = True
        r.replica.elector.stop_event.set() if r.replica.elector else None
        r.server.stop()
        r.replica.source.stop()

    def close(self) -> None:
        self.stop.set()
        for r in self.replicas:
            r.client.close()
            if not r.killed:
                r.server.stop()
                r.replica.stop(release=False)
        self.fake.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


def check_placements(fake: FakeApiServer) -> tuple[int, int]:
    """(double-booked units, tenant mixes) over every bound pod's recorded assignment."""
    holders: dict[tuple[str, int, str | None], list[str]] = defaultdict(list)
    tenants: dict[tuple[str, int], set[str]] = defaultdict(set)
    vram: Counter[tuple[str, int]] = Counter()
    with fake._lock:  # noqa: SLF001
        pods = copy.deepcopy(fake.pods)
    for p in pods:
        where = p["spec"].get("nodeName")
        if not where:
            continue
        for g in json.loads(p["metadata"]["annotations"]["vramfit.io/assignment"])["gpus"]:
            holders[(where, g["index"], g["mig"])].append(p["metadata"]["name"])
            tenants[(where, g["index"])].add(p["metadata"]["namespace"])
            vram[(where, g["index"])] += g["vram_mib"]
    doubles = sum(1 for (where, _, mig), names in holders.items() if where == "mig-node" and len(names) > 1)
    doubles += sum(1 for (where, _, _), names in holders.items() if where != "mig-node" and len(names) > 4)
    doubles += sum(1 for (where, i), total in vram.items() if where == "ts-node" and total > 15360)
    mixes = sum(1 for (where, _), ts in tenants.items() if where != "mig-node" and len(ts) > 1)
    return doubles, mixes


def test_one_leader_and_the_standby_is_not_ready_and_refuses_verbs(cluster: Cluster) -> None:
    a, b = cluster.add_replica("replica-a"), cluster.add_replica("replica-b")
    leader = cluster.leader()
    standby = b if leader is a else a
    lease = cluster.fake.get_lease(NS, "vramfit-extender")
    assert lease is not None and lease["spec"]["holderIdentity"] == leader.replica.elector.identity  # type: ignore[union-attr]
    assert standby.client.get("/readyz").status_code == 503
    assert "vramfit_leader 1.0" in leader.client.get("/metrics").text
    assert "vramfit_leader 0.0" in standby.client.get("/metrics").text
    p = cluster.fake.add_pod(pod("p0", "team-a", 4096, "hardware"))
    r = standby.client.post("/filter", json={"Pod": p, "NodeNames": list(GPUS)})
    assert r.status_code == 503 and "standby" in r.json()["Error"]
    # Its cache is warm all the same: it has seen the pod and the nodes.
    wait(lambda: "team-a/p0" in standby.replica.store._pods, what="standby's watch")  # noqa: SLF001
    assert standby.replica.store.state.node_names and standby.replica.store.ready


def test_leader_killed_mid_burst_no_double_booking_no_tenant_mix_and_failover_is_fast(cluster: Cluster) -> None:
    cluster.add_replica("replica-a")
    cluster.add_replica("replica-b")
    first = cluster.leader()
    tenants = ["team-a", "team-b", "team-c"]
    pods = [cluster.fake.add_pod(pod(f"burst-{i}", tenants[i % 3], [3000, 9000, 14000][i % 3],
                                     ["hardware", "process", "none"][i % 3])) for i in range(36)]
    at_kill: list[int] = []

    def bound() -> int:
        with cluster.fake._lock:  # noqa: SLF001
            return sum(1 for p in cluster.fake.pods if p["spec"].get("nodeName"))

    def killer() -> None:
        wait(lambda: bound() >= 8, what="first binds")
        at_kill.append(bound())
        cluster.kill(first)

    k = threading.Thread(target=killer)
    k.start()
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(cluster.schedule, pods))
    k.join()
    second = cluster.leader()
    assert second is not first
    doubles, mixes = check_placements(cluster.fake)
    assert (doubles, mixes) == (0, 0)
    assert bound() > at_kill[0], results  # the new leader went on binding the burst
    assert bound() >= 16, results


def test_failover_time_after_a_kill_is_within_a_few_lease_periods(cluster: Cluster) -> None:
    cluster.add_replica("replica-a")
    cluster.add_replica("replica-b")
    first = cluster.leader()
    t0 = time.monotonic()
    cluster.kill(first)
    took = wait(lambda: len(cluster.ready()) == 1, what="the standby taking over")
    # Lease expiry (1.5 s on the standby's own clock) + a retry period + the term's re-list.
    assert took < 4 * LEASE.lease_duration_s, took
    assert time.monotonic() - t0 >= LEASE.lease_duration_s * 0.5  # it did wait for the lease, not grab it


def test_a_leader_that_cannot_renew_stops_binding_before_anyone_else_can_lead(cluster: Cluster) -> None:
    a = cluster.add_replica("replica-a")
    leader = cluster.leader()
    assert leader is a
    elector = a.replica.elector
    assert isinstance(elector, LeaderElector)
    elector.try_acquire_or_renew = lambda: False  # type: ignore[method-assign] - partitioned from the Lease
    p = cluster.fake.add_pod(pod("late", "team-a", 4096, "hardware"))
    wait(lambda: not elector.fresh(), timeout_s=5, what="the renew deadline passing")
    # The fence: even a call that reaches it (and its cache) cannot write a Binding any more.
    wait(lambda: "team-a/late" in a.replica.store._pods, what="watch")  # noqa: SLF001
    out = a.replica.binder
    assert out.fence is not None and out.fence() is False
    r = a.client.post("/bind", json={"PodName": "late", "PodNamespace": "team-a", "PodUID": p["metadata"]["uid"],
                                     "Node": "mig-node"})
    assert r.status_code == 503 or "lease" in r.json()["Error"]
    assert not (cluster.fake.get_pod("team-a", "late") or {}).get("spec", {}).get("nodeName")


def test_graceful_stop_hands_the_lease_over_at_once(cluster: Cluster) -> None:
    a, b = cluster.add_replica("replica-a"), cluster.add_replica("replica-b")
    leader = cluster.leader()
    other = b if leader is a else a
    t0 = time.monotonic()
    leader.replica.stop(release=True)
    leader.killed = True
    leader.server.stop()
    wait(lambda: other.client.get("/readyz").status_code == 200, what="takeover")
    assert time.monotonic() - t0 < LEASE.lease_duration_s + 1.0  # no need to wait for expiry
