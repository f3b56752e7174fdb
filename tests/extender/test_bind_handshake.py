"""The bind handshake with the node side, against the stateful API stand-in and the real app.

The Binding alone carries the assignment (annotations + UID and resourceVersion preconditions), and the bind
gate keeps at most one pod per node allocating and not yet admitted, so the node agent can tell which pod an
Allocate call is for. Waits here are bounded by small settings; nothing asserts how fast anything is."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer, WatchScript
from waiting import wait_for

from benchmarks.local_server import LocalServer
from extender.admission import STALE_REASON, AdmissionGate, Blocker
from extender.app import create_app
from extender.binder import (
    ASSIGNMENT_ANNOTATION,
    BOUND_AT_ANNOTATION,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    BindError,
    KubeBinder,
    MemoryBinder,
)
from extender.config import Settings
from extender.kube import KubeSource
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import Backoff
from packing.catalog import load_catalog
from packing.model import Assignment, GpuGrant

CATALOG = load_catalog()
PREFIX = "/vramfit"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"


def stamp(delta_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int = 2) -> dict[str, Any]:
    described = [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"} for i in range(gpus)]
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"vramfit.io/gpus": json.dumps(described)}},
            "spec": {}, "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                   "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def pending(name: str, vram_mib: int = 8192, uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                         "creationTimestamp": stamp(), "annotations": {}},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "main", "image": "busybox",
                 "resources": {"requests": {"vramfit.io/vram": str(vram_mib)},
                               "limits": {"vramfit.io/vram": str(vram_mib)}}}]},
            "status": {"phase": "Pending"}}


def allocating(name: str, node_name: str, gpu: int, bound_at: str) -> dict[str, Any]:
    """A pod vramfit bound that the kubelet has not admitted (no status.startTime)."""
    pod = pending(name)
    pod["spec"]["nodeName"] = node_name
    pod["metadata"]["annotations"] = {
        ASSIGNMENT_ANNOTATION: json.dumps({"gpus": [{"index": gpu, "mig": None, "vram_mib": 8192}]}),
        PHASE_ANNOTATION: PHASE_ALLOCATING, BOUND_AT_ANNOTATION: bound_at}
    return pod


def fast_backoff() -> Backoff:
    return Backoff(initial_s=0.01, max_s=0.05)


class Cluster:
    """The real app (KubeBinder + bind gate) over loopback, its store fed by list+watch from the fake API."""

    def __init__(self, fake: FakeApiServer, *, wait_s: float = 5.0, stale_s: float = 60.0) -> None:
        self.fake = fake
        self.store = Store(CATALOG)
        self.source = KubeSource(api_client(host=fake.url), self.store, backoff=fast_backoff).start()
        assert self.source.ready.wait(5)
        self.binder = KubeBinder(api_client(host=fake.url))
        self.gate = AdmissionGate(self.store, self.binder, wait_s=wait_s, stale_s=stale_s)
        self.binder.admission = self.gate
        self.app = create_app(Settings(url_prefix=PREFIX, admission_wait_s=wait_s, admission_stale_s=stale_s,
                                       scheduler_http_timeout_s=wait_s + 2),
                              self.store, self.binder, ready=self.source.ready.is_set)
        self.server = LocalServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=30)

    def filter(self, pod: dict[str, Any], names: list[str]) -> list[str]:
        r = self.client.post(f"{PREFIX}/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names})
        assert r.status_code == 200, r.text
        return list(r.json()["NodeNames"])

    def bind(self, pod: dict[str, Any], node_name: str, uid: str | None = None) -> str:
        meta = pod["metadata"]
        r = self.client.post(f"{PREFIX}/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                     "PodUID": uid or meta["uid"], "Node": node_name})
        assert r.status_code == 200, r.text
        return str(r.json()["Error"])

    def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.services.metrics.registry.get_sample_value(name, labels)
        return float(value or 0.0)

    def sees(self, key: str, cond: Callable[[dict[str, Any]], bool]) -> Callable[[], bool]:
        def check() -> bool:
            obj = self.store.pod_object(key)
            return obj is not None and cond(obj)
        return check

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.source.stop()


@pytest.fixture
def fake(fake_api: Callable[..., FakeApiServer]) -> FakeApiServer:
    return fake_api(nodes=[node("n1"), node("n2")])


def bindings(fake: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [r.json() for r in fake.recorded("POST", f"/pods/{name}/binding")]


# ---- the Binding carries the assignment ----------------------------------------------------------------


def test_binding_carries_annotations_uid_and_resource_version(fake: FakeApiServer) -> None:
    p = fake.add_pod(pending("p"))
    cluster = Cluster(fake)
    try:
        assert cluster.filter(p, ["n1"]) == ["n1"]
        seen_rv = cluster.store.resource_version("default/p", "uid-p")
        assert seen_rv == p["metadata"]["resourceVersion"]
        assert cluster.bind(p, "n1") == ""
        (body,) = bindings(fake, "p")
        assert body["metadata"]["uid"] == "uid-p" and body["metadata"]["resourceVersion"] == seen_rv
        annotations = body["metadata"]["annotations"]
        assert json.loads(annotations[ASSIGNMENT_ANNOTATION])["gpus"][0]["vram_mib"] == 8192
        assert annotations[PHASE_ANNOTATION] == PHASE_ALLOCATING
        assert datetime.fromisoformat(annotations[BOUND_AT_ANNOTATION]) <= datetime.now(UTC)
        assert not fake.recorded("PATCH")  # one write: no separate annotation patch
        bound = fake.get_pod("default", "p")
        assert bound is not None and bound["spec"]["nodeName"] == "n1"
        assert annotations.items() <= bound["metadata"]["annotations"].items()
        # The watch brings the bound pod back: held (not reserved), and now the node's allocating pod.
        wait_for(cluster.sees("default/p", lambda o: bool(o["spec"].get("nodeName"))))
        held = cluster.store.state.holder("default/p")
        assert held is not None and not held.reserved
        assert [b.key for b in cluster.gate.blockers("n1", "default/other")] == ["default/p"]
    finally:
        cluster.close()


def test_a_stale_resource_version_is_retried_once_with_the_fresh_one(fake: FakeApiServer) -> None:
    old_rv = fake.add_pod(pending("p"))["metadata"]["resourceVersion"]
    # The scheduler (or anyone) updated the pod after the extender last saw it: same UID, still unbound.
    fresh_rv = fake.set_pod_status("default", "p", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])["metadata"]["resourceVersion"]
    assignment = Assignment("n1", (GpuGrant(index=0, vram_mib=8192),))
    KubeBinder(api_client(host=fake.url), emit_events=False).bind("default", "p", "uid-p", old_rv, assignment)
    assert [b["metadata"]["resourceVersion"] for b in bindings(fake, "p")] == [old_rv, fresh_rv]
    assert len(fake.recorded("GET", "/namespaces/default/pods/p")) == 1
    bound = fake.get_pod("default", "p")
    assert bound is not None and bound["spec"]["nodeName"] == "n1"


def test_a_stale_resource_version_of_a_pod_bound_meanwhile_is_an_error(fake: FakeApiServer) -> None:
    old_rv = fake.add_pod(pending("p"))["metadata"]["resourceVersion"]
    binder = KubeBinder(api_client(host=fake.url), emit_events=False)
    binder.bind("default", "p", "uid-p", "", Assignment("n2", (GpuGrant(index=0, vram_mib=8192),)))
    with pytest.raises(BindError, match='already assigned to node "n2"'):
        binder.bind("default", "p", "uid-p", old_rv, Assignment("n1", (GpuGrant(index=0, vram_mib=8192),)))
    assert len(bindings(fake, "p")) == 2  # no third try


def test_a_recreated_pod_is_a_bind_error_and_nothing_stays_booked(fake: FakeApiServer) -> None:
    first = fake.add_pod(pending("p", uid="uid-first"))
    cluster = Cluster(fake)
    try:
        assert cluster.filter(first, ["n1"]) == ["n1"]
        fake.delete_pod("default", "p")
        fake.add_pod(pending("p", uid="uid-second"))
        wait_for(cluster.sees("default/p", lambda o: o["metadata"]["uid"] == "uid-second"))
        error = cluster.bind(first, "n1")
        # The watched pod under that name has another UID: the bind is refused before any Binding is sent.
        assert "(uid uid-first) is unknown to vramfit" in error
        assert bindings(fake, "p") == []
        assert cluster.store.state.holder("default/p") is None and cluster.store.reservations == {}
        pod = fake.get_pod("default", "p")
        assert pod is not None and not pod["spec"].get("nodeName")
    finally:
        cluster.close()


# ---- one allocating pod per node -----------------------------------------------------------------------


def test_a_burst_to_one_node_waits_for_the_kubelet_to_admit_the_first(fake: FakeApiServer) -> None:
    p1, p2 = fake.add_pod(pending("p1")), fake.add_pod(pending("p2"))
    cluster = Cluster(fake, wait_s=10.0)
    try:
        assert cluster.filter(p1, ["n1"]) == ["n1"] and cluster.filter(p2, ["n1"]) == ["n1"]
        assert cluster.bind(p1, "n1") == ""
        admitted: dict[str, Any] = {}

        def kubelet_admits_p1() -> None:
            time.sleep(0.3)
            admitted.update(fake.set_pod_status("default", "p1", startTime=stamp(), phase="Running"))

        kubelet = threading.Thread(target=kubelet_admits_p1)
        kubelet.start()
        assert cluster.bind(p2, "n1") == ""
        kubelet.join(10)
        # p2's Binding was written after the kubelet admitted p1, never while p1 was still allocating.
        p2_bound = fake.get_pod("default", "p2")
        assert p2_bound is not None and p2_bound["spec"]["nodeName"] == "n1"
        assert int(p2_bound["metadata"]["resourceVersion"]) > int(admitted["metadata"]["resourceVersion"])
        assert cluster.metric("vramfit_bind_waits_total", result="cleared") == 1
        assert cluster.metric("vramfit_bind_wait_seconds_count") == 1
    finally:
        cluster.close()


def test_a_burst_to_one_node_is_refused_at_filter_once_the_binds_promised_fill_it(
        fake_api: Callable[..., FakeApiServer]) -> None:
    """8 pods, 5 GPUs (one pod each): as kube-scheduler goes (filter, then the bind sent, then the next pod's
    filter), the binds queued at the gate count at filter: 5 bound, 3 refused at filter, no bind fails."""
    fake = fake_api(nodes=[node("n1", gpus=5)])
    pods = [fake.add_pod(pending(f"p{k}", vram_mib=70_000)) for k in range(8)]
    cluster = Cluster(fake, wait_s=10.0)
    stop = threading.Event()

    def kubelet() -> None:  # admits each bound pod a while after its Binding (the later filters come meanwhile)
        while not stop.wait(0.3):
            for k in range(8):
                p = fake.get_pod("default", f"p{k}")
                if p is not None and p["spec"].get("nodeName") and not p["status"].get("startTime"):
                    fake.set_pod_status("default", f"p{k}", startTime=stamp(), phase="Running")

    admitting = threading.Thread(target=kubelet, daemon=True)
    admitting.start()
    results: dict[str, str] = {}
    binds: list[threading.Thread] = []
    refused: dict[str, str] = {}
    try:
        for p in pods:
            name = p["metadata"]["name"]
            r = cluster.client.post(f"{PREFIX}/filter", json={"Pod": p, "Nodes": None, "NodeNames": ["n1"]})
            body = r.json()
            if not body["NodeNames"]:
                refused[name] = {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}["n1"]
                continue
            t = threading.Thread(target=lambda p=p, name=name: results.update({name: cluster.bind(p, "n1")}))
            t.start()
            binds.append(t)
            # kube-scheduler sends the bind before the next pod's filter: wait until every bind sent reached the
            # extender (answered, or queued at the node's gate).
            wait_for(lambda: cluster.gate.queued("n1") >= sum(t.is_alive() for t in binds))
        for t in binds:
            t.join(30)
        assert results == {f"p{k}": "" for k in range(5)}
        assert sorted(refused) == ["p5", "p6", "p7"]
        assert all("held by default/p" in why for why in refused.values()), refused
        assert cluster.metric("vramfit_binds_total", result="no_fit") == 0
        assert cluster.metric("vramfit_binds_total", result="bound") == 5
    finally:
        stop.set()
        admitting.join(5)
        cluster.close()


def test_a_stale_blocker_gets_an_event_and_the_bind_proceeds(fake: FakeApiServer) -> None:
    fake.add_pod(allocating("stuck", "n1", gpu=0, bound_at=stamp(-3600)))
    p = fake.add_pod(pending("p"))
    cluster = Cluster(fake, wait_s=10.0, stale_s=60.0)
    try:
        assert [b.key for b in cluster.gate.blockers("n1", "default/p")] == ["default/stuck"]
        assert cluster.filter(p, ["n1"]) == ["n1"]
        assert cluster.bind(p, "n1") == ""
        (event,) = [e for e in fake.events_posted() if e["reason"] == STALE_REASON]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "stuck" and event["involvedObject"]["uid"] == "uid-stuck"
        assert "no longer held" in event["message"]
        assert cluster.metric("vramfit_allocation_stale_releases_total") == 1
        # Released for good: it no longer counts ahead of anyone on n1.
        assert "default/stuck" not in [b.key for b in cluster.gate.blockers("n1", "default/next")]
    finally:
        cluster.close()


def test_a_young_blocker_past_the_wait_fails_the_bind_and_books_nothing(fake: FakeApiServer) -> None:
    fake.add_pod(allocating("ahead", "n1", gpu=0, bound_at=stamp()))
    p = fake.add_pod(pending("p"))
    cluster = Cluster(fake, wait_s=0.3, stale_s=60.0)
    try:
        assert cluster.filter(p, ["n1"]) == ["n1"]
        error = cluster.bind(p, "n1")
        assert error.startswith("node n1 is admitting pod default/ahead; retry")
        assert cluster.store.state.holder("default/p") is None and cluster.store.reservations == {}
        assert not bindings(fake, "p") and not fake.events_posted()
        assert cluster.metric("vramfit_bind_waits_total", result="busy") == 1
        assert cluster.metric("vramfit_binds_total", result="node_busy") == 1
        # Once the kubelet admits the pod ahead, the scheduler's retry binds.
        fake.set_pod_status("default", "ahead", startTime=stamp(), phase="Running")
        wait_for(cluster.sees("default/ahead", lambda o: bool(o["status"].get("startTime"))))
        assert cluster.bind(p, "n1") == ""
    finally:
        cluster.close()


def test_binds_to_different_nodes_do_not_wait_on_each_other(fake: FakeApiServer) -> None:
    fake.add_pod(allocating("ahead", "n1", gpu=0, bound_at=stamp()))
    p1, p2 = fake.add_pod(pending("p1")), fake.add_pod(pending("p2"))
    cluster = Cluster(fake, wait_s=20.0)
    try:
        assert cluster.filter(p1, ["n1"]) == ["n1"] and cluster.filter(p2, ["n2"]) == ["n2"]
        result: dict[str, str] = {}
        waiting = threading.Thread(target=lambda: result.update(p1=cluster.bind(p1, "n1")))
        waiting.start()
        wait_for(lambda: cluster.gate.queued("n1") == 1)  # waiting at the gate (on the event loop)
        assert cluster.bind(p2, "n2") == ""
        assert waiting.is_alive() and "p1" not in result  # n1's wait did not hold up n2
        fake.set_pod_status("default", "ahead", startTime=stamp(), phase="Running")
        waiting.join(20)
        assert result == {"p1": ""}
        assert cluster.metric("vramfit_bind_waits_total", result="cleared") == 1
    finally:
        cluster.close()


def test_a_bind_the_watch_has_not_shown_yet_still_blocks_the_node(fake: FakeApiServer) -> None:
    p1, p2 = fake.add_pod(pending("p1")), fake.add_pod(pending("p2"))
    fake.watch_scripts["pods"] = [WatchScript(events=[], hold_s=30)]  # the pod watch delivers nothing
    cluster = Cluster(fake, wait_s=0.3)
    try:
        assert cluster.filter(p1, ["n1"]) == ["n1"] and cluster.filter(p2, ["n1"]) == ["n1"]
        assert cluster.bind(p1, "n1") == ""
        lagging = cluster.store.pod_object("default/p1")
        assert lagging is not None and not lagging["spec"].get("nodeName")  # the store has not seen the bind
        assert [b.key for b in cluster.gate.blockers("n1", "default/p2")] == ["default/p1"]
        assert cluster.bind(p2, "n1").startswith("node n1 is admitting pod default/p1; retry")
    finally:
        cluster.close()


def test_snapshot_mode_never_waits() -> None:
    objs = [{"kind": "Node", **node("n1")}, {"kind": "Pod", **allocating("ahead", "n1", gpu=0, bound_at=stamp())}]
    store = Store.from_objects(objs, CATALOG)
    binder = MemoryBinder()
    app = create_app(Settings(url_prefix=PREFIX, admission_wait_s=30, scheduler_http_timeout_s=32), store, binder)
    p = pending("p")
    with LocalServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        client.post(f"{PREFIX}/filter", json={"Pod": p, "Nodes": None, "NodeNames": ["n1"]})
        r = client.post(f"{PREFIX}/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p",
                                                "Node": "n1"})
        assert r.json() == {"Error": ""}
    assert "uid-p" in binder.bound
    assert app.state.services.metrics.registry.get_sample_value("vramfit_bind_wait_seconds_count") == 0


def test_a_restarted_extender_sees_the_allocating_pod_as_a_blocker(fake: FakeApiServer) -> None:
    p1, p2 = fake.add_pod(pending("p1")), fake.add_pod(pending("p2"))
    cluster = Cluster(fake)
    try:
        assert cluster.filter(p1, ["n1"]) == ["n1"]
        assert cluster.bind(p1, "n1") == ""
    finally:
        cluster.close()
    again = Cluster(fake, wait_s=0.3)  # a fresh process: its store comes from the API only
    try:
        blockers = again.gate.blockers("n1", "default/p2")
        assert [(b.key, b.uid) for b in blockers] == [("default/p1", "uid-p1")]
        assert isinstance(blockers[0], Blocker) and blockers[0].bound_at is not None
        assert again.filter(p2, ["n1"]) == ["n1"]
        assert again.bind(p2, "n1").startswith("node n1 is admitting pod default/p1; retry")
        assert again.store.reservations == {}
    finally:
        again.close()


# ---- the API stand-in itself -----------------------------------------------------------------------------


def watch_lines(fake: FakeApiServer, path: str, **params: str) -> list[dict[str, Any]]:
    """One watch request to its end (timeoutSeconds), as parsed events."""
    query = {"watch": "true", "timeoutSeconds": "1", **params}
    with httpx.stream("GET", f"{fake.url}{path}", params=query, timeout=10) as r:
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


def test_fake_watch_by_node_sees_a_bind_as_added_and_keeps_streaming(fake: FakeApiServer) -> None:
    fake.add_pod(pending("p"))
    mark = fake.list_objects("pods", parse_selector("spec.nodeName=n1"))["metadata"]["resourceVersion"]
    assert fake.list_objects("pods", parse_selector("spec.nodeName=n1"))["items"] == []
    binder = KubeBinder(api_client(host=fake.url), emit_events=False)

    def bind_soon() -> None:
        time.sleep(0.2)  # after the watch is open: delivered live, not from the log
        binder.bind("default", "p", "uid-p", "", Assignment("n1", (GpuGrant(index=0, vram_mib=8192),)))

    threading.Thread(target=bind_soon).start()
    events = watch_lines(fake, "/api/v1/pods", resourceVersion=mark, fieldSelector="spec.nodeName=n1",
                         allowWatchBookmarks="true")
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "p"
    assert events[1]["object"]["metadata"]["resourceVersion"] == str(fake.resource_version)
    # Leaving the selection (deleted) is a DELETED for that watcher.
    fake.delete_pod("default", "p")
    later = watch_lines(fake, "/api/v1/pods", resourceVersion=events[0]["object"]["metadata"]["resourceVersion"],
                        fieldSelector="spec.nodeName=n1")
    assert [e["type"] for e in later] == ["DELETED"]


def test_fake_watch_from_a_compacted_version_is_expired(fake: FakeApiServer) -> None:
    old = str(fake.resource_version)
    fake.add_pod(pending("p"))
    fake.compact()
    (event,) = watch_lines(fake, "/api/v1/pods", resourceVersion=old)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
    assert event["object"]["message"] == f"too old resource version: {old} ({fake.resource_version})"


def test_fake_single_objects_and_node_patches(fake: FakeApiServer) -> None:
    fake.add_pod(pending("p"))
    with httpx.Client(base_url=fake.url, timeout=10) as c:
        assert c.get("/api/v1/namespaces/default/pods/p").json()["metadata"]["uid"] == "uid-p"
        missing = c.get("/api/v1/namespaces/default/pods/nope")
        assert missing.status_code == 404 and missing.json()["message"] == 'pods "nope" not found'
        assert c.get("/api/v1/nodes/n1").json()["metadata"]["name"] == "n1"
        patch = {"metadata": {"annotations": {"vramfit.io/node-health": "{}"}}}
        for content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            r = c.patch("/api/v1/nodes/n1", content=json.dumps(patch), headers={"Content-Type": content_type})
            assert r.status_code == 200 and r.json()["metadata"]["annotations"]["vramfit.io/node-health"] == "{}"
        refused = c.patch("/api/v1/nodes/n1", content=json.dumps(patch), headers={"Content-Type": "text/plain"})
        assert refused.status_code == 415 and refused.json()["reason"] == "UnsupportedMediaType"
        listed = c.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName="}).json()["items"]
        assert [o["metadata"]["name"] for o in listed] == ["p"]
        bad = c.get("/api/v1/pods", params={"fieldSelector": "spec.gpu=1"})
        assert bad.status_code == 400 and "field label not supported" in bad.json()["message"]


def parse_selector(text: str) -> Any:
    from fakes.apiserver import parse_field_selector

    return parse_field_selector("pods", text, None)


# ---- a Binding whose answer is lost: applied or not, the units are never offered twice ---------------------
class _DropAnswer(Exception):
    """Raised inside the stand-in's handler: the connection closes with no answer written."""


