"""Bounded cost for every input (issue 26): /mutate capped and decoded off the event loop, the view, /state and
preempt off it, preempt bounded by what the extender knows, the planner and the view reading only the queue's
head, binds waiting at the admission gate without a pool thread, and a fuzz of every entry point with no 5xx.

Nothing here measures time: "off the event loop" is shown by holding a handler on a threading.Event and having
a verb answered meanwhile; the timing targets are measured by benchmarks/bench_bounded_cost.py."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waiting import wait_for

from benchmarks.local_server import LocalServer
from extender import app as app_module
from extender import wire
from extender.app import create_app, uvicorn_options
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.offload import Busy, Offload
from extender.planning.planner import Planner
from extender.queue import PendingQueue
from extender.store import Store
from packing.state import ClusterState
from tests.extender.test_bind_handshake import Cluster, allocating, pending, stamp
from tests.extender.test_bind_handshake import node as kube_node
from tests.extender.test_extender_app import CATALOG, PREFIX, Served, exclusive, node, pod, strip_kind
from tests.extender.test_extender_hardening import JSON_TREES, binding, cluster, mutated, pod_objects
from tests.extender.test_webhook import container, review
from tests.extender.test_webhook import pod as webhook_pod

NAMES = ["n1", "n2", "n3"]


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


# ---- /mutate: capped, off the loop -------------------------------------------------------------------------


def test_an_over_cap_review_is_413_with_the_reason_and_the_server_stays_healthy() -> None:
    served = Served(cluster(), webhook_max_body_bytes=64 * 1024)
    try:
        big = review(webhook_pod(container("x" * 100_000, "1Gi")))
        r = served.client.post("/mutate", json=big)
        assert r.status_code == 413
        assert "exceeds the webhook's 65536-byte limit" in r.json()["Error"]
        assert "AdmissionReview" in r.json()["Error"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming
            yield b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"x": "'
            for _ in range(100):
                yield b"y" * 1024
            yield b'"}}'
        r = served.client.post("/mutate", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert served.client.get("/healthz").status_code == 200
        assert served.client.get("/readyz").status_code == 200
        r = served.client.post("/mutate", json=review(webhook_pod(container(vram="1Gi"))))
        assert r.status_code == 200 and r.json()["response"]["uid"]
    finally:
        served.close()


def test_the_default_webhook_cap_is_an_update_reviews_two_objects() -> None:
    assert Settings().webhook_max_body_bytes == 2 * 3 * 1024 * 1024  # the API server's 3 MiB request limit, twice


@pytest.fixture
def held() -> Iterator[threading.Event]:
    """An Event the slow stand-ins below wait on; set at the end so no thread is left behind."""
    release = threading.Event()
    yield release
    release.set()


def _slow(release: threading.Event, entered: threading.Event, answer: Any) -> Callable[..., Any]:
    def slow(*_: Any) -> Any:
        entered.set()
        assert release.wait(30)
        return answer
    return slow


def _filter_answers(served: Served) -> None:
    r = served.post("filter", {"Pod": strip_kind(pod("f", 1024)), "Nodes": None, "NodeNames": NAMES})
    assert r.status_code == 200 and r.json()["Error"] == ""


@pytest.mark.parametrize("path", ["/", "/state"])
def test_the_view_and_state_run_off_the_event_loop(monkeypatch: pytest.MonkeyPatch, held: threading.Event,
                                                   path: str) -> None:
    entered = threading.Event()
    monkeypatch.setattr(app_module, "view_pieces", _slow(held, entered, iter(["<p>slow</p>"])))
    monkeypatch.setattr(app_module, "state_pieces", _slow(held, entered, [b"{}"]))
    served = Served(cluster())
    try:
        answers: list[httpx.Response] = []
        reader = threading.Thread(target=lambda: answers.append(served.client.get(path)))
        reader.start()
        assert entered.wait(30)  # the slow read is running...
        _filter_answers(served)  # ...and a verb is answered meanwhile
        assert served.client.get("/healthz").status_code == 200
        held.set()
        reader.join(30)
        assert answers and answers[0].status_code == 200
    finally:
        held.set()
        served.close()


def test_preempt_runs_off_the_event_loop(held: threading.Event) -> None:
    served = Served(cluster())
    entered = threading.Event()
    ext = served.app.state.services.extender
    ext._preempt = _slow(held, entered, wire.preemption_result_json({}))
    try:
        answers: list[httpx.Response] = []
        body = {"Pod": strip_kind(pod("u", 1024)), "NodeNameToMetaVictims": {}}
        caller = threading.Thread(target=lambda: answers.append(served.post("preempt", body)))
        caller.start()
        assert entered.wait(30)
        _filter_answers(served)
        held.set()
        caller.join(30)
        assert answers and answers[0].status_code == 200
    finally:
        held.set()
        served.close()


def test_mutate_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch, held: threading.Event) -> None:
    from extender import webhook

    entered = threading.Event()
    monkeypatch.setattr(webhook, "handle", _slow(held, entered, (200, b"{}")))
    served = Served(cluster())
    try:
        answers: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: answers.append(
            served.client.post("/mutate", json=review(webhook_pod(container(vram="1Gi"))))))
        caller.start()
        assert entered.wait(30)
        _filter_answers(served)
        assert served.client.get("/readyz").status_code == 200
        held.set()
        caller.join(30)
        assert answers and answers[0].status_code == 200
    finally:
        held.set()
        served.close()


def test_a_flood_past_the_slots_is_refused_not_queued(held: threading.Event) -> None:
    import asyncio

    offload = Offload("test", workers=1, waiting=1)
    entered = threading.Event()
    slow = _slow(held, entered, "done")

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(offload.run(slow))
        second = asyncio.ensure_future(offload.run(slow))
        await asyncio.sleep(0)
        with pytest.raises(Busy, match="too many test requests at once"):
            await offload.run(slow)
        held.set()
        return list(await asyncio.gather(first, second))

    assert asyncio.run(scenario()) == ["done", "done"]
    assert offload.refused == 1 and offload.taken == 0
    offload.close()


# ---- preempt: bounded by what the extender knows -----------------------------------------------------------


def test_preemption_args_drop_unknown_nodes_and_victims_before_building_models() -> None:
    victims = {"n1": {"Pods": [{"UID": "a"}, {"UID": "ghost"}, {"uid": "b"}], "NumPDBViolations": 2},
               **{f"fake-{i}": {"Pods": [{"UID": f"x{i}"}]} for i in range(1000)}}
    body = json.dumps({"Pod": {}, "NodeNameToMetaVictims": victims}).encode()
    args = wire.parse_preemption(body, lambda n: n == "n1", lambda n: {"a", "b"})
    assert args.NodeNameToMetaVictims is not None
    assert list(args.NodeNameToMetaVictims) == ["n1"]
    kept = args.NodeNameToMetaVictims["n1"]
    assert kept is not None and [p.UID for p in kept.Pods or []] == ["a", "b"] and kept.NumPDBViolations == 2
    # A malformed entry is still named in a 400, known node or not.
    for bad in ({"n1": {"Pods": [{"UID": 7}]}}, {"fake": {"Pods": "x"}}):
        with pytest.raises(wire.WireError, match="NodeNameToMetaVictims"):
            wire.parse_preemption(json.dumps({"Pod": {}, "NodeNameToMetaVictims": bad}).encode(),
                                  lambda n: n == "n1", lambda n: set())


def test_a_preempt_body_larger_than_the_cluster_can_call_for_is_413() -> None:
    served = Served(cluster())
    try:
        cap = served.app.state.services.preempt_cap()
        assert cap < Settings().max_body_bytes  # sized to this cluster, not the global cap
        names = {f"node-{i:06d}": {"Pods": [{"UID": f"u{i}"}]} for i in range(cap // 30)}
        r = served.post("preempt", {"Pod": strip_kind(pod("u", 1024)), "NodeNameToMetaVictims": names})
        assert r.status_code == 413 and "limit" in r.json()["Error"]
        _filter_answers(served)
    finally:
        served.close()


# ---- the queue's head: the planner and the view ----------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(-2, 2), st.integers(0, 5), st.booleans()),
                max_size=120), st.integers(0, 12))
@settings(max_examples=60, deadline=None)
def test_the_queue_reads_its_head_in_order_whatever_the_changes(ops: list[tuple[int, int, int, bool]],
                                                               limit: int) -> None:
    q = PendingQueue(["vramfit-scheduler"])
    state = ClusterState()
    for i, prio, age, present in ops:
        if present:
            p = pod(f"q{i}", 1024, uid=f"uid-q{i}", priority=prio)
            p["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:0{age}Z"
            p["spec"]["schedulerName"] = "vramfit-scheduler" if i % 7 else "other"
            q.observe(f"default/q{i}", p)
        else:
            q.drop(f"default/q{i}")
    ours = [e for e in q.entries.values() if e.scheduler == "vramfit-scheduler"]
    expected = sorted(ours, key=lambda e: (-e.pod.priority, e.created, e.pod.key))
    assert q.read(state) == expected
    assert q.read(state, limit) == expected[:limit]
    assert q.pending_keys(state, limit) == frozenset(e.pod.key for e in expected[:limit])


@pytest.fixture(scope="module")
def flooded() -> Store:
    """Two small nodes and 100,000 pending pods (anyone can create pods)."""
    store = Store.from_objects([node("n1", exclusive(8)), node("n2", exclusive(8))], CATALOG)
    rng = random.Random(7)
    template = strip_kind(pod("p", 8192))
    with store.lock:
        for i in range(100_000):
            obj = json.loads(json.dumps(template))
            obj["metadata"].update(name=f"p{i}", uid=f"uid-{i}",
                                   creationTimestamp=f"2026-01-{1 + i % 28:02d}T00:00:00Z")
            obj["spec"]["priority"] = rng.randrange(100)
            store.queue.observe(f"default/p{i}", obj)
    return store


def test_a_plan_of_100k_pending_pods_plans_at_most_its_pod_budget(flooded: Store) -> None:
    planner = Planner(flooded, budget_s=0.5, worker="thread", max_pods=50)
    try:
        plan = planner.plan_now()
        assert planner.errors == 0 and plan is not None
        assert plan.queue_size == 50  # the head of the queue, not all of it
        with flooded.lock:
            head = {e.pod.key for e in flooded.queue.read(flooded.state, 50)}
        assert set(plan.assignments) | set(plan.online) <= head
        assert plan.placed >= 16  # the cluster's 16 GPUs took pods of the head
    finally:
        planner.stop()


def test_the_view_of_100k_pending_pods_lists_the_head_and_counts_the_rest(flooded: Store) -> None:
    page = "".join(app_module.view_pieces(flooded))
    assert page.count("<tr class=pending>") == 100
    assert "... and 99900 more" in page


# ---- binds waiting at the gate hold no pool thread -----------------------------------------------------------


WAITING_BINDS = 45  # more than the pool's 40 threads


def _shared_node(name: str, gpus: int, replicas: int) -> dict[str, Any]:
    """A node of time-sliced GPUs: room for more promised binds than the pool has threads (a bind books its
    units before it queues at the gate, so only binds that fit can wait there)."""
    obj = kube_node(name, gpus=gpus)
    described = [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "timeslice", "replicas": replicas}
                 for i in range(gpus)]
    obj["metadata"]["annotations"]["vramfit.io/gpus"] = json.dumps(described)
    return obj


@pytest.fixture
def fake(fake_api: Callable[..., FakeApiServer]) -> FakeApiServer:
    return fake_api(nodes=[_shared_node("n1", gpus=8, replicas=8), kube_node("n2")])


def test_a_bind_to_an_idle_node_goes_while_binds_to_a_blocked_node_wait(fake: FakeApiServer) -> None:
    fake.add_pod(allocating("ahead", "n1", gpu=0, bound_at=stamp()))
    waiting = [fake.add_pod(pending(f"w{i}")) for i in range(WAITING_BINDS)]
    idle = fake.add_pod(pending("idle"))
    cluster = Cluster(fake, wait_s=60.0)
    results: dict[str, str] = {}
    stop = threading.Event()
    try:
        for p in [*waiting, idle]:
            assert cluster.filter(p, ["n1", "n2"]) == ["n1", "n2"]

        def bind(p: dict[str, Any]) -> None:
            with httpx.Client(base_url=cluster.server.url, timeout=120) as client:
                r = client.post(f"{PREFIX}/bind", json=binding(p, "n1"))
                results[p["metadata"]["name"]] = r.json()["Error"] if r.status_code == 200 else r.text

        threads = [threading.Thread(target=bind, args=(p,), daemon=True) for p in waiting]
        for t in threads:
            t.start()
        wait_for(lambda: cluster.gate.queued("n1") == WAITING_BINDS)  # all at n1's gate, none through
        assert cluster.bind(idle, "n2") == ""  # not held up by them
        assert results == {} and cluster.gate.queued("n1") == WAITING_BINDS

        def kubelet() -> None:  # admits whatever is bound to n1, so the queue there drains
            while not stop.is_set():
                for name in ["ahead", *(p["metadata"]["name"] for p in waiting)]:
                    obj = fake.get_pod("default", name)
                    if obj and obj["spec"].get("nodeName") == "n1" and not obj.get("status", {}).get("startTime"):
                        fake.set_pod_status("default", name, startTime=stamp(), phase="Running")
                stop.wait(0.02)
        admitter = threading.Thread(target=kubelet, daemon=True)
        admitter.start()
        for t in threads:
            t.join(120)
        assert len(results) == WAITING_BINDS
        assert all(e == "" for e in results.values()), results  # every share bound, one bind at a time
    finally:
        stop.set()
        cluster.close()


# ---- fuzz: every verb, /mutate and /queue, no 5xx --------------------------------------------------------


@st.composite
def calls(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for j in range(draw(st.integers(1, 5))):
        target = draw(st.sampled_from(["filter", "prioritize", "bind", "preempt", "mutate", "queue"]))
        p = draw(pod_objects(j))
        valid: Any = {
            "filter": {"Pod": p, "Nodes": None, "NodeNames": [*NAMES, "ghost"]},
            "prioritize": {"Pod": p, "Nodes": None, "NodeNames": NAMES},
            "bind": binding(p, draw(st.sampled_from([*NAMES, "ghost"]))),
            "preempt": {"Pod": p, "NodeNameToVictims": None,
                        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-f0"}], "NumPDBViolations": 0},
                                                  "ghost": {"Pods": [{"UID": "x"}]}}},
            "mutate": review(p, operation=draw(st.sampled_from(["CREATE", "UPDATE", "DELETE"]))),
            "queue": draw(st.sampled_from([p, [p], {"kind": "List", "items": [p]}])),
        }[target]
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "tree"]))
        doc = valid if kind == "valid" else draw(mutated(valid)) if kind == "mutated" else draw(JSON_TREES)
        out.append((target, json.dumps(doc).encode()))
    return out


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[tuple[Store, httpx.Client]]:
    store = Store.from_objects(cluster(), CATALOG)
    app = create_app(Settings(url_prefix=PREFIX, planning=False), store, MemoryBinder())
    with LocalServer(app, **uvicorn_options()) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield store, client


def test_fuzz_every_entry_point_answers_without_5xx(fuzz_server: tuple[Store, httpx.Client]) -> None:
    _, client = fuzz_server
    seen: dict[int, int] = {}

    @given(calls())
    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    def run(batch: list[tuple[str, bytes]]) -> None:
        for target, body in batch:
            path = {"mutate": "/mutate", "queue": "/queue"}.get(target, f"{PREFIX}/{target}")
            r = post(client, path, body)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code < 500, (target, body[:300], r.text[:300])
            if target == "mutate" and r.status_code == 200:
                assert r.json()["response"]["allowed"] in (True, False)

    run()
    assert seen.get(200) and seen.get(400)
