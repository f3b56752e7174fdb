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
from datetime import datetime
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.local_server import LocalServer
from extender.config import Settings
from extender.leader import LeaderElector, LeaseConfig
from extender.replica import Replica, cluster_replica
from kubeio.client import api_client
from kubeio.reflector import Backoff
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
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "vramfit.io/gpu": "8"}}}


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

    def add_replica(self, identity: str, **settings_: Any) -> Running:
        api = api_client(host=self.fake.url)
        api.user_agent = f"vramfit-extender/{identity}"  # the API stand-in can fail one replica's calls
        lease = LeaseConfig(**{**LEASE.__dict__, "identity": identity})
        settings = Settings(**{"admission_wait_s": 3.0, "emit_events": False, **settings_})
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
    # Its /readyz says why it does not serve: the standby, not lists it has made.
    why = standby.client.get("/readyz").text
    assert why.startswith("not ready: standby: the Lease") and "not yet listed" not in why, why


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


def lease_writes(fake: FakeApiServer) -> list[dict[str, Any]]:
    """The Lease's spec after each successful create or replace, in order."""
    return [r.json()["spec"] for r in fake.requests
            if r.path.startswith("/apis/coordination.k8s.io/") and r.method in ("POST", "PUT")]


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)  # MicroTime, "Z" or "+00:00"


def test_after_a_kill_the_standby_waits_for_the_lease_to_expire_then_takes_it(cluster: Cluster) -> None:
    cluster.add_replica("replica-a")
    cluster.add_replica("replica-b")
    first = cluster.leader()
    cluster.kill(first)
    wait(lambda: len(cluster.ready()) == 1, what="the standby taking over")
    writes = lease_writes(cluster.fake)
    dead = first.replica.elector.identity  # type: ignore[union-attr]
    last = max(k for k, spec in enumerate(writes) if spec["holderIdentity"] == dead)
    taken = writes[last + 1]
    assert taken["holderIdentity"] != dead and taken["leaseTransitions"] == writes[last]["leaseTransitions"] + 1
    # No grab: the new holder's acquireTime is a full lease duration after the dead leader's last renewal.
    gap = (_when(taken["acquireTime"]) - _when(writes[last]["renewTime"])).total_seconds()
    assert gap >= writes[last]["leaseDurationSeconds"]


def test_a_standby_tries_again_when_the_lease_it_saw_expires_not_a_retry_period_later() -> None:
    now = [100.0]
    elector = LeaderElector(api_client(host="http://127.0.0.1:9"), LeaseConfig(namespace=NS, lease_duration_s=4,
                            renew_deadline_s=2, retry_period_s=0.5, identity="me"), clock=lambda: now[0])
    assert 0.5 <= elector._next_wait() <= 0.6  # noqa: SLF001 - nothing observed yet: the retry period
    elector._observed, elector._observed_at, elector._observed_duration = ("other", "t", 0), 96.2, 4.0  # noqa: SLF001
    assert elector._next_wait() == pytest.approx(0.21)  # noqa: SLF001 - expires at 100.2
    now[0] = 101.0
    assert elector._next_wait() == pytest.approx(0.01)  # noqa: SLF001 - already expired: try now
    now[0] = 96.3
    assert 0.5 <= elector._next_wait() <= 0.6  # noqa: SLF001 - far from expiry: the retry period


@settings(max_examples=300, deadline=None)
@given(observed_at=st.floats(0, 100), duration=st.integers(1, 30), now=st.floats(0, 200),
       leading=st.booleans(), holder=st.sampled_from(["", "other"]))
def test_a_standby_never_waits_past_expiry_nor_longer_than_a_jittered_retry(
        observed_at: float, duration: int, now: float, leading: bool, holder: str) -> None:
    cfg = LeaseConfig(namespace=NS, lease_duration_s=4, renew_deadline_s=2, retry_period_s=0.5, identity="me")
    elector = LeaderElector(api_client(host="http://127.0.0.1:9"), cfg, clock=lambda: now)
    elector._observed, elector._observed_at, elector._observed_duration = (holder, "t", 0), observed_at, duration  # noqa: SLF001
    elector._leading = leading  # noqa: SLF001
    wait_s = elector._next_wait()  # noqa: SLF001
    assert 0 < wait_s <= cfg.retry_period_s * 1.2
    if not leading and holder:
        expires_in = max(0.0, observed_at + duration - now)
        # the next try comes within 10 ms of the record's expiry on our clock, and not sooner than it needs to
        assert min(cfg.retry_period_s, expires_in) <= wait_s <= expires_in + 0.01 + 1e-9


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
    leader.replica.stop(release=True)
    leader.killed = True
    leader.server.stop()
    wait(lambda: other.client.get("/readyz").status_code == 200, what="takeover")
    writes = lease_writes(cluster.fake)
    # The leader wrote an empty holder; the standby took that record over (no need to wait for expiry).
    released = max(k for k, spec in enumerate(writes) if spec["holderIdentity"] == "")
    assert writes[released + 1]["holderIdentity"] == other.replica.elector.identity  # type: ignore[union-attr]


# -- a term whose re-list fails ---------------------------------------------------------------------------
def pod_lists(fake: FakeApiServer, agent: str) -> int:
    """LIST (not watch) calls for pods from the client whose User-Agent names `agent`."""
    return sum(1 for r in fake.requests if r.method == "GET" and r.path == "/api/v1/pods"
               and "true" not in r.query.get("watch", []) and agent in r.headers.get("user-agent", ""))