def _lose_answer(fake: FakeApiServer, *, apply: bool) -> None:
    def hook(rec: Any) -> None:
        if apply:
            parts = rec.path.strip("/").split("/")
            fake.bind(parts[3], parts[5], json.loads(rec.body))
        raise _DropAnswer()

    fake.on_binding = hook


@pytest.mark.parametrize("applied", [True, False])
def test_a_lost_binding_answer_is_settled_by_reading_the_pod(fake: FakeApiServer, applied: bool) -> None:
    c = Cluster(fake)
    try:
        p = fake.add_pod(pending("lost"))
        wait_for(c.sees("default/lost", lambda o: True))
        assert c.filter(p, ["n1"]) == ["n1"]
        _lose_answer(fake, apply=applied)
        error = c.bind(p, "n1")
        fake.on_binding = None
        holder = c.store.state.holder("default/lost")
        if applied:
            # The Binding landed: the bind succeeded, and the units stay held by this pod.
            assert error == "" and holder is not None
            assert fake.get_pod("default", "lost")["spec"]["nodeName"] == "n1"  # type: ignore[index]
        else:
            # It did not: a plain bind error, nothing stays booked.
            assert "RemoteDisconnected" in error or "Connection aborted" in error, error
            assert holder is None
    finally:
        c.close()


def test_a_lost_answer_that_cannot_be_checked_keeps_the_units_booked(fake: FakeApiServer) -> None:
    c = Cluster(fake)
    try:
        p = fake.add_pod(pending("unknown"))
        wait_for(c.sees("default/unknown", lambda o: True))
        assert c.filter(p, ["n1"]) == ["n1"]
        _lose_answer(fake, apply=True)

        def unreadable(namespace: str, name: str) -> dict[str, Any] | None:
            raise ConnectionError("API unreachable")

        c.binder.read_pod = unreadable  # type: ignore[method-assign]
        error = c.bind(p, "n1")
        assert "re-reading the pod failed" in error
        held = c.store.state.holder("default/unknown")
        assert held is not None  # still booked: it may be bound, so its units go to no one else
        # ... and the watch shows it bound: the booking becomes a plain holding.
        wait_for(lambda: (h := c.store.state.holder("default/unknown")) is not None and not h.reserved)
    finally:
        fake.on_binding = None
        c.close()
