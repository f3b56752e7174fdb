"""The mutating admission webhook over real HTTP (uvicorn on loopback), AdmissionReview in and out; the
JSON Patch it answers applied to the pod with an RFC 6902 applier written here; and the webhook manifests
(25-webhook.yaml, 26-webhook-cert.yaml) validated against the Kubernetes schemas."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_cel import evaluate

from benchmarks.local_server import LocalServer
from extender import webhook
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.store import Store
from packing.catalog import load_catalog
from packing.k8s.demand import pod_demand
from packing.k8s.trust import ANN_ALLOWED_TENANTS, LABEL_TENANT, Tenancy

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"
K8S_VERSION = "1.31.0"
PREFIX = "/vramfit"
GPU = "vramfit.io/gpu"
VRAM = "vramfit.io/vram"
SCHEDULER = "vramfit-scheduler"
RECORDS = ("vramfit.io/assignment", "vramfit.io/phase", "vramfit.io/bound-at", "vramfit.io/assignment-signature")
# The namespaces as an admin labelled them: default lets its pods name team-search (the fixture pod does);
# team-a is its own tenant; ml-prod is tenant team-ml.
NAMESPACES = [
    {"metadata": {"name": "default", "annotations": {ANN_ALLOWED_TENANTS: "team-search, team-recsys"}}},
    {"metadata": {"name": "team-a"}},
    {"metadata": {"name": "ml-prod", "labels": {LABEL_TENANT: "team-ml"}}},
    {"metadata": {"name": "evil"}},
]


# ---- an RFC 6902 JSON Patch applier (add, remove, replace, test), strict about paths -----------------


def _tokens(path: str) -> list[str]:
    assert path.startswith("/"), f"not a JSON pointer: {path!r}"
    # RFC 6901: ~1 is "/", ~0 is "~"; ~1 first, so "~01" stays "~1".
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for t in tokens[:-1]:
        node = node[int(t)] if isinstance(node, list) else node[t]  # KeyError: a missing parent is an error
    return node


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        tokens = _tokens(op["path"])
        parent = _parent(doc, tokens)
        key = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if key == "-" else int(key)
            if kind == "add":
                assert 0 <= index <= len(parent)
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "remove":
                del parent[index]
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "test":
                assert parent[index] == op["value"]
            else:
                raise AssertionError(f"unsupported op {kind}")
        else:
            assert isinstance(parent, dict), f"{op['path']}: parent is not an object"
            if kind == "add":  # adds a member or replaces an existing one
                parent[key] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[key]
            elif kind == "replace":
                assert key in parent, f"replace of a missing member {op['path']}"
                parent[key] = copy.deepcopy(op["value"])
            elif kind == "test":
                assert parent[key] == op["value"]
            else:
                raise AssertionError(f"unsupported op {kind}")
    return doc


def test_patch_applier_follows_rfc6902() -> None:
    doc = {"a": {"b/c": 1, "m~n": 2}, "l": [1, 2]}
    out = apply_patch(doc, [{"op": "add", "path": "/a/b~1c", "value": 5}, {"op": "replace", "path": "/a/m~0n", "value": 3},
                            {"op": "add", "path": "/l/-", "value": 9}, {"op": "remove", "path": "/l/0"},
                            {"op": "test", "path": "/l", "value": [2, 9]}])
    assert out == {"a": {"b/c": 5, "m~n": 3}, "l": [2, 9]} and doc["a"]["b/c"] == 1
    with pytest.raises(KeyError):
        apply_patch(doc, [{"op": "add", "path": "/missing/x", "value": 1}])


# ---- the served app -------------------------------------------------------------------------------------


class Served:
    def __init__(self, namespaces: list[dict[str, Any]] | None = None, **settings: Any) -> None:
        store = Store.from_objects([], load_catalog())
        # What the store's Namespace watch keeps current in cluster mode.
        store.tenancy = Tenancy.from_objects(NAMESPACES if namespaces is None else namespaces)
        self.app = create_app(Settings(url_prefix=PREFIX, **settings), store, MemoryBinder())
        self.server = LocalServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)

    def post(self, body: Any, path: str = "/mutate") -> httpx.Response:
        if isinstance(body, bytes):
            return self.client.post(path, content=body, headers={"Content-Type": "application/json"})
        return self.client.post(path, json=body)

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def review(obj: Any, *, operation: str = "CREATE", namespace: str | None = "team-a", name: str | None = None,
           kind: dict[str, str] | None = None, user: str = "alice",
           groups: tuple[str, ...] = ("system:authenticated",)) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a pod."""
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()), "kind": kind or {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": kind or {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation, "userInfo": {"username": user, "groups": list(groups)},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if namespace is not None:
        request["namespace"] = namespace
    if name is not None:
        request["name"] = name
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def container(name: str = "c", vram: str | None = None, *, requests: bool = True, limits: bool = True,
              more: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    values = {**({VRAM: vram} if vram is not None else {}), **(more or {})}
    if requests:
        res["requests"] = {"cpu": "1", **values}
    if limits:
        res["limits"] = dict(values)
    return {"name": name, "image": "busybox", "resources": res}


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, name: str | None = "p",
        scheduler: str | None = None, init: list[dict[str, Any]] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team-a"}
    if name is not None:
        meta["name"] = name
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def admit(served: Served, obj: Any, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """POST a review; check the envelope; -> (response, decoded patch)."""
    body = review(obj, **kw)
    r = served.post(body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == body["request"]["uid"]
    patch: list[dict[str, Any]] = []
    if "patch" in response:
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
    else:
        assert "patchType" not in response
    return response, patch


def mutated(served: Served, obj: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Admit a pod that must be allowed; -> (response, the pod with the patch applied)."""
    response, patch = admit(served, obj, **kw)
    assert response["allowed"] is True, response
    return response, apply_patch(obj, patch)


def gpu_counts(p: dict[str, Any], section: str = "containers") -> list[tuple[str | None, str | None]]:
    """(limits, requests) of vramfit.io/gpu for each container."""
    out = []
    for c in p["spec"].get(section) or []:
        res = c.get("resources") or {}
        out.append(((res.get("limits") or {}).get(GPU), (res.get("requests") or {}).get(GPU)))
    return out


# ---- vramfit pods are mutated ---------------------------------------------------------------------------


def test_fixture_pod_gets_scheduler_and_gpu_limit_and_request(served: Served) -> None:
    obj = json.loads((FIXTURES / "pod-pending-7b.json").read_text())
    obj["spec"]["schedulerName"] = "default-scheduler"  # what the API server defaults an unset name to
    response, out = mutated(served, obj, namespace="default", name="llm-7b-inference")
    assert out["spec"]["schedulerName"] == SCHEDULER
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"memory": "16Gi", VRAM: "14336", GPU: "1"}
    assert res["requests"] == {"cpu": "4", "memory": "16Gi", VRAM: "14336", GPU: "1"}
    # The only changes are the scheduler and the GPU resource.
    undo = copy.deepcopy(out)
    undo["spec"]["schedulerName"] = "default-scheduler"
    del undo["spec"]["containers"][0]["resources"]["limits"][GPU], undo["spec"]["containers"][0]["resources"]["requests"][GPU]
    assert undo == obj
    tenancy = Tenancy.from_objects(NAMESPACES)
    assert pod_demand(out, tenancy) == pod_demand(obj, tenancy)  # the extender reads the mutated pod as the original
    assert "warnings" not in response


def test_patch_paths_escape_the_slash(served: Served) -> None:
    _, patch = admit(served, pod(container(vram="8192")))
    paths = {op["path"] for op in patch}
    assert paths == {"/spec/schedulerName", "/spec/containers/0/resources/limits/vramfit.io~1gpu",
                     "/spec/containers/0/resources/requests/vramfit.io~1gpu"}
    assert all(op["op"] == "add" for op in patch)


def test_missing_resources_and_limits_are_created(served: Served) -> None:
    # VRAM only from the annotation: the first app container gets the GPU, with resources created.
    bare = {"name": "main", "image": "busybox"}
    _, out = mutated(served, pod(bare, {"name": "side", "image": "busybox"}, annotations={VRAM: "14Gi"}))
    assert gpu_counts(out) == [("1", None), (None, None)]
    assert out["spec"]["containers"][0]["resources"] == {"limits": {GPU: "1"}}
    # limits only (requests map absent): the API server defaults requests from limits
    _, out = mutated(served, pod(container("main", "8Gi", requests=False)))
    assert out["spec"]["containers"][0]["resources"] == {"limits": {VRAM: "8Gi", GPU: "1"}}
    # resources: null and limits: null are replaced, not indexed into
    _, out = mutated(served, pod({"name": "m", "image": "x", "resources": None}, annotations={VRAM: "1Gi"}))
    assert out["spec"]["containers"][0]["resources"] == {"limits": {GPU: "1"}}
    _, out = mutated(served, pod({"name": "m", "image": "x", "resources": {"limits": None}},
                                 annotations={VRAM: "1Gi"}))
    assert gpu_counts(out) == [("1", None)]


def test_every_vram_container_gets_the_pod_gpu_count(served: Served) -> None:
    p = pod(container("a", "20Gi"), container("sidecar"), container("b", "4Gi", requests=False),
            annotations={"vramfit.io/gpus": "2"})
    _, out = mutated(served, p)
    assert gpu_counts(out) == [("2", "2"), (None, None), ("2", None)]
    assert out["spec"]["containers"][1] == p["spec"]["containers"][1]


def test_the_mutation_is_idempotent(served: Served) -> None:
    # reinvocationPolicy: IfNeeded may send the mutated pod again; nothing more is changed.
    p = pod(container("a", "20Gi"), {"name": "b", "image": "x"}, annotations={"vramfit.io/gpus": "3"})
    _, once = mutated(served, p)
    response, patch = admit(served, once)
    assert response["allowed"] is True and patch == []


def test_right_explicit_count_is_left_alone_and_wrong_one_denied(served: Served) -> None:
    right = pod(container("a", "20Gi", more={GPU: "2"}), annotations={"vramfit.io/gpus": "2"},
                scheduler=SCHEDULER)
    response, patch = admit(served, right)
    assert response["allowed"] is True and patch == []
    half = pod(container("a", "20Gi", requests=True), annotations={"vramfit.io/gpus": "2"}, scheduler=SCHEDULER)
    half["spec"]["containers"][0]["resources"]["limits"][GPU] = "2"
    _, out = mutated(served, half)
    assert gpu_counts(out) == [("2", "2")]
    wrong = pod(container("a", "20Gi", more={GPU: "1"}), annotations={"vramfit.io/gpus": "2"})
    response, _ = admit(served, wrong)
    assert response["allowed"] is False and response["status"]["code"] == 403
    msg = response["status"]["message"]
    assert "spec.containers[0].resources.limits[vramfit.io/gpu]" in msg and "asks for 2 GPU" in msg
    # another container (even an init container) with a count that cannot be served
    other = pod(container("a", "20Gi"), container("b", more={GPU: "4"}))
    response, _ = admit(served, other)
    assert response["allowed"] is False and "spec.containers[1].resources.limits[vramfit.io/gpu]" in \
        response["status"]["message"]
    garbage = pod(container("a", "20Gi", more={GPU: "one"}))
    response, _ = admit(served, garbage)
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "vramfit.io/gpu" in response["status"]["message"]


# ---- the scheduler name -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [(None, SCHEDULER), ("default-scheduler", SCHEDULER),
                                                 (SCHEDULER, SCHEDULER)])
def test_scheduler_name_is_set(served: Served, given: str | None, expected: str) -> None:
    _, out = mutated(served, pod(container(vram="1Gi"), scheduler=given))
    assert out["spec"]["schedulerName"] == expected


def test_a_pod_of_another_scheduler_is_left_alone_with_a_warning(served: Served) -> None:
    response, patch = admit(served, pod(container(vram="1Gi"), scheduler="volcano"))
    assert response["allowed"] is True and patch == []
    assert any("volcano" in w for w in response["warnings"])


def test_configured_scheduler_name() -> None:
    s = Served(webhook_scheduler_name="gpu-packer")
    try:
        _, out = mutated(s, pod(container(vram="1Gi")))
        assert out["spec"]["schedulerName"] == "gpu-packer"
        response, patch = admit(s, pod(container(vram="1Gi"), scheduler=SCHEDULER))  # now "another" one
        assert patch == [] and response["warnings"]
    finally:
        s.close()
    with pytest.raises(ValueError, match="scheduler name"):
        Settings(webhook_scheduler_name="Not A Name")


# ---- pods created by controllers ----------------------------------------------------------------------------


def test_generate_name_pod_of_a_deployment(served: Served) -> None:
    """A ReplicaSet's pod: no metadata.name and no namespace in the object; the request has the namespace."""
    obj = pod(container("server", "14336"), name=None, annotations={"vramfit.io/isolation": "process"})
    obj["metadata"] = {"generateName": "llm-7b-5d4f9c7b8-", "labels": {"app": "llm"},
                       "annotations": {"vramfit.io/isolation": "process"}}
    response, out = mutated(served, obj, namespace="team-b", name=None)
    assert gpu_counts(out) == [("1", "1")] and out["spec"]["schedulerName"] == SCHEDULER
    assert "name" not in out["metadata"] and "namespace" not in out["metadata"]  # not the webhook's to set
    obj["metadata"]["annotations"]["vramfit.io/isolation"] = "strong"
    response, _ = admit(served, obj, namespace="team-b", name=None)
    assert response["allowed"] is False
    assert "pod team-b/llm-7b-5d4f9c7b8-*" in response["status"]["message"]
    assert "vramfit.io/isolation" in response["status"]["message"]


# ---- deny messages -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("annotations", "vram", "field", "says"), [
    ({}, "lots", "spec.containers[0].resources.requests[vramfit.io/vram]", "quantity"),
    ({}, "1e25", "spec.containers[0].resources.requests[vramfit.io/vram]", "16 TiB"),
    ({}, "15032385536", "spec.containers[0].resources.requests[vramfit.io/vram]", "a bare number counts MiB"),
    ({}, "500Ki", "spec.containers[0].resources.requests[vramfit.io/vram]", "less than 1 MiB"),
    ({"vramfit.io/isolation": "strong"}, "1Gi", "metadata.annotations[vramfit.io/isolation]", "hardware"),
    ({"vramfit.io/gpus": "0"}, "1Gi", "metadata.annotations[vramfit.io/gpus]", "between 1 and 64"),
    ({"vramfit.io/gpus": "two"}, "1Gi", "metadata.annotations[vramfit.io/gpus]", "whole number"),
    ({"vramfit.io/gpu-models": " , "}, "1Gi", "metadata.annotations[vramfit.io/gpu-models]", "comma-separated"),
    ({VRAM: "0"}, None, "metadata.annotations[vramfit.io/vram]", "at least 1 MiB"),
])
def test_unreadable_vramfit_fields_are_denied_naming_the_field(served: Served, annotations: dict[str, str],
                                                              vram: str | None, field: str, says: str) -> None:
    response, patch = admit(served, pod(container(vram=vram), annotations=annotations))
    assert response["allowed"] is False and patch == []
    status = response["status"]
    assert status["code"] == 400
    assert f"field {field}" in status["message"] and says in status["message"]
    assert "pod team-a/p" in status["message"]


def test_a_pod_the_webhook_cannot_read_is_denied_not_a_500(served: Served) -> None:
    response, _ = admit(served, "not a pod")
    assert response["allowed"] is False and response["status"]["code"] == 400
    broken = pod(container(vram="1Gi"))
    broken["spec"]["containers"].append("oops")
    response, _ = admit(served, broken)
    assert response["allowed"] is False and "spec.containers[1]" in response["status"]["message"]
    no_app = pod(init=[container("init", "1Gi")])
    no_app["spec"]["containers"] = []
    response, _ = admit(served, no_app)
    assert response["allowed"] is False and "spec.containers" in response["status"]["message"]


def test_a_bug_in_the_webhook_is_a_deny_that_says_so(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(webhook, "pod_demand", broken)
    response, _ = admit(served, pod(container(vram="1Gi")))
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert "RuntimeError: boom" in response["status"]["message"]


# ---- what would be ignored, or refused later by the API server, is denied now (issue 27.1, 27.3) -------------


@pytest.mark.parametrize(("obj", "field", "meant"), [
    # the pod would get the default isolation (time-sliced GPUs) without a word
    (pod(container(vram="14Gi"), annotations={"vramfit.io/isolaton": "hardware"}),
     "metadata.annotations[vramfit.io/isolaton]", "vramfit.io/isolation"),
    (pod(container(), annotations={"vramfit.io/vramm": "14Gi"}), "metadata.annotations[vramfit.io/vramm]",
     "vramfit.io/vram"),
    (pod(container(vram="1Gi"), annotations={"vramfit.io/gpu-model": "H100-80GB"}),
     "metadata.annotations[vramfit.io/gpu-model]", "vramfit.io/gpu-models"),
    (pod(container(), labels={"vramfit.io/tenat": "team-a"}), "metadata.labels[vramfit.io/tenat]",
     "vramfit.io/tenant"),
    (pod(container(vram="1Gi", more={"vramfit.io/gpus": "2"})),
     "spec.containers[0].resources.requests[vramfit.io/gpus]", "vramfit.io/gpu"),
])
def test_a_misspelt_vramfit_key_is_denied_with_the_key_it_meant(served: Served, obj: dict[str, Any], field: str,
                                                                meant: str) -> None:
    assert _sent(obj)  # the API server calls the webhook for it
    response, patch = admit(served, obj)
    assert response["allowed"] is False and patch == [] and response["status"]["code"] == 400
    msg = response["status"]["message"]
    assert f"pod team-a/p: field {field}" in msg and f"did you mean {meant!r}" in msg, msg


_KNOWN_KEYS = {"vramfit.io/vram", "vramfit.io/gpus", "vramfit.io/isolation", "vramfit.io/gpu-models"}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.one_of(st.sampled_from(sorted(_KNOWN_KEYS)),
                     st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=16).map("vramfit.io/".__add__)),
       label=st.booleans())
def test_every_vramfit_key_reaches_the_webhook_and_only_the_known_ones_pass(served: Served, key: str,
                                                                             label: bool) -> None:
    """No spelling of a vramfit key is ignored: it is sent, then read or denied by name."""
    value = {"vramfit.io/vram": "1Gi", "vramfit.io/gpus": "1", "vramfit.io/isolation": "hardware",
             "vramfit.io/gpu-models": "H100-80GB"}.get(key, "x")
    known = (LABEL_TENANT, "vramfit.io/webhook") if label else _KNOWN_KEYS
    obj = pod(container(vram="1Gi"), **({"labels": {key: "team-a"}} if label else {"annotations": {key: value}}))
    assert _sent(obj)
    response, _ = admit(served, obj)
    assert response["allowed"] is (key in known), (key, response)
    if key not in known:
        # vramfit's own records are refused as forbidden (403: only its Binding writes them), any other key as bad
        # input (400)
        code = 403 if key in RECORDS and not label else 400
        assert f"[{key}]" in response["status"]["message"] and response["status"]["code"] == code


@pytest.mark.parametrize(("requests", "limits", "field", "says"), [
    ({VRAM: "14Gi"}, {}, "spec.containers[0].resources.limits[vramfit.io/vram]", "missing"),
    ({VRAM: "14Gi"}, {VRAM: "16Gi"}, "spec.containers[0].resources.requests[vramfit.io/vram]", "differs"),
    ({VRAM: "1Gi", GPU: "1"}, {VRAM: "1Gi"}, "spec.containers[0].resources.limits[vramfit.io/gpu]", "missing"),
])
def test_vramfit_resources_need_a_limit_equal_to_the_request(served: Served, requests: dict[str, str],
                                                             limits: dict[str, str], field: str, says: str) -> None:
    """The API server refuses these with a message that never names vramfit: say it first, and say why."""
    obj = pod({"name": "c", "image": "x", "resources": {"requests": requests, "limits": limits}})
    response, patch = admit(served, obj)
    assert response["allowed"] is False and patch == [] and response["status"]["code"] == 400
    msg = response["status"]["message"]
    assert f"pod team-a/p: field {field}" in msg and says in msg and "extended resource" in msg, msg
    # The same quantity written two ways is equal (the API server compares quantities).
    same = pod({"name": "c", "image": "x", "resources": {"requests": {VRAM: "14Gi"}, "limits": {VRAM: "14336Mi"}}})
    assert admit(served, same)[0]["allowed"] is True


@pytest.mark.parametrize(("models", "allowed", "says"), [
    ("H100-80GB", True, None),
    ("h100-80gb, NVIDIA-A100-SXM4-80GB", True, None),  # a catalog model and a GFD product
    ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", True, None),
    ("H100-80GBB", False, "did you mean 'H100-80GB'"),
    ("H100-80GB,A100", False, "'A100' is neither a GPU model of the catalog nor a GPU product it knows"),
    ("A100", False, "did you mean 'A100-40GB' or 'A100-80GB'"),
    ("NVIDIA-B999", False, "catalog_path"),
])
def test_an_unknown_gpu_model_is_denied_with_the_known_names(served: Served, models: str, allowed: bool,
                                                            says: str | None) -> None:
    response, _ = admit(served, pod(container(vram="1Gi"), annotations={"vramfit.io/gpu-models": models}))
    assert response["allowed"] is allowed, response
    if not allowed:
        msg = response["status"]["message"]
        assert response["status"]["code"] == 400 and says in msg, msg
        assert "field metadata.annotations[vramfit.io/gpu-models]" in msg and "wait forever" in msg


def test_a_gpu_the_catalog_lacks_may_be_named_by_the_product_the_cluster_has() -> None:
    node = json.loads((FIXTURES / "node-a100-gfd.json").read_text())
    node["metadata"]["labels"].update({"nvidia.com/gpu.product": "NVIDIA-B999", "nvidia.com/mig.capable": "false"})
    s = Served()
    try:
        obj = pod(container(vram="1Gi"), annotations={"vramfit.io/gpu-models": "nvidia-b999"})
        assert admit(s, obj)[0]["allowed"] is False
        s.app.state.services.store.replace("nodes", [node])
        assert admit(s, obj)[0]["allowed"] is True
    finally:
        s.close()


# ---- everything else is untouched ----------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [
    pod(container()),
    pod(container(more={"nvidia.com/gpu": "1"})),
    pod(container(more={GPU: "1"})),  # vramfit.io/gpu without VRAM is not a vramfit pod
    pod(container(), annotations={"vramfit.io/isolation": "strong"}),  # not asking for VRAM: not checked
])
def test_other_pods_are_allowed_untouched(served: Served, obj: dict[str, Any]) -> None:
    response, patch = admit(served, obj)
    assert response == {"uid": response["uid"], "allowed": True} and patch == []


