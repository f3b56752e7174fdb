"""The extender over real HTTP: uvicorn on 127.0.0.1 (ephemeral port) in a background thread, payloads in
kube-scheduler's exact wire format, concurrency, bad input, preemption, restart, TLS."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from serve_process import wait_ready

from benchmarks.local_server import LocalServer
from extender.app import create_app
from extender.binder import BindError, MemoryBinder
from extender.cli import build_serve_parser
from extender.config import Settings
from extender.metrics import exposition
from extender.store import Store
from kubeio.files import read_yaml_documents
from packing.catalog import load_catalog
from packing.model import Assignment
from packing.state import ClusterState

FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"
MIB = 2**20
CATALOG = load_catalog()
PREFIX = "/vramfit"


def fixture(name: str, kind: str | None = None) -> dict[str, Any]:
    obj = json.loads((FIXTURES / name).read_text())
    if kind:
        obj["kind"] = kind  # snapshot files (kubectl get -o json) carry kind; informer objects do not
    return obj


def node(name: str, gpus: list[dict[str, Any]], cpu: str = "64") -> dict[str, Any]:
    """A Node as the API server emits it, GPUs described by the vramfit.io/gpus annotation, served by the node
    agent (vramfit.io/gpu in status.allocatable)."""
    return {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                                         "labels": {"kubernetes.io/hostname": name},
                                         "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "spec": {}, "status": {"capacity": {"cpu": cpu, "memory": "512Gi", "pods": "110", "vramfit.io/gpu": "8"},
                                   "allocatable": {"cpu": cpu, "memory": "512Gi", "pods": "110",
                                                   "vramfit.io/gpu": "8"},  # the node agent runs there
                                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}


def exclusive(n: int, product: str = "NVIDIA-A100-SXM4-80GB") -> list[dict[str, Any]]:
    return [{"index": i, "product": product, "mode": "exclusive"} for i in range(n)]


def pod(name: str, vram_mib: int, *, uid: str | None = None, tenant: str | None = None, ns: str = "default",
        annotations: dict[str, str] | None = None, node_name: str | None = None,
        assignment: dict[str, Any] | None = None, priority: int = 0, gpus: int = 1) -> dict[str, Any]:
    ann = dict(annotations or {})
    if gpus != 1:
        ann["vramfit.io/gpus"] = str(gpus)
    if assignment is not None:
        ann["vramfit.io/assignment"] = json.dumps(assignment)
    labels = {"vramfit.io/tenant": tenant} if tenant else {}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"vramfit.io/vram": str(vram_mib)},
                                      "limits": {"vramfit.io/vram": str(vram_mib)}}}],
        "schedulerName": "vramfit-scheduler", "priority": priority}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}", "labels": labels,
                         "annotations": ann, "resourceVersion": "7"},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def strip_kind(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


class Served:
    def __init__(self, objs: list[dict[str, Any]], binder: Any = None, **settings: Any) -> None:
        self.store = Store.from_objects(objs, CATALOG, relax_tenancy=settings.pop("relax_tenancy", False),
                                        reservation_ttl_s=settings.pop("reservation_ttl_s", 120.0))
        self.binder = binder or MemoryBinder()
        self.app = create_app(Settings(url_prefix=PREFIX, **settings), self.store, self.binder)
        self.server = LocalServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)

    def post(self, verb: str, body: Any) -> httpx.Response:
        if isinstance(body, bytes):
            return self.client.post(f"{PREFIX}/{verb}", content=body, headers={"Content-Type": "application/json"})
        return self.client.post(f"{PREFIX}/{verb}", json=body)

    def filter(self, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
        r = self.post("filter", {"Pod": strip_kind(p), "Nodes": None, "NodeNames": names})
        assert r.status_code == 200, r.text
        return r.json()

    def bind(self, p: dict[str, Any], node_name: str) -> dict[str, Any]:
        meta = p["metadata"]
        r = self.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                               "Node": node_name})
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture
def fixture_cluster() -> Iterator[Served]:
    # The default namespace lets its pods name tenant team-search (the fixtures' pending pod does).
    served = Served([fixture("node-h100-mixed.json", "Node"), fixture("node-a100-gfd.json", "Node"),
                     fixture("node-cpu-only.json", "Node"), fixture("pod-bound-assigned.json", "Pod"),
                     fixture("namespace-default.json")])
    yield served
    served.close()


# ---- filter / prioritize in the exact wire format ----------------------------------------------------


def test_filter_exact_payload_over_a_real_socket(fixture_cluster: Served) -> None:
    body = (FIXTURES / "filter-args-nodenames.json").read_bytes()
    r = fixture_cluster.post("filter", body)
    assert re.fullmatch(r"vramfit;dur=\d+\.\d{3}", r.headers["server-timing"])  # the extender's own time
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    out = r.json()
    assert list(out) == ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
    assert out["Nodes"] is None and out["Error"] == ""
    assert out["NodeNames"] == ["gpu-h100-a", "gpu-a100-b"]  # a subset of the input, in input order
    assert out["FailedNodes"] == {}
    assert set(out["FailedAndUnresolvableNodes"]) == {"cpu-only-1", "gpu-gone-7"}
    assert "no GPUs" in out["FailedAndUnresolvableNodes"]["cpu-only-1"]
    assert "not known" in out["FailedAndUnresolvableNodes"]["gpu-gone-7"]


def test_filter_with_full_nodes_answers_nodes(fixture_cluster: Served) -> None:
    items = [strip_kind(fixture("node-h100-mixed.json")), strip_kind(fixture("node-cpu-only.json"))]
    p = strip_kind(fixture("pod-pending-7b.json"))
    r = fixture_cluster.post("filter", {"Pod": p, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
    out = r.json()
    assert out["NodeNames"] is None
    assert out["Nodes"] == {"metadata": {}, "items": [items[0]]}  # the scheduler's own objects, untouched
    assert list(out["FailedAndUnresolvableNodes"]) == ["cpu-only-1"]


def test_lower_cased_keys_are_accepted(fixture_cluster: Served) -> None:
    p = strip_kind(fixture("pod-pending-7b.json"))
    out = fixture_cluster.post("filter", {"pod": p, "nodes": None, "nodenames": ["gpu-h100-a"]}).json()
    assert out["NodeNames"] == ["gpu-h100-a"]
    prio = fixture_cluster.post("prioritize", {"POD": p, "NODENAMES": ["gpu-h100-a"]})
    assert prio.json() == [{"Host": "gpu-h100-a", "Score": 10}]


def test_prioritize_answers_bare_array_of_int_scores(fixture_cluster: Served) -> None:
    body = (FIXTURES / "filter-args-nodenames.json").read_bytes()
    r = fixture_cluster.post("prioritize", body)
    assert r.status_code == 200
    assert r.text.startswith("[")
    scores = r.json()
    assert [s["Host"] for s in scores] == ["gpu-h100-a", "gpu-a100-b", "cpu-only-1", "gpu-gone-7"]
    assert all(isinstance(s["Score"], int) and 0 <= s["Score"] <= 10 for s in scores)
    assert not re.search(r'"Score":\s*-?\d+\.\d', r.text)  # never a float
    assert max(s["Score"] for s in scores) == 10
    assert scores[2]["Score"] == 0 and scores[3]["Score"] == 0  # cannot fit / unknown


def test_prioritize_prefers_the_policys_node() -> None:
    # best-fit: the 20 GiB MIG instance is a far tighter home for 14 GiB than a whole 80 GiB GPU.
    h100 = node("h100", [{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
                          "mig": [{"profile": "2g.20gb", "start": 0}]}])
    a100 = node("a100", exclusive(1))
    served = Served([h100, a100], policy="best-fit")
    try:
        p = pod("p", 14336)
        scores = served.post("prioritize", {"Pod": strip_kind(p), "NodeNames": ["a100", "h100"]}).json()
        assert scores == [{"Host": "a100", "Score": 0}, {"Host": "h100", "Score": 10}]
    finally:
        served.close()


def test_prioritize_follows_node_set_changes_and_filter_survivors() -> None:
    """Prioritize answers from cached per-node fragments and filter's survivors: they must follow the node
    set (rows move when a node leaves) and never mix up hosts."""
    served = Served([node("a", exclusive(1)), node("b", exclusive(2)), node("c", exclusive(1))], policy="best-fit")
    try:
        p = pod("p", 8192)
        passed = served.filter(p, ["a", "b", "c", "zz"])["NodeNames"]
        assert passed == ["a", "b", "c"]
        first = served.post("prioritize", {"Pod": strip_kind(p), "NodeNames": passed}).json()
        assert [s["Host"] for s in first] == ["a", "b", "c"]
        served.store.apply("nodes", "DELETED", node("a", exclusive(1)))  # "c" moves into a's row
        served.store.apply("nodes", "ADDED", node("d", exclusive(1)))
        again = served.post("prioritize", {"Pod": strip_kind(p), "NodeNames": ["c", "a", "d", "b"]}).json()
        assert [s["Host"] for s in again] == ["c", "a", "d", "b"]
        by_host = {s["Host"]: s["Score"] for s in again}
        assert by_host["a"] == 0 and by_host["c"] == by_host["d"] == 10  # unknown now; identical nodes
        assert served.filter(p, ["c", "a", "d"])["NodeNames"] == ["c", "d"]
    finally:
        served.close()


def test_pod_without_vramfit_demand_passes_everything(fixture_cluster: Served) -> None:
    plain = {"metadata": {"name": "web", "namespace": "default", "uid": "u-web"},
             "spec": {"containers": [{"name": "c", "image": "nginx"}]}, "status": {"phase": "Pending"}}
    names = ["gpu-h100-a", "cpu-only-1", "gpu-gone-7"]
    out = fixture_cluster.post("filter", {"Pod": plain, "Nodes": None, "NodeNames": names}).json()
    assert out["NodeNames"] == names and out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}


def test_malformed_vramfit_annotation_fails_every_node_with_reason(fixture_cluster: Served) -> None:
    bad = pod("bad", 8192, annotations={"vramfit.io/isolation": "strong"})
    names = ["gpu-h100-a", "gpu-a100-b"]
    out = fixture_cluster.filter(bad, names)
    assert out["NodeNames"] == [] and out["FailedNodes"] == {}
    assert set(out["FailedAndUnresolvableNodes"]) == set(names)
    assert all("vramfit.io/isolation" in v for v in out["FailedAndUnresolvableNodes"].values())


def test_full_now_versus_never() -> None:
    held = pod("holder", 70000, node_name="n1", assignment={"gpus": [{"index": 0, "mig": None, "vram_mib": 70000}]})
    served = Served([node("n1", exclusive(1)), held])
    try:
        out = served.filter(pod("small", 8192), ["n1"])
        assert list(out["FailedNodes"]) == ["n1"] and "held by default/holder" in out["FailedNodes"]["n1"]
        out = served.filter(pod("huge", 200_000), ["n1"])
        assert list(out["FailedAndUnresolvableNodes"]) == ["n1"]
        assert "81920 MiB" in out["FailedAndUnresolvableNodes"]["n1"]
    finally:
        served.close()


# ---- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("verb", "body", "fragment"), [
    ("filter", b"\x89PNG\r\n\x1a\n\x00\x00binary", "not UTF-8"),
    ("filter", b'{"Pod": {"metadata": {}}, "NodeNames": ', "malformed JSON"),
    ("filter", b"42", "expected a JSON object"),
    ("filter", b'{"NodeNames": ["a"]}', "Pod"),
    ("filter", b'{"Pod": "yes", "NodeNames": ["a"]}', "Pod"),
    ("filter", b'{"Pod": {}, "NodeNames": null, "Nodes": null}', "neither NodeNames nor Nodes"),
    ("prioritize", b'{"Pod": {}, "NodeNames": [1, 2]}', "NodeNames.0"),
    ("bind", b'{"PodName": "p"}', "PodNamespace"),
    ("preempt", b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}}', "UID"),
])
def test_bad_input_is_400_naming_the_problem(fixture_cluster: Served, verb: str, body: bytes, fragment: str) -> None:
    r = fixture_cluster.post(verb, body)
    assert r.status_code == 400
    assert fragment in r.json()["Error"]
    # ...and the service keeps serving.
    assert fixture_cluster.client.get("/healthz").status_code == 200
    good = fixture_cluster.post("filter", (FIXTURES / "filter-args-nodenames.json").read_bytes())
    assert good.status_code == 200 and good.json()["NodeNames"]


def test_body_size_cap() -> None:
    served = Served([node("n1", exclusive(1))], max_body_bytes=4096)
    try:
        names = [f"node-{i:05d}" for i in range(1000)]
        r = served.post("filter", {"Pod": {}, "NodeNames": names})
        assert r.status_code == 413 and "4096-byte limit" in r.json()["Error"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the cap applies while streaming
            yield b'{"Pod": {}, "NodeNames": ['
            for _ in range(500):
                yield b'"abcdefghij",'
            yield b'"z"]}'

        r = served.client.post(f"{PREFIX}/filter", content=chunks())
        assert r.status_code == 413
        assert served.filter(pod("p", 1024), ["n1"])["NodeNames"] == ["n1"]
    finally:
        served.close()


def test_unknown_path_is_404_json(fixture_cluster: Served) -> None:
    r = fixture_cluster.client.post("/filter", json={})  # without the prefix
    assert r.status_code == 404 and "no such endpoint" in r.json()["Error"]


# ---- bind -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "units"), [
    (exclusive(4), 4),
    ([{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
       "mig": [{"profile": "1g.10gb", "start": s} for s in range(7)]}], 7),
    ([{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mps", "replicas": 6}], 6),
])
def test_concurrent_binds_for_the_last_units(gpus: list[dict[str, Any]], units: int) -> None:
    served = Served([node("n1", gpus)])
    try:
        pods = [pod(f"p{i}", 8192) for i in range(3 * units)]  # one tenant: their namespace's
        for p in pods:
            assert served.filter(p, ["n1"])["NodeNames"] == ["n1"]  # all fit before anyone binds
        barrier = threading.Barrier(len(pods))

        def bind(p: dict[str, Any]) -> str:
            with httpx.Client(base_url=served.server.url, timeout=20) as c:
                barrier.wait(10)
                meta = p["metadata"]
                r = c.post(f"{PREFIX}/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                                   "PodUID": meta["uid"], "Node": "n1"})
                assert r.status_code == 200
                return str(r.json()["Error"])

        with ThreadPoolExecutor(len(pods)) as pool:
            errors = list(pool.map(bind, pods))
        assert sum(1 for e in errors if e == "") == units
        assert all("no longer fits" in e for e in errors if e)
        holders = served.store.state.holders()
        assert len(holders) == units and not any(h.reserved for h in holders)
        units_used = [(g.index, g.mig) for h in holders for g in h.assignment.gpus]
        if gpus[0]["mode"] != "mps":
            assert len(set(units_used)) == units  # no unit booked twice
        state = served.client.get("/state").json()
        assert state["reservations"] == []
    finally:
        served.close()


def test_bind_is_idempotent_and_checks_node() -> None:
    served = Served([node("n1", exclusive(2)), node("n2", exclusive(1))])
    try:
        p = pod("p", 8192)
        served.filter(p, ["n1", "n2"])
        assert served.bind(p, "n1") == {"Error": ""}
        first = served.store.state.holder("default/p")
        assert served.bind(p, "n1") == {"Error": ""}  # the scheduler retried after a timeout
        assert served.store.state.holder("default/p") == first
        assert len(served.binder.bound) == 1
        again = served.bind(p, "n2")
        assert "already bound to n1" in again["Error"]
    finally:
        served.close()


def test_bind_failure_releases_the_reservation() -> None:
    class Refusing:
        def __init__(self) -> None:
            self.calls = 0

        def bind(self, namespace: str, name: str, uid: str, resource_version: str, assignment: Assignment) -> None:
            self.calls += 1
            raise BindError(f"binding pod {namespace}/{name}: pods \"{name}\" is forbidden (HTTP 403)")

    served = Served([node("n1", exclusive(1))], binder=Refusing())
    try:
        p = pod("p", 8192)
        served.filter(p, ["n1"])
        out = served.bind(p, "n1")
        assert "forbidden (HTTP 403)" in out["Error"]
        assert served.store.state.holders() == [] and served.store.reservations == {}
        # The unit is free again for the next pod.
        assert served.filter(pod("q", 8192), ["n1"])["NodeNames"] == ["n1"]
    finally:
        served.close()


def test_bind_of_unknown_pod_is_an_error(fixture_cluster: Served) -> None:
    out = fixture_cluster.bind(pod("ghost", 1024), "gpu-h100-a")
    assert "unknown to vramfit" in out["Error"]


def test_reservation_is_visible_before_the_binding_completes() -> None:
    release = threading.Event()
    entered = threading.Event()

    class Slow(MemoryBinder):
        blocking = True  # it waits, like an API call: off the event loop

        def bind(self, namespace: str, name: str, uid: str, resource_version: str, assignment: Assignment) -> None:
            entered.set()
            assert release.wait(10)
            super().bind(namespace, name, uid, resource_version, assignment)

    served = Served([node("n1", exclusive(1))], binder=Slow())
    try:
        first, second = pod("first", 8192), pod("second", 8192)
        served.filter(first, ["n1"])
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(served.bind(first, "n1")))
        t.start()
        assert entered.wait(10)
        # While the API call is in flight the unit is already booked: the next pod's filter sees it taken.
        out = served.filter(second, ["n1"])
        assert out["NodeNames"] == [] and "n1" in out["FailedNodes"]
        state = served.client.get("/state").json()
        assert [r["pod"] for r in state["reservations"]] == ["default/first"]
        release.set()
        t.join(10)
        assert result == {"Error": ""}
        assert served.client.get("/state").json()["reservations"] == []
    finally:
        release.set()
        served.close()


def test_reservation_ttl_expires() -> None:
    now = [1000.0]
    store = Store(CATALOG, reservation_ttl_s=30, clock=lambda: now[0])
    store.replace("nodes", [node("n1", exclusive(1))])
    store.replace("pods", [])
    from packing.k8s.demand import pod_demand
    from packing.policies import get_policy

    demand = pod_demand(pod("p", 8192))
    assert demand is not None
    store.reserve(demand, "n1", get_policy("best-fit"))
    now[0] += 29
    assert store.sweep() == [] and store.state.holder("default/p") is not None
    now[0] += 2
    assert store.sweep() == ["default/p"]
    assert store.state.holder("default/p") is None and store.reservations == {}


# ---- restart from a snapshot holding assignments --------------------------------------------------------


def test_restart_from_snapshot_keeps_everything_placed(tmp_path: Path) -> None:
    nodes = [node("n1", [{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
                          "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}]),
             node("n2", exclusive(1))]
    served = Served(nodes)
    pods = [pod("a", 30000), pod("b", 30000), pod("c", 60000)]
    try:
        for p in pods:
            out = served.filter(p, ["n1", "n2"])
            assert served.bind(p, out["NodeNames"][0])["Error"] == ""
        before = sorted((h.pod.key, h.assignment) for h in served.store.state.holders())
    finally:
        served.close()
    # What the API would now hold: each pod bound with its assignment annotation.
    bound = []
    for p in pods:
        h = dict(before)[f"default/{p['metadata']['name']}"]
        bound.append(pod(p["metadata"]["name"], int(p["spec"]["containers"][0]["resources"]["requests"]
                                                   ["vramfit.io/vram"]), node_name=h.node,
                         assignment=h.to_annotation()))
    snap = tmp_path / "snapshot.yaml"
    snap.write_text(yaml.safe_dump_all(nodes + bound))
    store = Store.from_objects(read_yaml_documents(str(snap)), CATALOG)
    assert sorted((h.pod.key, h.assignment) for h in store.state.holders()) == before
    restarted = Served(read_yaml_documents(str(snap)))
    try:
        out = restarted.filter(pod("d", 1024), ["n1", "n2"])
        assert out["NodeNames"] == [] and set(out["FailedNodes"]) == {"n1", "n2"}  # nothing was lost
    finally:
        restarted.close()


# ---- preempt ----------------------------------------------------------------------------------------


def test_preempt_keeps_the_fewest_gpu_victims() -> None:
    holders = [pod(f"v{i}", 70000, uid=f"victim-{i}", node_name="n1", priority=i,
                   assignment={"gpus": [{"index": i, "mig": None, "vram_mib": 70000}]}) for i in range(2)]
    small = node("n2", [{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
                         "mig": [{"profile": "1g.10gb", "start": 0}]}])
    tiny = pod("tiny", 8000, uid="tiny-uid", node_name="n2",
               assignment={"gpus": [{"index": 0, "mig": "1g.10gb@0", "vram_mib": 8000}]})
    cpu_only = {"kind": "Pod", "metadata": {"name": "web", "namespace": "default", "uid": "cpu-only-pod"},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
                "status": {"phase": "Running"}}
    served = Served([node("n1", exclusive(2)), small, *holders, tiny, cpu_only])
    try:
        preemptor = strip_kind(pod("urgent", 40000, priority=1000))
        req = {"Pod": preemptor, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "victim-0"}, {"UID": "victim-1"}, {"UID": "cpu-only-pod"},
                            {"UID": "not-a-pod-of-n1"}], "NumPDBViolations": 1},  # dropped: not on n1
            "n2": {"Pods": [{"UID": "tiny-uid"}], "NumPDBViolations": 0},  # its only instance is 10 GB: no help
            "gone": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0},
        }}
        r = served.post("preempt", req)
        assert r.status_code == 200
        assert r.json() == {"NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "victim-0"}, {"UID": "cpu-only-pod"}], "NumPDBViolations": 1}}}
        # Simulation only: nothing was evicted from the live state.
        assert len(served.store.state.holders()) == 3
        # The full-pod form (nodeCacheCapable: false) gives the same answer.
        full = {"Pod": preemptor, "NodeNameToMetaVictims": None, "NodeNameToVictims": {
            "n1": {"Pods": [strip_kind(h) for h in holders], "NumPDBViolations": 0}}}
        assert served.post("preempt", full).json() == {"NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "victim-0"}], "NumPDBViolations": 0}}}
    finally:
        served.close()


def test_preempt_passes_through_pods_that_are_not_ours(fixture_cluster: Served) -> None:
    plain = {"metadata": {"name": "web", "namespace": "default", "uid": "w"}, "spec": {"containers": []}}
    known = "5e2d7c9b-3a18-4f06-b2e7-9c1d0a8f6e42"  # pod-bound-assigned.json, on gpu-h100-a
    req = {"Pod": plain, "NodeNameToMetaVictims": {
        "gpu-h100-a": {"Pods": [{"UID": known}, {"UID": "unknown"}], "NumPDBViolations": 0},
        "no-such-node": {"Pods": [{"UID": known}], "NumPDBViolations": 0}}}
    # Only what the extender knows comes back: the nodes and the pods bound to them.
    assert fixture_cluster.post("preempt", req).json() == {
        "NodeNameToMetaVictims": {"gpu-h100-a": {"Pods": [{"UID": known}], "NumPDBViolations": 0}}}


# ---- health, metrics, state ----------------------------------------------------------------------------


def test_health_metrics_and_state(fixture_cluster: Served) -> None:
    fixture_cluster.post("filter", (FIXTURES / "filter-args-nodenames.json").read_bytes())
    fixture_cluster.post("prioritize", (FIXTURES / "filter-args-nodenames.json").read_bytes())
    c = fixture_cluster.client
    assert c.get("/healthz").text == "ok"
    assert c.get("/readyz").status_code == 200
    text = c.get("/metrics").text
    assert 'vramfit_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'vramfit_request_duration_seconds_count{verb="prioritize"} 1.0' in text
    assert 'vramfit_filter_nodes_total{result="never"} 2.0' in text
    # Bytes, as Prometheus names them: 327680 MiB free on gpu-a100-b.
    assert 'vramfit_node_free_vram_bytes{node="gpu-a100-b"} 3.4359738368e+11' in text
    assert "vramfit_stranded_vram_bytes" in text and "vramfit_reservations 0.0" in text
    assert re.search(r'vramfit_gpu_pods\{gpu="0",mode="mig",node="gpu-h100-a",uuid="[^"]*"\} 1\.0', text)
    assert 'vramfit_build_info{python="' in text and "_created" not in text
    state = c.get("/state").json()
    h100 = next(n for n in state["nodes"] if n["name"] == "gpu-h100-a")
    unit = h100["gpus"][0]["units"][0]
    # H100-80GB 3g.40gb from the catalog: 40192 MiB (39.25 GiB on driver R525, the smaller published size).
    assert unit == {"mig": "3g.40gb@0", "memory_mib": 40192, "holder": "research/trainer-0", "vram_mib": 30720}


def _scrape(served: Served) -> dict[tuple[str, str], float]:
    """/metrics parsed with prometheus_client's own parser: (metric, node label or "") -> value."""
    r = served.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, s.labels.get("node", ""))] = s.value
    return out