def new_term_on(r: Running) -> int:
    """The leader misses a renewal deadline and renews at once: a new term on the same replica."""
    elector = r.replica.elector
    assert elector is not None
    term = elector.term
    with elector._op_lock:  # noqa: SLF001 - between two election steps
        elector._step_down("renew deadline missed (test)")  # noqa: SLF001
    wait(lambda: elector.term > term and elector.leading(), what="a new term")
    return elector.term


def test_a_term_whose_pod_lists_fail_for_a_while_retries_and_serves_once_they_recover(cluster: Cluster) -> None:
    a = cluster.add_replica("replica-a", term_relist_deadline_s=600)
    assert cluster.leader() is a
    elector = a.replica.elector
    assert elector is not None
    cluster.fake.failing_lists = {"pods"}
    before = pod_lists(cluster.fake, "replica-a")
    term = new_term_on(a)
    wait(lambda: pod_lists(cluster.fake, "replica-a") >= before + 3, what="the re-list retried")
    r = a.client.get("/readyz")
    assert r.status_code == 503
    assert f"leader (term {term})" in r.text and "re-listing pods" in r.text, r.text
    assert "pods list failing for" in r.text and "etcdserver: request timed out" in r.text, r.text
    assert "nodes" not in r.text.split("re-listing", 1)[1].split(":", 1)[0]  # the nodes re-listed fine
    assert a.client.get("/healthz").status_code == 200  # retrying within its deadline: live
    assert a.client.post("/filter", json={"Pod": pod("x", "team-a", 1000, "hardware"),
                                          "NodeNames": list(GPUS)}).status_code == 503
    cluster.fake.failing_lists = set()
    wait(lambda: a.client.get("/readyz").status_code == 200, what="the term serving")
    assert elector.term == term  # the same term recovered; it kept the Lease throughout
    assert (cluster.fake.get_lease(NS, "vramfit-extender") or {})["spec"]["holderIdentity"] == "replica-a"
    p = cluster.fake.add_pod(pod("after", "team-a", 4096, "hardware"))
    wait(lambda: "team-a/after" in a.replica.store._pods, what="watch")  # noqa: SLF001
    assert cluster.schedule(p) == ""


def test_a_term_whose_lists_fail_past_the_deadline_hands_the_lease_over_and_fails_liveness(cluster: Cluster) -> None:
    b = cluster.add_replica("replica-b", term_relist_deadline_s=1.0)
    assert cluster.leader() is b
    a = cluster.add_replica("replica-a", term_relist_deadline_s=1.0)
    wait(lambda: a.replica.source.ready.is_set(), what="the standby's cache")
    # The standby names the holder once its first try at the Lease has read it ("acquiring" until then).
    standby = "standby: the Lease vramfit-system/vramfit-extender is held by replica-b; this replica is replica-a"
    wait(lambda: standby in a.client.get("/readyz").text, what="the standby seeing the holder")
    cluster.fake.failing_lists, cluster.fake.failing_lists_agent = {"pods"}, "replica-b"  # b's lists are wedged
    term = new_term_on(b)
    # b gives the Lease up; a takes it (its lists work) and serves.
    wait(lambda: a.client.get("/readyz").status_code == 200, what="the standby taking over")
    lease = cluster.fake.get_lease(NS, "vramfit-extender")
    assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
    assert "" in [w["holderIdentity"] for w in lease_writes(cluster.fake)]  # released, not left to expire
    health = b.client.get("/healthz")
    assert health.status_code == 503, health.text
    assert f"stepped down from term {term}" in health.text and "pods not re-listed within 1s" in health.text
    assert "pods list failing for" in health.text and "etcdserver" in health.text, health.text
    ready = b.client.get("/readyz")
    assert ready.status_code == 503 and "not contending for the Lease" in ready.text, ready.text
    assert b.replica.elector is not None and not b.replica.elector.leading()
    p = cluster.fake.add_pod(pod("handed", "team-b", 4096, "hardware"))
    wait(lambda: "team-b/handed" in a.replica.store._pods, what="watch")  # noqa: SLF001
    assert cluster.schedule(p) == ""
    # b's lists work again: live, a standby that contends again (the Lease stays with a).
    cluster.fake.failing_lists = set()
    wait(lambda: b.client.get("/healthz").status_code == 200, what="b live again")
    wait(lambda: "held by replica-a" in b.client.get("/readyz").text, what="b a standby")
    assert b.replica.elector.may_lead()
    assert (cluster.fake.get_lease(NS, "vramfit-extender") or {})["spec"]["holderIdentity"] == "replica-a"


def test_readiness_names_the_kind_whose_first_list_fails(cluster: Cluster) -> None:
    cluster.fake.failing_lists = {"nodes"}
    a = cluster.add_replica("replica-a")
    wait(lambda: a.replica.source.reflectors["pods"].lists > 0, what="the pods listed")
    wait(lambda: "nodes list failing" in a.client.get("/readyz").text, what="a failed nodes list")
    r = a.client.get("/readyz")
    assert r.status_code == 503 and "nodes not listed yet" in r.text and "HTTP 500" in r.text, r.text
    assert "pods not listed" not in r.text
    assert a.client.get("/healthz").status_code == 200  # never led a failed term: no restart asked for
    cluster.fake.failing_lists = set()
    wait(lambda: a.client.get("/readyz").status_code == 200, what="ready once nodes are listed")