@pytest.mark.parametrize(("operation", "kind"), [
    ("UPDATE", None), ("DELETE", None), ("CONNECT", None),
    ("CREATE", {"group": "apps", "version": "v1", "kind": "Deployment"}),
])
def test_other_operations_and_kinds_are_allowed_untouched(served: Served, operation: str,
                                                          kind: dict[str, str] | None) -> None:
    response, patch = admit(served, pod(container(vram="lots")), operation=operation, kind=kind)
    assert response["allowed"] is True and patch == []


def test_mirror_pods_are_left_alone(served: Served) -> None:
    obj = pod(container(vram="1Gi"), annotations={"kubernetes.io/config.mirror": "abc"})
    obj["spec"]["nodeName"] = "n1"
    response, patch = admit(served, obj, user="system:node:n1", groups=("system:nodes", "system:authenticated"))
    assert response["allowed"] is True and patch == []
    # Anyone may write the annotation; only a kubelet's credentials make the pod a mirror.
    response, _ = admit(served, obj)
    assert response["allowed"] is False and "field spec.nodeName" in response["status"]["message"]


# ---- who may write what (README, "Trust model") --------------------------------------------------------------


def forged_probe_pod() -> dict[str, Any]:
    """The probe's pod: no scheduler, no Binding, a hand-written assignment and a vramfit.io/gpu limit only
    (no vramfit.io/vram, which the old matchConditions keyed on)."""
    obj = pod(container(more={GPU: "1"}, requests=False),
              annotations={"vramfit.io/phase": "allocating",
                           "vramfit.io/assignment": '{"gpus": [{"index": 0, "mig": null, "vram_mib": 81920}]}'})
    obj["spec"]["nodeName"] = "gpu-node-1"
    return obj