def test_metrics_free_and_stranded_vram_per_node_follow_binds() -> None:
    served = Served([node("ts", [{"index": 0, "product": "NVIDIA-L40S", "mode": "timeslice", "replicas": 4}]),
                     node("ex", exclusive(2)), node("idle", exclusive(1))])
    try:
        state = served.store.state
        before = _scrape(served)
        assert before[("vramfit_node_stranded_vram_bytes", "ts")] == 0
        assert before[("vramfit_stranded_vram_bytes", "")] == 0
        assert before[("vramfit_free_vram_bytes", "")] == sum(
            before[("vramfit_node_free_vram_bytes", n)] for n in ("ts", "ex", "idle"))

        # Time-sliced GPU: the pod takes exactly its VRAM from the pool, nothing is stranded yet.
        small = pod("small", 14336)
        served.filter(small, ["ts", "ex", "idle"])
        assert served.bind(small, "ts") == {"Error": ""}
        # Exclusive GPU: the pod gets the whole GPU, so everything it does not use is stranded.
        big = pod("big", 30720)
        served.filter(big, ["ts", "ex", "idle"])
        assert served.bind(big, "ex") == {"Error": ""}
        after = _scrape(served)

        assert after[("vramfit_node_free_vram_bytes", "ts")] == before[("vramfit_node_free_vram_bytes", "ts")] - 14336 * MIB
        a100 = state.node("ex").gpus[0].memory_mib
        assert after[("vramfit_node_free_vram_bytes", "ex")] == before[("vramfit_node_free_vram_bytes", "ex")] - a100 * MIB
        assert after[("vramfit_node_free_vram_bytes", "idle")] == before[("vramfit_node_free_vram_bytes", "idle")]
        # Stranded VRAM is the core's figure: per node, and in total.
        with served.store.lock:
            core_total = state.stranded_mib()
            core_ex = ClusterState([state.node("ex")], relax_tenancy=state.relax_tenancy)
            for h in state.holders_on("ex"):
                core_ex.allocate(h.pod, h.assignment)
        assert after[("vramfit_node_stranded_vram_bytes", "ex")] == core_ex.stranded_mib() * MIB == (a100 - 30720) * MIB
        assert after[("vramfit_node_stranded_vram_bytes", "ts")] == 0
        assert after[("vramfit_node_stranded_vram_bytes", "idle")] == 0
        assert after[("vramfit_stranded_vram_bytes", "")] == core_total * MIB == (a100 - 30720) * MIB
        assert after[("vramfit_free_vram_bytes", "")] == before[("vramfit_free_vram_bytes", "")] - (14336 + a100) * MIB
        assert after[("vramfit_reservations", "")] == 0 and after[("vramfit_reserved_vram_bytes", "")] == 0
        assert after[("vramfit_node_largest_free_unit_bytes", "ex")] == a100 * MIB
    finally:
        served.close()


