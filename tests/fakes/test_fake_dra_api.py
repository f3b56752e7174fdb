"""The fake API server's resource.k8s.io/v1 and scheduling-gate rules, over HTTP with the official client."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as kclient
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from fakes import dra_api
from fakes.apiserver import FakeApiServer
from fakes.dra_controllers import (
    SchedulerEmulator,
    Unschedulable,
    claim_generate_name,
    create_template_claims,
    status_body,
)
from fakes.dra_schema import SchemaError, validate_object

DRA_MD = Path("/work/shared/reference/dra.md")
FINALIZER = "resource.kubernetes.io/delete-protection"
MERGE = "application/merge-patch+json"
SHARE = "5f0c2a9e-3d41-4b8a-9e67-1c2d3e4f5a6b"


def claim(name: str = "chat", namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {"name": "alt", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"}]}]}}}


def allocation(node: str = "node-a", request: str = "gpu", **result: Any) -> dict[str, Any]:
    res = {"request": request, "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-1", "shareID": SHARE,
           "consumedCapacity": {"memory": "14Gi"}, **result}
    return {"devices": {"results": [res]},
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


@pytest.fixture
def fake(fake_api: Callable[..., FakeApiServer]) -> FakeApiServer:
    return fake_api(nodes=[{"metadata": {"name": "node-a", "labels": {"zone": "z1"}}},
                           {"metadata": {"name": "node-b"}}])


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[kclient.ApiClient]:
    cfg = kclient.Configuration()
    cfg.host = fake.url
    with kclient.ApiClient(cfg) as client:
        yield client


def plain(api: kclient.ApiClient, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


def refused(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status), status_body(info.value)


def write_status(api: kclient.ApiClient, name: str, status: dict[str, Any], ns: str = "team-a") -> Any:
    rapi = kclient.ResourceV1Api(api)
    body = plain(api, rapi.read_namespaced_resource_claim(name, ns))
    body["status"] = status
    return rapi.replace_namespaced_resource_claim_status(name, ns, body)


# ---- kinds ------------------------------------------------------------------------------------------------


def test_create_list_get_delete_and_field_selectors(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    for node, driver in (("node-a", "gpu.nvidia.com"), ("node-b", "other.example.com")):
        rapi.create_resource_slice({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                    "metadata": {"generateName": f"{node}-{driver}-"},
                                    "spec": {"driver": driver, "nodeName": node,
                                             "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}})
    names = [s.metadata.name for s in rapi.list_resource_slice(field_selector="spec.nodeName=node-a").items]
    assert len(names) == 1 and re.fullmatch(r"node-a-gpu\.nvidia\.com-[bcdfghjklmnpqrstvwxz2456789]{5}", names[0])
    assert [s.spec.driver for s in rapi.list_resource_slice(field_selector="spec.driver!=gpu.nvidia.com").items] \
        == ["other.example.com"]
    fake.add_device_class({"metadata": {"name": "gpu.nvidia.com"}, "spec": {}})
    assert rapi.read_device_class("gpu.nvidia.com").kind == "DeviceClass"
    created = rapi.create_namespaced_resource_claim("team-a", {**claim(), "status": {"reservedFor": [
        {"resource": "pods", "name": "x", "uid": "u"}]}})
    assert created.status is None  # dropped on create
    assert created.spec.devices.requests[0].exactly.count == 1  # defaulted
    assert [c.metadata.name for c in rapi.list_resource_claim_for_all_namespaces().items] == ["chat"]
    assert refused(lambda: rapi.create_namespaced_resource_claim("team-a", claim()))[0] == 409
    code, body = refused(lambda: rapi.read_namespaced_resource_claim("nope", "team-a"))
    assert code == 404 and body["message"] == 'resourceclaims.resource.k8s.io "nope" not found'
    rapi.delete_namespaced_resource_claim("chat", "team-a")
    assert fake.get_claim("team-a", "chat") is None


def test_delete_with_finalizer_marks_then_removes_when_finalizer_goes(fake: FakeApiServer,
                                                                      api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    fake.add_claim({**claim(), "metadata": {**claim()["metadata"], "finalizers": [FINALIZER]}})
    rapi.delete_namespaced_resource_claim("chat", "team-a")
    marked = fake.get_claim("team-a", "chat")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    body = plain(api, rapi.read_namespaced_resource_claim("chat", "team-a"))
    body["metadata"]["finalizers"] = [FINALIZER, "other/one"]
    code, out = refused(lambda: rapi.replace_namespaced_resource_claim("chat", "team-a", body))
    assert code == 422 and "no new finalizers can be added if the object is being deleted" in out["message"]
    body["metadata"]["finalizers"] = []
    rapi.replace_namespaced_resource_claim("chat", "team-a", body)
    assert fake.get_claim("team-a", "chat") is None


# ---- plain update -------------------------------------------------------------------------------------------


def test_plain_update_takes_metadata_ignores_status_keeps_spec(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    fake.add_claim(claim())
    body = plain(api, rapi.read_namespaced_resource_claim("chat", "team-a"))
    body["metadata"]["finalizers"] = [FINALIZER]
    body["metadata"]["labels"] = {"a": "b"}
    body["status"] = {"allocation": allocation()}
    out = rapi.replace_namespaced_resource_claim("chat", "team-a", body)
    assert out.metadata.finalizers == [FINALIZER] and out.metadata.labels == {"a": "b"} and out.status is None
    # The same body again carries a stale resourceVersion.
    code, err = refused(lambda: rapi.replace_namespaced_resource_claim("chat", "team-a", body))
    assert code == 409 and err["reason"] == "Conflict"
    assert err["message"] == ('Operation cannot be fulfilled on resourceclaims.resource.k8s.io "chat": the object '
                              "has been modified; please apply your changes to the latest version and try again")
    fresh = plain(api, out)
    fresh["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    code, err = refused(lambda: rapi.replace_namespaced_resource_claim("chat", "team-a", fresh))
    assert code == 422 and err["reason"] == "Invalid"
    assert err["details"]["causes"][0]["field"] == "spec" and err["message"].endswith("field is immutable")


def test_finalizer_only_via_plain_update(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    fake.add_claim(claim())
    out = rapi.patch_namespaced_resource_claim_status(
        "chat", "team-a", {"metadata": {"finalizers": [FINALIZER], "labels": {"x": "y"}},
                           "status": {"allocation": allocation()}}, _content_type=MERGE)
    assert out.metadata.finalizers is None and out.metadata.labels is None
    assert out.status.allocation.devices.results[0].device == "gpu-1"
    out = rapi.patch_namespaced_resource_claim("chat", "team-a", {"metadata": {"finalizers": [FINALIZER]}},
                                               _content_type=MERGE)
    assert out.metadata.finalizers == [FINALIZER] and out.status.allocation is not None


# ---- status update ------------------------------------------------------------------------------------------


def test_status_update_rules(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    fake.add_claim(claim())
    ref = {"resource": "pods", "name": "p", "uid": "u1"}
    code, err = refused(lambda: write_status(api, "chat", {"reservedFor": [ref]}))
    assert code == 422 and err["message"] == ('ResourceClaim.resource.k8s.io "chat" is invalid: status.reservedFor: '
                                              "Forbidden: may not be specified when `allocated` is not set")
    write_status(api, "chat", {"allocation": allocation(), "reservedFor": [ref]})
    other = allocation(node="node-b")
    code, err = refused(lambda: write_status(api, "chat", {"allocation": other, "reservedFor": [ref]}))
    assert code == 422 and err["details"]["causes"][0]["field"] == "status.allocation"
    assert re.fullmatch(r'ResourceClaim\.resource\.k8s\.io "chat" is invalid: status\.allocation: Invalid value: '
                        r"\{.*\}: field is immutable", err["message"])
    # Clearing is allowed (reservedFor must go with it).
    out = write_status(api, "chat", {})
    assert out.status is None or out.status.allocation is None


def test_status_write_resets_metadata_to_storage(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    """ResetObjectMetaForStatus (apimachinery meta/v1 helpers.go): generation, labels, annotations, finalizers
    and ownerReferences of a status write are the stored ones."""
    fake.add_claim(claim())
    rapi = kclient.ResourceV1Api(api)
    body = plain(api, rapi.read_namespaced_resource_claim("chat", "team-a"))
    body["metadata"].update(generation=7, labels={"a": "b"}, annotations={"c": "d"}, finalizers=["x/y"])
    body["status"] = {"allocation": allocation()}
    rapi.replace_namespaced_resource_claim_status("chat", "team-a", body)
    meta = (fake.get_claim("team-a", "chat") or {})["metadata"]
    assert not {"generation", "labels", "annotations", "finalizers"} & set(meta)


def test_stale_status_write_conflicts(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    fake.add_claim(claim())
    body = plain(api, rapi.read_namespaced_resource_claim("chat", "team-a"))
    body["status"] = {"allocation": allocation()}
    rapi.replace_namespaced_resource_claim_status("chat", "team-a", body)
    code, err = refused(lambda: rapi.replace_namespaced_resource_claim_status("chat", "team-a", body))
    assert code == 409 and "the object has been modified" in err["message"]
    stale = {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]}, "status": {"reservedFor": []}}
    assert refused(lambda: rapi.patch_namespaced_resource_claim_status("chat", "team-a", stale,
                                                                       _content_type=MERGE))[0] == 409


def test_reserved_for_cannot_grow_after_deletion(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    ref = {"resource": "pods", "name": "p", "uid": "u1"}
    fake.add_claim({**claim(), "metadata": {**claim()["metadata"], "finalizers": [FINALIZER]},
                    "status": {"allocation": allocation(), "reservedFor": [ref]}})
    fake.delete_claim("team-a", "chat")
    new = {"resource": "pods", "name": "q", "uid": "u2"}
    code, err = refused(lambda: write_status(api, "chat", {"allocation": allocation(), "reservedFor": [ref, new]}))
    assert code == 422 and "new entries may not be added while `deallocationRequested` or `deletionTimestamp` " \
                          "are set" in err["message"]
    write_status(api, "chat", {"allocation": allocation(), "reservedFor": []})  # shrinking is fine


@pytest.mark.parametrize(("result", "field", "detail"), [
    ({"shareID": SHARE.upper()}, "shareID", "uid must be in RFC 4122 normalized form"),
    ({"shareID": "nope"}, "shareID", "error validating uid: invalid UUID length: 4"),
    ({"request": "missing"}, "request", "must be the name of a request in the claim"),
    ({"request": "alt/none"}, "request", "must be the name of a request in the claim"),
    ({"driver": "GPU_driver"}, "driver", "a lowercase RFC 1123 subdomain"),
    ({"pool": "Node A"}, "pool", "a lowercase RFC 1123 subdomain"),
    ({"device": "gpu.1"}, "device", "a lowercase RFC 1123 label"),
])
def test_new_allocation_is_validated(fake: FakeApiServer, api: kclient.ApiClient, result: dict[str, Any],
                                     field: str, detail: str) -> None:
    fake.add_claim(claim())
    code, err = refused(lambda: write_status(api, "chat", {"allocation": allocation(**result)}))
    assert code == 422 and err["reason"] == "Invalid"
    causes = err["details"]["causes"]
    assert any(c["field"] == f"status.allocation.devices.results[0].{field}" and detail in c["message"]
               for c in causes), causes


def test_subrequest_and_limits(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    fake.add_claim(claim())
    fake.add_claim(claim("other"))
    write_status(api, "chat", {"allocation": allocation(request="alt/big")})
    many = allocation()
    many["devices"]["results"] = [dict(many["devices"]["results"][0], device=f"gpu-{i}") for i in range(33)]
    code, err = refused(lambda: write_status(api, "other", {"allocation": many}))
    assert "status.allocation.devices.results: Too many: 33: must have at most 32 items" in err["message"]
    bad = allocation()
    bad["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.labels", "operator": "In",
                                                                   "values": ["a", "b"]}]}]}
    code, err = refused(lambda: write_status(api, "other", {"allocation": bad}))
    fields = {c["field"] for c in err["details"]["causes"]}
    assert fields == {"status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values",
                      "status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].key"}


@given(st.text(alphabet="0123456789abcdefABCDEF-xyz", min_size=0, max_size=40))
def test_share_id_accepted_only_in_normalized_form(text: str) -> None:
    from fakes.dra_api import share_id

    normalized = re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", text) is not None
    assert (share_id(text, "f") == []) == normalized


# ---- watches ------------------------------------------------------------------------------------------------


def test_claim_watch_events(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    rapi = kclient.ResourceV1Api(api)
    fake.add_claim({**claim(), "metadata": {**claim()["metadata"], "finalizers": [FINALIZER]}})
    rv = rapi.list_resource_claim_for_all_namespaces().metadata.resource_version
    write_status(api, "chat", {"allocation": allocation()})
    write_status(api, "chat", {"allocation": allocation()})  # no change: no event
    fake.delete_claim("team-a", "chat")
    rapi.patch_namespaced_resource_claim("chat", "team-a", {"metadata": {"finalizers": None}}, _content_type=MERGE)
    w = watch.Watch(return_type="ResourceV1ResourceClaim")
    events = [(e["type"], e["object"]) for e in w.stream(rapi.list_resource_claim_for_all_namespaces,
                                                         resource_version=rv, timeout_seconds=1)]
    assert [t for t, _ in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert events[0][1].status.allocation is not None and events[1][1].metadata.deletion_timestamp is not None


# ---- pods: scheduling gates -----------------------------------------------------------------------------------


def gated_pod(name: str = "p", gates: tuple[str, ...] = ("vramfit.io/allocate",)) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"schedulingGates": [{"name": g} for g in gates],
                     "containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}]}}


def test_gates_only_removable_and_other_spec_changes_refused(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    core = kclient.CoreV1Api(api)
    pod = core.create_namespaced_pod("team-a", gated_pod(gates=("a", "b")))
    cond = pod.status.conditions[0]
    assert (cond.type, cond.status, cond.reason) == ("PodScheduled", "False", "SchedulingGated")
    code, err = refused(lambda: core.patch_namespaced_pod(
        "p", "team-a", {"spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}, {"name": "x"}]}},
        _content_type=MERGE))
    assert code == 422 and err["message"] == ('Pod "p" is invalid: spec.schedulingGates[2].name: Forbidden: only '
                                              "deletion is allowed, but found new scheduling gate 'x'")
    body = plain(api, core.read_namespaced_pod("p", "team-a"))
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    code, err = refused(lambda: core.replace_namespaced_pod("p", "team-a", body))
    assert code == 422 and err["details"]["causes"][0]["field"] == "spec"
    assert err["message"].startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change fields '
                                     "other than `spec.containers[*].image`")
    code, _ = refused(lambda: core.patch_namespaced_pod("p", "team-a", {"spec": {"nodeName": "node-a"}},
                                                        _content_type=MERGE))
    assert code == 422
    # Strategic merge deletes one gate by name; JSON patch removes the rest.
    out = core.patch_namespaced_pod("p", "team-a", {"spec": {"schedulingGates": [{"$patch": "delete", "name": "a"}]}},
                                    _content_type="application/strategic-merge-patch+json")
    assert [g.name for g in out.spec.scheduling_gates] == ["b"]
    out = core.patch_namespaced_pod("p", "team-a", [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert out.spec.scheduling_gates is None


def test_gated_binding_is_refused_as_pod_storage_does(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    core = kclient.CoreV1Api(api)
    core.create_namespaced_pod("team-a", gated_pod())
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-a"}}
    code, err = refused(lambda: core.create_namespaced_pod_binding("p", "team-a", binding, _preload_content=False))
    assert code == 409 and err["message"] == ('Operation cannot be fulfilled on pods/binding "p": pod p has '
                                              "non-empty .spec.schedulingGates")
    core.patch_namespaced_pod("p", "team-a", {"spec": {"schedulingGates": None}}, _content_type=MERGE)
    core.create_namespaced_pod_binding("p", "team-a", binding, _preload_content=False)
    assert fake.get_pod("team-a", "p")["spec"]["nodeName"] == "node-a"  # type: ignore[index]


# ---- emulators ------------------------------------------------------------------------------------------------


def template_pod(name: str, claim_name: str = "gpu") -> dict[str, Any]:
    pod = gated_pod(name)
    pod["spec"]["resourceClaims"] = [{"name": claim_name, "resourceClaimTemplateName": "one-gpu"}]
    return pod


def test_claim_controller_template_step(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    fake.add_claim_template({"metadata": {"name": "one-gpu", "namespace": "team-a"},
                             "spec": {"metadata": {"labels": {"app": "chat"}}, "spec": claim()["spec"]}})
    pod = fake.add_pod(template_pod("chat-0"))
    statuses = create_template_claims(api, "team-a", "chat-0")
    assert statuses == create_template_claims(api, "team-a", "chat-0")  # idempotent: no second claim
    (status,) = statuses
    made = fake.get_claim("team-a", status["resourceClaimName"])
    assert made is not None and made["metadata"]["name"].startswith("chat-0-gpu-")
    assert made["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "chat-0",
                                                    "uid": pod["metadata"]["uid"], "controller": True,
                                                    "blockOwnerDeletion": True}]
    assert made["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    assert made["metadata"]["labels"] == {"app": "chat"} and "status" not in made
    assert fake.get_pod("team-a", "chat-0")["status"]["resourceClaimStatuses"] == statuses  # type: ignore[index]
    validate_object(made)


@given(st.text("abc-", min_size=1, max_size=70), st.text("xyz-", min_size=1, max_size=70))
def test_generate_name_base_fits(pod_name: str, claim_name: str) -> None:
    base = claim_generate_name(pod_name, claim_name)
    assert len(base) <= 57
    if len(pod_name) + len(claim_name) + 2 <= 57:
        assert base == f"{pod_name}-{claim_name}-"


def test_scheduler_emulator_reserves_then_binds(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    fake.add_claim({**claim(), "metadata": {**claim()["metadata"], "finalizers": [FINALIZER]},
                    "status": {"allocation": allocation()}})
    pod = gated_pod("chat-0")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "chat"}]
    added = fake.add_pod(pod)
    sched = SchedulerEmulator(api)
    with pytest.raises(Unschedulable, match="scheduling gates"):
        sched.schedule("team-a", "chat-0", "node-a")
    fake.patch_pod("team-a", "chat-0", {"spec": {"schedulingGates": None}})
    with pytest.raises(Unschedulable, match="resourceclaim not available on the node"):
        sched.schedule("team-a", "chat-0", "node-b")
    sched.schedule("team-a", "chat-0", "node-a")
    stored = fake.get_claim("team-a", "chat")
    assert stored is not None
    assert stored["status"]["reservedFor"] == [{"resource": "pods", "name": "chat-0",
                                                "uid": added["metadata"]["uid"]}]
    assert fake.get_pod("team-a", "chat-0")["spec"]["nodeName"] == "node-a"  # type: ignore[index]
    validate_object(stored)


def test_scheduler_prebind_retries_on_conflict(fake: FakeApiServer, api: kclient.ApiClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add_claim({**claim(), "status": {"allocation": allocation()}})
    pod = gated_pod("chat-0", gates=())
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "chat"}]
    fake.add_pod(pod)
    writes = {"n": 0}
    real_update = dra_api.update_claim

    def interfere(fake_: FakeApiServer, namespace: str, name: str, body: dict[str, Any], status_only: bool) -> Any:
        # The first status write meets a claim another writer changed after the emulator read it.
        if status_only and writes["n"] == 0:
            writes["n"] += 1
            fake.patch_claim("team-a", "chat", {"metadata": {"labels": {"bumped": "1"}}})
        return real_update(fake_, namespace, name, body, status_only)

    monkeypatch.setattr(dra_api, "update_claim", interfere)
    SchedulerEmulator(api).schedule("team-a", "chat-0", "node-a")
    puts = [r for r in fake.requests if r.method == "PUT" and r.path.endswith("/status")]
    assert len(puts) == 2 and writes["n"] == 1
    assert len(fake.get_claim("team-a", "chat")["status"]["reservedFor"]) == 1  # type: ignore[index]


def test_postfilter_deallocates(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    fake.add_claim({**claim(), "status": {"allocation": allocation(), "reservedFor": [
        {"resource": "pods", "name": "chat-0", "uid": "u1"}], "devices": [
        {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1", "shareID": SHARE}]}})
    sched = SchedulerEmulator(api)
    assert sched.deallocate("team-a", "chat", "someone-else") is False
    assert sched.deallocate("team-a", "chat", "u1") is True
    stored = fake.get_claim("team-a", "chat")
    assert stored is not None and "status" not in stored


# ---- schema ---------------------------------------------------------------------------------------------------


def dra_md_examples() -> list[dict[str, Any]]:
    text = DRA_MD.read_text()
    section = text[text.index("## 10."):]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


@pytest.mark.skipif(not DRA_MD.exists(), reason="the shared DRA reference is not on this machine")
def test_dra_md_examples_validate_and_round_trip_the_fake(fake: FakeApiServer, api: kclient.ApiClient) -> None:
    docs = dra_md_examples()
    assert {d["kind"] for d in docs} == {"ResourceSlice", "DeviceClass", "ResourceClaim"} and len(docs) == 5
    for doc in docs:
        validate_object(doc)
    allocated = docs[-1]
    fake.add_namespace("team-a")
    rapi = kclient.ResourceV1Api(api)
    rapi.create_namespaced_resource_claim("team-a", {k: v for k, v in allocated.items() if k != "status"})
    write_status(api, "chat-14gi", {"allocation": allocated["status"]["allocation"]})
    validate_object(plain(api, rapi.read_namespaced_resource_claim("chat-14gi", "team-a")))


def test_schema_rejects_unknown_fields() -> None:
    with pytest.raises(SchemaError, match="bogus"):
        validate_object({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
                         "spec": {"bogus": 1}})
    with pytest.raises(SchemaError):
        validate_object(json.loads(json.dumps({**claim(), "status": {"allocation": {"devices": {"results": [
            {"request": "gpu"}]}}}})))