def test_the_probes_forged_pod_is_denied(served: Served) -> None:
    response, patch = admit(served, forged_probe_pod())
    assert response["allowed"] is False and patch == [] and response["status"]["code"] == 403
    msg = response["status"]["message"]
    assert "pod team-a/p" in msg and "field metadata.annotations[vramfit.io/assignment]" in msg
    assert "only vramfit's Binding writes it" in msg


@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("asks", ["vram", "gpu", "nothing"])
def test_each_record_is_denied_on_any_pod(served: Served, record: str, asks: str) -> None:
    more = {"vram": {VRAM: "1Gi"}, "gpu": {GPU: "1"}, "nothing": {}}[asks]
    obj = pod(container(more=more), annotations={record: "x"})
    response, _ = admit(served, obj)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert f"field metadata.annotations[{record}]: only vramfit's Binding writes it" in response["status"]["message"]
    # A real mirror pod is no exception: no static pod is ever bound by vramfit.
    response, _ = admit(served, obj, user="system:node:n1", groups=("system:nodes",))
    assert response["allowed"] is False


@pytest.mark.parametrize("resources", [{VRAM: "1Gi"}, {GPU: "1"}, {VRAM: "8Gi", GPU: "1"}])
def test_node_name_on_a_gpu_pod_is_denied(served: Served, resources: dict[str, str]) -> None:
    obj = pod(container(more=resources))
    obj["spec"]["nodeName"] = "n1"
    response, patch = admit(served, obj)
    assert response["allowed"] is False and patch == [] and response["status"]["code"] == 403
    assert "field spec.nodeName" in response["status"]["message"]
    # in an init container too
    obj = pod(container(), init=[container("init", more=resources)])
    obj["spec"]["nodeName"] = "n1"
    response, _ = admit(served, obj)
    assert response["allowed"] is False and "field spec.nodeName" in response["status"]["message"]
    # without nodeName the same pod is fine
    response, _ = admit(served, pod(container(more=resources)))
    assert response["allowed"] is True