def test_metrics_exposition_matches_prometheus_client() -> None:
    """The per-node families are rendered from arrays; the text must be what generate_latest writes."""
    served = Served([node(f"n{k}", exclusive(1 + k % 3)) for k in range(40)])
    try:
        p = pod("p", 8192)
        served.filter(p, ["n1"])
        served.store.reserve(served.store.demand_for("default", "p", p["metadata"]["uid"]) or pytest.fail(),
                             "n1", served.app.state.services.extender.policy)
        registry = served.app.state.services.metrics.registry
        fast = exposition(registry).decode()
        slow = generate_latest(registry).decode()
        assert sorted(fast.splitlines()) == sorted(slow.splitlines())
        assert 'vramfit_node_stranded_vram_bytes{node="n1"}' in fast and "vramfit_reservations 1.0" in fast
        assert "vramfit_reserved_vram_bytes 8.589934592e+09" in fast  # 8192 MiB
    finally:
        served.close()


# ---- TLS with client certificates ------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")
def test_tls_with_client_certificate(tmp_path: Path) -> None:
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=vramfit-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                 "-subj", f"/CN=vramfit-{who}", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{who}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    args = build_serve_parser().parse_args(["--snapshot", "x.yaml", "--tls-cert", str(d / "server.crt"),
                                            "--tls-key", str(d / "server.key"), "--client-ca", str(d / "ca.crt")])
    from extender.listeners import ssl_options

    opts, _ = ssl_options(args.tls_cert, args.tls_key, args.client_ca)
    store = Store.from_objects([node("n1", exclusive(1))], CATALOG)
    app = create_app(Settings(url_prefix=PREFIX), store, MemoryBinder())
    with LocalServer(app, **opts) as server:
        assert server.url.startswith("https://")
        import ssl

        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
        with httpx.Client(verify=ctx) as c:
            r = c.post(f"{server.url}{PREFIX}/filter", json={"Pod": strip_kind(pod("p", 1024)), "NodeNames": ["n1"]})
            assert r.json()["NodeNames"] == ["n1"]
        no_cert = ssl.create_default_context(cafile=str(d / "ca.crt"))
        with httpx.Client(verify=no_cert) as c, pytest.raises(httpx.HTTPError):
            c.get(f"{server.url}/healthz")


