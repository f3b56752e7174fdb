"""List+watch and the binder against a loopback server that speaks the API's paths with recorded JSON.

No kube-apiserver can run here; `fakes.apiserver` serves the real wire format (lists, chunked watch
streams, Status errors, Binding preconditions) and records what the official client sends."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer, WatchScript, status
from solver_fixtures import gpu_usage
from waiting import wait_for

from benchmarks.local_server import LocalServer
from extender.app import create_app
from extender.binder import (
    ASSIGNMENT_ANNOTATION,
    BOUND_AT_ANNOTATION,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    BindError,
    KubeBinder,
)
from extender.config import Settings
from extender.kube import KubeSource
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import Backoff
from packing.catalog import load_catalog
from packing.model import Assignment, GpuGrant

FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"
CATALOG = load_catalog()


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def fake(fake_api: Callable[..., FakeApiServer]) -> FakeApiServer:
    # The default namespace lets its pods name tenant team-search (the pending fixture's label).
    return fake_api(nodes=[fixture("node-h100-mixed.json"), fixture("node-a100-gfd.json")],
                    pods=[fixture("pod-bound-assigned.json"), fixture("pod-pending-7b.json")],
                    namespaces=[fixture("namespace-default.json")])


def watch_requests(fake: FakeApiServer, path: str) -> list[dict[str, list[str]]]:
    return [r.query for r in fake.recorded("GET", path) if r.query.get("watch") == ["true"]]


def list_requests(fake: FakeApiServer, path: str) -> int:
    return sum(1 for r in fake.recorded("GET", path) if "watch" not in r.query)


def test_list_then_watch_with_break_410_and_bookmarks(fake: FakeApiServer,
                                                      fast_backoff: Callable[[], Backoff]) -> None:
    cpu_node = fixture("node-cpu-only.json")
    cpu_node["metadata"]["resourceVersion"] = "1001"
    trainer_gone = fixture("pod-bound-assigned.json")
    trainer_gone["metadata"]["resourceVersion"] = "1006"
    fake.watch_scripts["nodes"] = [
        # stream breaks after one event: reconnect from resourceVersion 1001, no relist
        WatchScript(events=[{"type": "ADDED", "object": cpu_node}], break_midway=True),
        # the resourceVersion is then too old: an ERROR event with a 410 Status -> relist
        WatchScript(events=[{"type": "ERROR", "object": status(410, "Expired", "too old resource version")}]),
        # and once more as an HTTP 410 on the watch request itself -> relist again
        WatchScript(events=[], http_status=410),
    ]
    fake.watch_scripts["pods"] = [
        WatchScript(events=[
            {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "1005"}}},
            {"type": "DELETED", "object": trainer_gone},
        ]),
    ]
    store = Store(CATALOG)
    source = KubeSource(api_client(host=fake.url), store, watch_timeout_s=5, backoff=fast_backoff).start()
    try:
        assert source.ready.wait(5)
        assert store.ready
        wait_for(lambda: list_requests(fake, "/api/v1/nodes") >= 3)
        wait_for(lambda: len(watch_requests(fake, "/api/v1/nodes")) >= 4)
        wait_for(lambda: len(watch_requests(fake, "/api/v1/pods")) >= 2)
        node_watches = watch_requests(fake, "/api/v1/nodes")
        assert node_watches[0]["resourceVersion"] == ["1000"]  # from the list
        assert node_watches[1]["resourceVersion"] == ["1001"]  # resumed after the break, not relisted
        assert node_watches[0]["allowWatchBookmarks"] == ["true"]
        refl = source.reflectors["nodes"]
        wait_for(lambda: refl.lists >= 3)
        # The relists replaced the view: the node that only came from the (expired) watch is gone again.
        wait_for(lambda: store.state.node_names == ["gpu-h100-a", "gpu-a100-b"])
        pod_watches = watch_requests(fake, "/api/v1/pods")
        assert pod_watches[1]["resourceVersion"] == ["1006"]  # bookmark, then the delete, advanced it
        assert source.reflectors["pods"].lists == 1
        wait_for(lambda: store.state.holder("research/trainer-0") is None)
    finally:
        source.stop()


def test_readiness_waits_for_both_lists(fast_backoff: Callable[[], Backoff]) -> None:
    fake = FakeApiServer(nodes=[fixture("node-a100-gfd.json")])
    fake.watch_scripts["pods"] = []
    with fake:
        store = Store(CATALOG)
        app = create_app(Settings(), store, KubeBinder(api_client(host=fake.url)))
        with LocalServer(app) as server:
            assert httpx.get(f"{server.url}/readyz").status_code == 503
            source = KubeSource(api_client(host=fake.url), store, backoff=fast_backoff).start()
            try:
                assert source.ready.wait(5)
                assert httpx.get(f"{server.url}/readyz").status_code == 200
            finally:
                source.stop()


def test_unreachable_api_backs_off_and_recovers(fast_backoff: Callable[[], Backoff]) -> None:
    fake = FakeApiServer(nodes=[fixture("node-a100-gfd.json")])
    calls = {"n": 0}
    real_list = None

    store = Store(CATALOG)
    with fake:
        api = api_client(host=fake.url)
        source = KubeSource(api, store, backoff=fast_backoff)
        refl = source.reflectors["nodes"]
        real_list = refl._list

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] <= 2:
                raise ConnectionRefusedError("connection refused")
            return real_list(*args, **kwargs)

        refl._list = flaky
        source.start()
        try:
            assert source.ready.wait(5)
            assert refl.errors == 2
            assert store.state.node_names == ["gpu-a100-b"]
        finally:
            source.stop()


# ---- binder ----------------------------------------------------------------------------------------

ASSIGN = Assignment("gpu-h100-a", (GpuGrant(index=1, vram_mib=14336, mig="2g.20gb@2"),))
UID = "a3c1e8f0-7d2b-4c59-9e14-2b6f0d8a7c31"


def test_binder_sends_one_binding_with_the_assignment_then_an_event(fake: FakeApiServer) -> None:
    rv = fake.get_pod("default", "llm-7b-inference")["metadata"]["resourceVersion"]
    KubeBinder(api_client(host=fake.url)).bind("default", "llm-7b-inference", UID, rv, ASSIGN)
    writes = [r for r in fake.requests if r.method in ("PATCH", "POST")]
    assert [(r.method, r.path) for r in writes] == [
        ("POST", "/api/v1/namespaces/default/pods/llm-7b-inference/binding"),
        ("POST", "/api/v1/namespaces/default/events"),
    ]
    binding, event = writes
    assert binding.headers["content-type"] == "application/json"
    body = binding.json()
    annotations = body["metadata"].pop("annotations")
    assert body == {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "llm-7b-inference", "uid": UID, "resourceVersion": rv},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-h100-a"}}
    assert annotations[ASSIGNMENT_ANNOTATION] == '{"gpus":[{"index":1,"mig":"2g.20gb@2","vram_mib":14336}]}'
    assert annotations[PHASE_ANNOTATION] == PHASE_ALLOCATING
    assert annotations[BOUND_AT_ANNOTATION].endswith("Z")
    assert event.headers["content-type"] == "application/json"
    ev = event.json()
    assert ev["involvedObject"]["uid"] == UID and ev["reason"] == "VramfitAssigned"
    # The API server wrote node, annotations and the PodScheduled condition in one update.
    pod = fake.get_pod("default", "llm-7b-inference")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-h100-a"
    assert json.loads(pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION])["gpus"][0]["mig"] == "2g.20gb@2"
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]  # merged, not replaced
    assert {"type": "PodScheduled", "status": "True"}.items() <= pod["status"]["conditions"][0].items()
    assert int(pod["metadata"]["resourceVersion"]) > int(rv)


def test_binder_uid_precondition_protects_recreated_pod(fake: FakeApiServer) -> None:
    with pytest.raises(BindError, match="Precondition failed: UID in precondition: some-older-uid"):
        KubeBinder(api_client(host=fake.url)).bind("default", "llm-7b-inference", "some-older-uid", "", ASSIGN)
    pod = fake.get_pod("default", "llm-7b-inference")
    assert pod is not None and not pod["spec"].get("nodeName")
    assert ASSIGNMENT_ANNOTATION not in pod["metadata"]["annotations"]  # nothing of it was written


def test_binder_reports_binding_conflict(fake: FakeApiServer) -> None:
    with pytest.raises(BindError, match="already assigned"):
        KubeBinder(api_client(host=fake.url)).bind("research", "trainer-0", "5e2d7c9b-3a18-4f06-b2e7-9c1d0a8f6e42",
                                                    "", ASSIGN)


def test_event_failure_does_not_fail_bind(fake: FakeApiServer) -> None:
    fake.stop()  # events go nowhere; the bind itself must already have failed then, so use a hook instead
    server = FakeApiServer(pods=[fixture("pod-pending-7b.json")])
    with server:
        binder = KubeBinder(api_client(host=server.url))
        original = binder.core.create_namespaced_event

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("events endpoint down")

        binder.core.create_namespaced_event = broken  # type: ignore[method-assign]
        binder.bind("default", "llm-7b-inference", UID, "", ASSIGN)
        binder.core.create_namespaced_event = original  # type: ignore[method-assign]
        assert server.recorded("POST", "/binding")


# ---- the whole path: scheduler -> extender -> API, then a restart from the API ------------------------


def test_bind_through_app_writes_api_and_restart_rebuilds_same_state(fake: FakeApiServer,
                                                                     fast_backoff: Callable[[], Backoff]) -> None:
    store = Store(CATALOG)
    source = KubeSource(api_client(host=fake.url), store, backoff=fast_backoff).start()
    try:
        assert source.ready.wait(5)
        app = create_app(Settings(url_prefix="/vramfit"), store, KubeBinder(api_client(host=fake.url)),
                         ready=source.ready.is_set)
        with LocalServer(app) as server, httpx.Client(base_url=server.url) as client:
            pending = fixture("pod-pending-7b.json")
            args = {"Pod": pending, "Nodes": None, "NodeNames": ["gpu-h100-a", "gpu-a100-b"]}
            filtered = client.post("/vramfit/filter", json=args).json()
            assert filtered["Error"] == "" and filtered["NodeNames"]
            node = filtered["NodeNames"][0]
            bound = client.post("/vramfit/bind", json={"PodName": "llm-7b-inference", "PodNamespace": "default",
                                                       "PodUID": UID, "Node": node})
            assert bound.status_code == 200 and bound.json() == {"Error": ""}
            writes = [(r.method, r.path.rsplit("/", 1)[-1]) for r in fake.requests if r.method != "GET"]
            assert writes[:2] == [("POST", "binding"), ("POST", "events")]
            before = sorted((h.pod.key, h.assignment, h.reserved) for h in store.state.holders())
            assert ("default/llm-7b-inference", store.state.holder("default/llm-7b-inference").assignment,
                    False) in before
    finally:
        source.stop()
    # Restart: a fresh process lists the API; everything placed is still placed, on the same units.
    fresh = Store(CATALOG)
    again = KubeSource(api_client(host=fake.url), fresh, backoff=fast_backoff).start()
    try:
        assert again.ready.wait(5)
        after = sorted((h.pod.key, h.assignment, h.reserved) for h in fresh.state.holders())
        assert after == before
    finally:
        again.stop()


def test_watch_confirms_and_releases_reservations(fake: FakeApiServer) -> None:
    store = Store(CATALOG)
    store.replace("namespaces", copy.deepcopy(fake.namespaces))
    store.replace("nodes", copy.deepcopy(fake.nodes))
    store.replace("pods", copy.deepcopy(fake.pods))
    from packing.k8s.demand import pod_demand
    from packing.policies import get_policy

    pod = pod_demand(fixture("pod-pending-7b.json"), store.tenancy)
    assert pod is not None
    assignment = store.reserve(pod, "gpu-a100-b", get_policy("best-fit"))
    assert store.state.holder(pod.key).reserved
    # The pod shows up bound to another node (someone else bound it): our reservation is void.
    elsewhere = fixture("pod-pending-7b.json")
    elsewhere["spec"]["nodeName"] = "gpu-h100-a"
    elsewhere["status"]["phase"] = "Running"
    store.apply("pods", "MODIFIED", elsewhere)
    held = store.state.holder(pod.key)
    assert held is not None and held.assignment.node == "gpu-h100-a" and not held.reserved
    assert UID not in store.reservations
    assert gpu_usage(store.state, "gpu-a100-b", assignment.gpus[0].index).pods == 0
    # Deleted: everything it held is free again.
    store.apply("pods", "DELETED", elsewhere)
    assert store.state.holder(pod.key) is None


def test_heartbeats_and_container_status_do_not_churn_the_view() -> None:
    store = Store(CATALOG)
    node_obj = fixture("node-h100-mixed.json")
    bound = fixture("pod-bound-assigned.json")
    store.replace("nodes", [node_obj])
    store.replace("pods", [bound])
    gen = store.generation
    beat = copy.deepcopy(node_obj)
    beat["status"]["conditions"][1]["lastHeartbeatTime"] = "2026-05-04T10:06:07Z"
    beat["metadata"]["resourceVersion"] = "48999"
    store.apply("nodes", "MODIFIED", beat)
    running = copy.deepcopy(bound)
    running["status"]["containerStatuses"][0]["restartCount"] = 1
    store.apply("pods", "MODIFIED", running)
    assert store.generation == gen  # caches keyed by generation stay valid
    relabelled = copy.deepcopy(beat)
    relabelled["metadata"]["annotations"]["vramfit.io/gpus"] = json.dumps(
        [{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
          "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}])
    store.apply("nodes", "MODIFIED", relabelled)
    assert store.generation > gen
    assert len(store.state.node("gpu-h100-a").gpus) == 1
    assert store.state.holder("research/trainer-0") is not None  # still fits its MIG instance
    finished = copy.deepcopy(running)
    finished["status"]["phase"] = "Succeeded"
    store.apply("pods", "MODIFIED", finished)
    assert store.state.holder("research/trainer-0") is None