def test_node_name_on_a_pod_without_vramfit_resources_is_not_the_webhooks_business(served: Served) -> None:
    obj = pod(container(more={"nvidia.com/gpu": "1"}))
    obj["spec"]["nodeName"] = "n1"
    response, patch = admit(served, obj)
    assert response == {"uid": response["uid"], "allowed": True} and patch == []


@pytest.mark.parametrize(("namespace", "tenant", "allowed"), [
    ("evil", "team-a", False),  # the probe: a namespace naming another's tenant
    ("evil", "evil", True),  # its own name
    ("team-a", "team-b", False),
    ("default", "team-search", True),  # listed in allowed-tenants (entries trimmed)
    ("default", "team-recsys", True),
    ("default", "team-a", False),
    ("ml-prod", "team-ml", True),  # the Namespace's label, not its name, is its tenant
    ("ml-prod", "ml-prod", False),
    ("unseen", "team-a", False),  # a namespace without rules allows nothing beyond its own name
    ("unseen", "unseen", True),
])
def test_a_tenant_the_namespace_does_not_allow_is_denied(served: Served, namespace: str, tenant: str,
                                                         allowed: bool) -> None:
    for asks in ({VRAM: "8Gi"}, {GPU: "1"}):
        obj = pod(container(more=asks))
        obj["metadata"].update(namespace=namespace, labels={LABEL_TENANT: tenant})
        response, _ = admit(served, obj, namespace=namespace)
        assert response["allowed"] is allowed, response
        if not allowed:
            msg = response["status"]["message"]
            assert response["status"]["code"] == 403
            assert f"field metadata.labels[{LABEL_TENANT}]" in msg and f"does not allow tenant {tenant!r}" in msg
            assert ANN_ALLOWED_TENANTS in msg