# ---- the `vramfit serve` entry point, as a process ---------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_command_runs_from_a_snapshot(tmp_path: Path) -> None:
    import sys

    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump_all([node("n1", exclusive(2)), pod("held", 8192, node_name="n1",
                                        assignment={"gpus": [{"index": 0, "mig": None, "vram_mib": 8192}]})]))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("url_prefix: /vramfit\npolicy: best-fit\n")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vramfit.cli", "serve", "--snapshot", str(snap), "--config", str(cfg),
                             "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/readyz")
        out = httpx.post(f"http://127.0.0.1:{port}{PREFIX}/filter",
                         json={"Pod": strip_kind(pod("p", 80000)), "Nodes": None, "NodeNames": ["n1"]}).json()
        assert out["NodeNames"] == ["n1"]  # GPU 1 is still free; GPU 0 is held by the snapshot's pod
        out = httpx.post(f"http://127.0.0.1:{port}{PREFIX}/bind",
                         json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-default-p", "Node": "n1"})
        assert out.json() == {"Error": ""}
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.parametrize(("args", "message"), [
    (["--snapshot", "/nonexistent/cluster.yaml"], "no such file"),
    (["--snapshot", "SNAP", "--config", "CFG"], "policy"),
    (["--snapshot", "SNAP", "--tls-cert", "a.pem"], "--tls-cert and --tls-key go together"),
])
def test_serve_command_reports_bad_setup(tmp_path: Path, args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import run_serve

    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump(node("n1", exclusive(1))))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policy: no-such-policy\n")
    argv = [a.replace("SNAP", str(snap)).replace("CFG", str(cfg)) for a in args]
    ns = build_serve_parser().parse_args(argv)
    assert run_serve(ns) == 2
    assert message in capsys.readouterr().err