def test_the_tenant_follows_the_namespace_rules_the_store_holds_now() -> None:
    s = Served(namespaces=[])
    try:
        obj = pod(container(vram="1Gi"))
        obj["metadata"].update(namespace="evil", labels={LABEL_TENANT: "team-a"})
        assert admit(s, obj, namespace="evil")[0]["allowed"] is False
        s.app.state.services.store.tenancy = Tenancy.from_objects(
            [{"metadata": {"name": "evil", "annotations": {ANN_ALLOWED_TENANTS: "team-a"}}}])
        assert admit(s, obj, namespace="evil")[0]["allowed"] is True
    finally:
        s.close()


_FORGERY = st.fixed_dictionaries({
    "records": st.lists(st.sampled_from(RECORDS), unique=True, max_size=4),
    "resources": st.sampled_from([{}, {VRAM: "4Gi"}, {GPU: "1"}, {VRAM: "2Gi", GPU: "1"}]),
    "in_init": st.booleans(),
    "node_name": st.sampled_from([None, "", "gpu-node-1"]),
    "namespace": st.sampled_from(["evil", "team-a", "default", "ml-prod"]),
    "tenant": st.sampled_from([None, "", "team-a", "team-search", "team-ml", "evil", "ml-prod"]),
    "mirror": st.sampled_from([None, "forged", "kubelet"]),
})


def _expected_denial(f: dict[str, Any]) -> bool:
    """The rules, written out independently of the webhook's code."""
    allows = {"evil": {"evil"}, "team-a": {"team-a"}, "default": {"default", "team-search", "team-recsys"},
              "ml-prod": {"team-ml"}}[f["namespace"]]
    asks = bool(f["resources"])
    return bool(f["records"]) or (bool(f["node_name"]) and asks and f["mirror"] != "kubelet") \
        or (bool(f["tenant"]) and f["tenant"] not in allows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(f=_FORGERY)
def test_forged_pods_are_denied_exactly_when_they_write_what_is_not_theirs(served: Served, f: dict[str, Any]) -> None:
    c = container(more=f["resources"])
    obj = pod(container(), init=[c]) if f["in_init"] else pod(c)
    annotations = {r: "forged" for r in f["records"]}
    if f["mirror"]:
        annotations["kubernetes.io/config.mirror"] = "abc"
    obj["metadata"].update(namespace=f["namespace"], annotations=annotations)
    if f["tenant"] is not None:
        obj["metadata"]["labels"] = {LABEL_TENANT: f["tenant"]}
    if f["node_name"] is not None:
        obj["spec"]["nodeName"] = f["node_name"]
    who = {"user": "system:node:n1", "groups": ("system:nodes",)} if f["mirror"] == "kubelet" else {}
    response, _ = admit(served, obj, namespace=f["namespace"], **who)
    assert response["allowed"] is not _expected_denial(f), (f, response)
    if not response["allowed"]:
        assert response["status"]["code"] == 403 and "field " in response["status"]["message"]


# ---- warnings -----------------------------------------------------------------------------------------------


def test_warnings(served: Served) -> None:
    response, _ = mutated(served, pod(container(vram="14G")))
    assert any("14G is decimal (13352 MiB); 14Gi would be 14336 MiB" in w for w in response["warnings"])
    response, out = mutated(served, pod(container("main"), init=[container("warmup", "2Gi")]))
    assert gpu_counts(out) == [("1", "1")] and gpu_counts(out, "initContainers") == [(None, None)]
    assert any("spec.initContainers[0]" in w for w in response["warnings"])
    assert any("managedResources" in w for w in response["warnings"])


# ---- the HTTP edge -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "says"), [
    (b"", "empty request body"),
    (b"{not json", "malformed JSON"),
    (b"[]", "expected a JSON object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                 "request": review(None)["request"]}).encode(), "apiVersion"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "request"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "", "kind": {"kind": "Pod"}, "operation": "CREATE"}}).encode(), "uid"),
])
def test_malformed_admission_review_is_http_400(served: Served, body: bytes, says: str) -> None:
    r = served.post(body)
    assert r.status_code == 400 and says in r.json()["Error"]


def test_body_cap_and_prefix_alias() -> None:
    s = Served(max_body_bytes=4096)
    try:
        r = s.post(review(pod(container("x" * 5000, "1Gi"))))
        assert r.status_code == 413
        r = s.post(review(pod(container(vram="1Gi"))), path=f"{PREFIX}/mutate")
        assert r.status_code == 200 and r.json()["response"]["allowed"] is True
        assert s.client.get("/mutate").status_code == 405
    finally:
        s.close()


# ---- manifests -----------------------------------------------------------------------------------------------


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "manifests" / name).read_text()) if d]


WEBHOOK_DOCS = _docs("25-webhook.yaml")
CERT_DOCS = _docs("26-webhook-cert.yaml")


@pytest.mark.parametrize("doc", WEBHOOK_DOCS + CERT_DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_webhook_manifests_validate_strictly(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("cert-manager.io/"):
        # kubernetes-validate ships only Kubernetes' own schemas: it raises SchemaNotFoundError for CRD
        # kinds. Only cert-manager's are skipped; their structure is checked in the test below.
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        pytest.skip(f"{doc['kind']} is a cert-manager CRD kind (no schema in kubernetes-validate)")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{doc['kind']}: {exc.message} at {list(exc.path)}")


def test_strict_validation_catches_a_typo_in_the_webhook() -> None:
    bad = copy.deepcopy(WEBHOOK_DOCS[0])
    bad["webhooks"][0]["matchCondition"] = bad["webhooks"][0].pop("matchConditions")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _all_manifest_docs() -> list[dict[str, Any]]:
    return [d for path in sorted((ROOT / "manifests").glob("*.yaml")) for d in _docs(path.name)]


def test_webhook_configuration_points_at_the_extender() -> None:
    (cfg,) = WEBHOOK_DOCS
    assert cfg["kind"] == "MutatingWebhookConfiguration"
    (hook,) = cfg["webhooks"]
    assert len(hook["name"].split(".")) >= 3  # the API server wants a fully qualified name
    assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Fail" and 1 <= hook["timeoutSeconds"] <= 30
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    svc_ref = hook["clientConfig"]["service"]
    service = next(d for d in _all_manifest_docs() if d["kind"] == "Service" and d["metadata"]["name"] == "vramfit")
    assert (svc_ref["name"], svc_ref["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert svc_ref["port"] in {p["port"] for p in service["spec"]["ports"]}
    assert svc_ref["path"] == "/mutate"  # what add_webhook_routes serves, with or without url_prefix
    excluded = {v for e in hook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
                and e["operator"] == "NotIn" for v in e["values"]}
    assert {"kube-system", "vramfit-system"} <= excluded
    for selector in (hook["namespaceSelector"], hook["objectSelector"]):
        assert {"key": "vramfit.io/webhook", "operator": "NotIn", "values": ["disabled"]} in selector["matchExpressions"]
    (cond,) = hook["matchConditions"]
    for where in ("object.metadata.annotations", "object.spec.containers", "object.spec.initContainers",
                  "c.resources.limits", "c.resources.requests"):
        assert f"has({where})" in cond["expression"]


def _sent(obj: dict[str, Any]) -> bool:
    """Whether the API server calls the webhook for this pod: its matchCondition, evaluated as CEL."""
    (cond,) = WEBHOOK_DOCS[0]["webhooks"][0]["matchConditions"]
    return evaluate(cond["expression"], {"object": obj, "oldObject": None}) is True


@pytest.mark.parametrize(("obj", "sent"), [
    (forged_probe_pod(), True),  # the probe's pod: a record, nodeName and vramfit.io/gpu only
    (pod(container(more={GPU: "1"})), True),
    (pod(container(), init=[container("i", more={GPU: "1"}, limits=False)]), True),
    (pod(container(vram="1Gi", limits=False)), True),
    (pod(container(), annotations={VRAM: "1Gi"}), True),
    *[(pod(container(), annotations={r: "x"}), True) for r in RECORDS],
    (pod(container()), False),
    (pod(container(more={"nvidia.com/gpu": "1"})), False),
    (pod(container(), annotations={"vramfit.io/isolation": "hardware"}), True),
    # a misspelt key alone still reaches the webhook, which names the key it meant
    (pod(container(), annotations={"vramfit.io/vramm": "14Gi"}), True),
    (pod(container(), annotations={"vramfit.io/isolaton": "hardware"}), True),
    (pod(container(), labels={"vramfit.io/tenat": "team-b"}), True),
    (pod(container(more={"vramfit.io/vrma": "1Gi"})), True),
    (pod(container(), init=[container("i", more={"vramfit.io/gpus": "1"}, requests=False)]), True),
    (pod(container(), annotations={"example.com/vramfit.io": "x"}, labels={"vramfit": "x"}), False),
    ({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}, False),
    ({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x", "resources": {}}]}}, False),
])
def test_match_conditions_send_every_pod_the_webhook_judges(obj: dict[str, Any], sent: bool) -> None:
    assert _sent(obj) is sent


@settings(max_examples=100, deadline=None)
@given(f=_FORGERY)
def test_match_conditions_send_every_forged_pod(f: dict[str, Any]) -> None:
    """Every pod the webhook would deny for a record or a node name reaches it (the tenant label alone is the
    ValidatingAdmissionPolicy's: a pod without vramfit resources never shares a GPU)."""
    c = container(more=f["resources"])
    obj = pod(container(), init=[c]) if f["in_init"] else pod(c)
    obj["metadata"]["annotations"] = {r: "forged" for r in f["records"]}
    assert _sent(obj) is bool(f["records"] or f["resources"])


def test_cert_manager_objects_fit_together() -> None:
    (cfg,) = WEBHOOK_DOCS
    ns, cert_name = cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for d in CERT_DOCS:
        assert d["apiVersion"] == "cert-manager.io/v1" and d["metadata"]["namespace"] == ns == "vramfit-system"
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    serving = by_kind["Certificate"][cert_name]["spec"]
    hook_service = cfg["webhooks"][0]["clientConfig"]["service"]
    assert f"{hook_service['name']}.{hook_service['namespace']}.svc" in serving["dnsNames"]
    assert "server auth" in serving["usages"]
    # Every issuerRef resolves, and the chain ends in a self-signed issuer.
    issuer = by_kind["Issuer"][serving["issuerRef"]["name"]]
    assert serving["issuerRef"]["kind"] == "Issuer"
    ca_cert = next(c for c in by_kind["Certificate"].values() if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"])
    assert ca_cert["spec"]["isCA"] is True
    assert "selfSigned" in by_kind["Issuer"][ca_cert["spec"]["issuerRef"]["name"]]["spec"]


# ---- TLS: the README's openssl bootstrap, served and verified as the API server would --------------------------


def _sh(*args: str, cwd: Path) -> None:
    subprocess.run(list(args), cwd=cwd, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")
def test_self_signed_bootstrap_serves_the_webhook_over_verified_tls(tmp_path: Path) -> None:
    # The commands of manifests/README.md "Admission webhook" -> "Without cert-manager" (days shortened).
    d = tmp_path
    _sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=vramfit-webhook-ca", cwd=d)
    _sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=vramfit.vramfit-system.svc", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:vramfit.vramfit-system.svc,DNS:vramfit.vramfit-system.svc.cluster.local\n"
                               "extendedKeyUsage=serverAuth\n")
    _sh("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", "san.ext", "-out", "tls.crt", cwd=d)
    app = create_app(Settings(), Store.from_objects([], load_catalog()), MemoryBinder())
    with LocalServer(app, ssl_certfile=str(d / "tls.crt"), ssl_keyfile=str(d / "tls.key")) as server:
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))  # caBundle: the CA only
        with httpx.Client(verify=ctx) as c:
            # The API server dials the Service IP and checks the certificate for <service>.<namespace>.svc.
            r = c.post(f"{server.url}/mutate", json=review(pod(container(vram="1Gi"))),
                       extensions={"sni_hostname": "vramfit.vramfit-system.svc"})
            assert r.status_code == 200 and r.json()["response"]["allowed"] is True
        # A name the certificate does not carry is refused (a new client: the first reuses its connection).
        with httpx.Client(verify=ctx) as c, pytest.raises(httpx.ConnectError, match="certificate"):
            c.post(f"{server.url}/mutate", json=review(pod()), extensions={"sni_hostname": "vramfit.other.svc"})


def test_more_gpu_containers_than_the_node_has_tickets_for_each_is_denied_at_admission(served: Served) -> None:
    """Each container asking for vramfit.io/gpu takes its own tickets on the node (nodeagent.devices): a pod with
    more than MAX_GPU_CONTAINERS of them would be refused by the node agent only after it was created."""
    from packing.k8s.pod_keys import MAX_GPU_CONTAINERS

    most = pod(*[container(f"c{i}", vram="1024") for i in range(MAX_GPU_CONTAINERS)])
    response, patch = admit(served, most)
    assert response["allowed"] is True
    assert len({op["path"].split("/")[3] for op in patch if op["path"].startswith("/spec/containers/")}) == 8
    init = [{"name": "warm", "image": "busybox", "resources": {"limits": {"vramfit.io/gpu": "1"}}}]
    crowd = pod(*[container(f"c{i}", vram="1024") for i in range(MAX_GPU_CONTAINERS)], init=init)
    response, _ = admit(served, crowd)
    assert response["allowed"] is False
    assert f"{MAX_GPU_CONTAINERS + 1} containers would ask for vramfit.io/gpu" in response["status"]["message"]
