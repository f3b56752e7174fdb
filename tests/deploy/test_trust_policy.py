"""The ValidatingAdmissionPolicy vramfit-trust (manifests/27-trust-policy.yaml, from the chart): every CEL
expression compiles and runs without error on pod objects as the API server hands them over, and it allows or
denies the probe's cases (issue 26) and the rules of README's "Trust model", on CREATE and UPDATE, and only
vramfit removes the DRA scheduling gate vramfit.io/allocate."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_cel import Outcome, compile_program, request, run_policy

ROOT = Path(__file__).resolve().parents[2]
DOCS = [d for d in yaml.safe_load_all((ROOT / "manifests" / "27-trust-policy.yaml").read_text()) if d]
POLICY = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
EXTENDER = "system:serviceaccount:vramfit-system:vramfit"
RECORDS = ("vramfit.io/assignment", "vramfit.io/phase", "vramfit.io/bound-at", "vramfit.io/assignment-signature")
ASSIGNMENT = '{"gpus": [{"index": 0, "mig": "1g.10gb@0", "vram_mib": 9856}]}'


def namespace(name: str, tenant: str | None = None, allowed: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/metadata.name": name}}
    if tenant is not None:
        meta["labels"]["vramfit.io/tenant"] = tenant
    if allowed is not None:
        meta["annotations"] = {"vramfit.io/allowed-tenants": allowed}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def pod(ns: str = "team-a", *, resources: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, node: str | None = None, init: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "busybox"}
    if resources is not None:
        c["resources"] = {"limits": dict(resources)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}, c] if not init else
                            [{"name": "main", "image": "busybox"}], "schedulerName": "vramfit-scheduler"}
    if init:
        spec["initContainers"] = [c]
    if node is not None:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": "p", "namespace": ns, "uid": "9f1c0e52-6f7e-4d8a-b1f1-3c2b0a9e7d10"}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def create(obj: dict[str, Any], ns: dict[str, Any] | None = None, **user: Any) -> Outcome:
    name = obj["metadata"]["namespace"]
    return run_policy(POLICY, obj=obj, old=None, req=request("CREATE", namespace=name, **user),
                      namespace=ns or namespace(name))


def update(old: dict[str, Any], new: dict[str, Any], ns: dict[str, Any] | None = None, **user: Any) -> Outcome:
    name = new["metadata"]["namespace"]
    return run_policy(POLICY, obj=new, old=old, req=request("UPDATE", namespace=name, **user),
                      namespace=ns or namespace(name))


def bound(ns: str = "team-a", **kw: Any) -> dict[str, Any]:
    """A pod as vramfit's Binding left it: node, assignment, phase, bound-at and signature."""
    obj = pod(ns, resources={"vramfit.io/vram": "8Gi", "vramfit.io/gpu": "1"}, node="gpu-1", **kw)
    obj["metadata"]["annotations"] = {**obj["metadata"].get("annotations", {}), "vramfit.io/assignment": ASSIGNMENT,
                                      "vramfit.io/phase": "allocating", "vramfit.io/bound-at": "2026-05-04T10:02:11Z",
                                      "vramfit.io/assignment-signature": "v1:" + "ab" * 32}
    obj["status"] = {"phase": "Running"}
    return obj


# ---- the expressions -----------------------------------------------------------------------------------------


def _expressions() -> list[tuple[str, str]]:
    spec = POLICY["spec"]
    out = [(f"matchConditions[{c['name']}]", c["expression"]) for c in spec["matchConditions"]]
    out += [(f"variables[{v['name']}]", v["expression"]) for v in spec["variables"]]
    for i, rule in enumerate(spec["validations"]):
        out.append((f"validations[{i}]", rule["expression"]))
        if "messageExpression" in rule:
            out.append((f"validations[{i}].messageExpression", rule["messageExpression"]))
    return out


@pytest.mark.parametrize(("where", "expression"), _expressions(), ids=[w for w, _ in _expressions()])
def test_every_expression_compiles(where: str, expression: str) -> None:
    compile_program(expression)


def test_the_policy_covers_every_pod_create_and_update() -> None:
    spec = POLICY["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE"] and rule["resources"] == ["pods", "pods/status"]
    assert "namespaceSelector" not in spec["matchConstraints"]  # no namespace is exempt
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": POLICY["metadata"]["name"], "validationActions": ["Deny"]}
    assert all("\n" not in rule.get("message", "") for rule in spec["validations"])  # the API server refuses them


# ---- the probe's cases ---------------------------------------------------------------------------------------


def test_the_probes_forged_pod_is_denied() -> None:
    """spec.nodeName set, phase allocating, a hand-written assignment, vramfit.io/gpu: 1 and no VRAM."""
    forged = pod(resources={"vramfit.io/gpu": "1"}, node="gpu-1",
                 annotations={"vramfit.io/phase": "allocating", "vramfit.io/assignment": ASSIGNMENT})
    out = create(forged)
    assert out.matched and len(out.denied) == 2
    assert out.denied[0].startswith("metadata.annotations[vramfit.io/assignment]: only vramfit's Binding writes it")
    assert out.denied[1].startswith("spec.nodeName:")


def test_the_owner_of_a_running_pod_cannot_edit_its_assignment() -> None:
    running = bound()
    edited = copy.deepcopy(running)
    edited["metadata"]["annotations"]["vramfit.io/assignment"] = '{"gpus": [{"index": 3, "mig": null, "vram_mib": 81920}]}'
    out = update(running, edited)
    assert out.denied == ["metadata.annotations[vramfit.io/assignment]: only vramfit's Binding writes it; it may not "
                          "be added, changed or removed"]
    assert update(running, edited, username=EXTENDER).denied == []


def test_a_pod_of_namespace_evil_cannot_join_team_a() -> None:
    out = create(pod("evil", resources={"vramfit.io/vram": "4Gi"}, labels={"vramfit.io/tenant": "team-a"}))
    assert out.denied == ["metadata.labels[vramfit.io/tenant]: namespace evil does not allow tenant team-a (it "
                          "allows: evil); a cluster admin adds tenants with the Namespace annotation "
                          "vramfit.io/allowed-tenants"]


# ---- records -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", RECORDS)
def test_each_record_is_denied_at_create_on_any_pod(record: str) -> None:
    for resources in (None, {"vramfit.io/gpu": "1"}, {"cpu": "1"}):
        out = create(pod(resources=resources, annotations={record: "x"}))
        assert out.matched and out.denied == [f"metadata.annotations[{record}]: only vramfit's Binding writes it; "
                                              f"remove it from the pod"]
    # the extender never creates pods, and a kubelet's mirror pod is no exception either
    assert create(pod(annotations={record: "x"}), username=EXTENDER).denied
    assert create(pod(annotations={record: "x", "kubernetes.io/config.mirror": "h"}), username="system:node:n1",
                  groups=("system:nodes",)).denied


@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("change", ["add", "edit", "remove"])
def test_records_may_not_change_on_update_but_by_the_extender(record: str, change: str) -> None:
    old = bound()
    if change == "add":
        del old["metadata"]["annotations"][record]
    new = copy.deepcopy(old)
    if change == "remove":
        del new["metadata"]["annotations"][record]
    else:
        new["metadata"]["annotations"][record] = "forged"
    assert update(old, new).denied == [f"metadata.annotations[{record}]: only vramfit's Binding writes it; it may "
                                       f"not be added, changed or removed"]
    assert update(old, new, username="system:node:gpu-1", groups=("system:nodes",)).denied  # pods/status too
    assert update(old, new, username=EXTENDER).denied == []


def test_updates_that_leave_the_records_alone_are_allowed() -> None:
    old = bound()
    new = copy.deepcopy(old)
    new["status"] = {"phase": "Running", "startTime": "2026-05-04T10:02:15Z"}  # the kubelet's status update
    new["metadata"]["labels"] = {"app": "llm"}
    new["metadata"]["annotations"]["note"] = "anything else"
    assert update(old, new, username="system:node:gpu-1", groups=("system:nodes",)) == Outcome(True, [])
    # every annotation removed from a pod that had records: a removal
    bare = copy.deepcopy(old)
    del bare["metadata"]["annotations"]
    assert len(update(old, bare).denied) == 1


# ---- spec.nodeName -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resources", [{"vramfit.io/gpu": "1"}, {"vramfit.io/vram": "8Gi"}])
@pytest.mark.parametrize("init", [False, True])
def test_node_name_at_create_is_denied_on_gpu_pods(resources: dict[str, str], init: bool) -> None:
    out = create(pod(resources=resources, node="gpu-1", init=init))
    assert out.denied == ["spec.nodeName: a pod asking for vramfit.io/gpu or vramfit.io/vram may not name its "
                          "node; vramfit's scheduler binds it"]
    assert create(pod(resources=resources, init=init)).denied == []
    # the kubelet's mirror of a static pod (created by a node) is exempt; the annotation alone is not enough
    mirror = pod(resources=resources, node="gpu-1", init=init, annotations={"kubernetes.io/config.mirror": "h"})
    assert create(mirror, username="system:node:gpu-1", groups=("system:nodes", "system:authenticated")).denied == []
    assert create(mirror).denied


def test_node_name_on_other_pods_is_not_matched() -> None:
    assert create(pod(resources={"nvidia.com/gpu": "1"}, node="gpu-1")) == Outcome(False, [])
    assert create(pod(node="gpu-1")) == Outcome(False, [])


def test_the_vram_annotation_alone_asks_for_gpus() -> None:
    assert create(pod(node="n", annotations={"vramfit.io/vram": "1Gi"})).denied[0].startswith("spec.nodeName")


# ---- tenants -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ns", "tenant", "allowed"), [
    (namespace("evil"), "team-a", False),
    (namespace("evil"), "evil", True),
    (namespace("evil"), "", True),  # an empty label: the namespace's own tenant
    (namespace("ml-prod", tenant="team-ml"), "team-ml", True),  # the Namespace's label is its tenant
    (namespace("ml-prod", tenant="team-ml"), "ml-prod", False),
    (namespace("ml-prod", tenant=""), "ml-prod", True),  # an empty Namespace label: its name
    (namespace("shared", allowed="team-a, team-b ,,"), "team-b", True),  # entries trimmed
    (namespace("shared", allowed="team-a, team-b ,,"), "team-a", True),
    (namespace("shared", allowed="team-a, team-b ,,"), "team-c", False),
    (namespace("shared", allowed="team-a"), "team-a, team-b", False),
    (namespace("shared", tenant="t0", allowed="t1"), "shared", False),
])
def test_the_tenant_label_must_be_one_the_namespace_allows(ns: dict[str, Any], tenant: str, allowed: bool) -> None:
    name = ns["metadata"]["name"]
    for resources in ({"vramfit.io/vram": "4Gi"}, None):  # any pod naming a tenant
        out = create(pod(name, resources=resources, labels={"vramfit.io/tenant": tenant}), ns)
        assert out.matched and (out.denied == []) is allowed, out
        if not allowed:
            assert out.denied[0].startswith(f"metadata.labels[vramfit.io/tenant]: namespace {name} does not allow "
                                            f"tenant {tenant} (it allows: ")


def test_the_denial_says_what_the_namespace_allows() -> None:
    out = create(pod("shared", labels={"vramfit.io/tenant": "x"}), namespace("shared", "t0", " t1 , t2"))
    assert "(it allows: t0, t1, t2)" in out.denied[0]


def test_on_update_only_a_changed_tenant_label_is_checked() -> None:
    """The namespace's rules may change under running pods: the kubelet's status updates must still pass."""
    ns_before = namespace("shared", allowed="team-a")
    old = bound("shared", labels={"vramfit.io/tenant": "team-a"})
    assert create(pod("shared", labels={"vramfit.io/tenant": "team-a"}), ns_before).denied == []
    status = copy.deepcopy(old)
    status["status"] = {"phase": "Running"}
    assert update(old, status, namespace("shared")).denied == []  # team-a no longer allowed, label unchanged
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["vramfit.io/tenant"] = "team-z"
    assert update(old, relabelled, ns_before).denied[0].startswith("metadata.labels[vramfit.io/tenant]")
    unlabelled = pod("shared", resources={"vramfit.io/gpu": "1"})
    labelled = copy.deepcopy(unlabelled)
    labelled["metadata"]["labels"] = {"vramfit.io/tenant": "team-z"}
    assert update(unlabelled, labelled, ns_before).denied


# ---- the DRA scheduling gate ---------------------------------------------------------------------------------

GATE = "vramfit.io/allocate"


def gated(ns: str = "team-a", gates: tuple[str, ...] = (GATE,), **kw: Any) -> dict[str, Any]:
    """A pod with a ResourceClaim as the webhook left it: the gate added, nothing else of vramfit's."""
    obj = pod(ns, **kw)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-14gi"}]
    obj["spec"]["containers"][-1]["resources"] = {"claims": [{"name": "gpu"}]}
    if gates:
        obj["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    obj["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                         "reason": "SchedulingGated"}]}
    return obj


def ungated(old: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    rest = [g for g in new["spec"]["schedulingGates"] if g["name"] != GATE]
    if rest:
        new["spec"]["schedulingGates"] = rest
    else:
        del new["spec"]["schedulingGates"]
    return new


@pytest.mark.parametrize("others", [(), ("example.com/quota",)])
def test_only_the_extender_removes_the_allocate_gate(others: tuple[str, ...]) -> None:
    """A pod author who removed the gate would hand the claims to kube-scheduler's first fit, past the tenant
    rules: the API server refuses it; the extender's own removal (after it allocated) passes."""
    old = gated(gates=(*others, GATE))
    new = ungated(old)
    denied = ["spec.schedulingGates[vramfit.io/allocate]: only vramfit removes this gate, once it has allocated the "
              "pod's ResourceClaims"]
    assert update(old, new).denied == denied
    assert update(old, new, username="system:serviceaccount:team-a:default").denied == denied
    assert update(old, new, username="system:serviceaccount:other-release:vramfit").denied == denied
    assert update(old, new, username="system:admin", groups=("system:masters",)).denied == denied
    assert update(old, new, username=EXTENDER) == Outcome(True, [])


def test_other_updates_of_a_gated_pod_are_allowed() -> None:
    old = gated(gates=("example.com/quota", GATE))
    other_gone = copy.deepcopy(old)
    other_gone["spec"]["schedulingGates"] = [{"name": GATE}]  # another controller removes its own gate
    assert update(old, other_gone, username="system:serviceaccount:kube-system:quota") == Outcome(True, [])
    labelled = copy.deepcopy(old)
    labelled["metadata"]["labels"] = {"app": "chat"}
    assert update(old, labelled) == Outcome(True, [])
    status = copy.deepcopy(old)
    status["status"]["conditions"].append({"type": "VramfitUnschedulable", "status": "True", "reason": "NoFit"})
    assert update(old, status, username=EXTENDER) == Outcome(True, [])


def test_the_gate_at_create_and_on_ungated_pods_is_not_the_policys_business() -> None:
    """The webhook adds the gate at CREATE (a pod author may add it too: it only holds the pod back); a pod
    that never had it is not matched on UPDATE."""
    assert create(gated()) == Outcome(False, [])
    plain = gated(gates=())
    assert update(plain, copy.deepcopy(plain)) == Outcome(False, [])
    quota = gated(gates=("example.com/quota",))
    assert update(quota, ungated(gated(gates=("example.com/quota", GATE)))) == Outcome(False, [])


def test_a_gate_removal_that_also_forges_a_record_is_denied_for_both() -> None:
    old = gated()
    new = ungated(old)
    new["metadata"]["annotations"] = {"vramfit.io/assignment": ASSIGNMENT}
    out = update(old, new)
    assert [m.split(":")[0] for m in out.denied] == ["metadata.annotations[vramfit.io/assignment]",
                                                     "spec.schedulingGates[vramfit.io/allocate]"]


# ---- what is not matched -------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [
    pod(),
    pod(resources={"cpu": "1", "nvidia.com/gpu": "1"}),
    pod(annotations={"vramfit.io/isolation": "hardware"}),
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "kube-system"},
     "spec": {"containers": [{"name": "c", "image": "x", "resources": {}}]}},
])
def test_pods_that_do_not_mention_vramfit_are_never_evaluated(obj: dict[str, Any]) -> None:
    assert create(obj) == Outcome(False, [])
    assert update(obj, obj) == Outcome(False, [])


# ---- forged pods, any mix ------------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(records=st.lists(st.sampled_from(RECORDS), unique=True, max_size=4),
       resources=st.sampled_from([None, {}, {"vramfit.io/gpu": "1"}, {"vramfit.io/vram": "1Gi"}, {"cpu": "1"}]),
       init=st.booleans(), node=st.sampled_from([None, "", "gpu-1"]),
       tenant=st.sampled_from([None, "", "team-a", "team-b", "evil"]), as_node=st.booleans(),
       mirror=st.booleans())
def test_forged_pods_at_create(records: list[str], resources: dict[str, str] | None, init: bool, node: str | None,
                               tenant: str | None, as_node: bool, mirror: bool) -> None:
    annotations = {r: "forged" for r in records}
    if mirror:
        annotations["kubernetes.io/config.mirror"] = "h"
    obj = pod("evil", resources=resources, annotations=annotations, node=node, init=init,
              labels={"vramfit.io/tenant": tenant} if tenant is not None else None)
    who: dict[str, Any] = {"username": "system:node:gpu-1", "groups": ("system:nodes",)} if as_node else {}
    out = create(obj, namespace("evil", allowed="team-b"), **who)
    asks = bool(resources) and any(k.startswith("vramfit.io/") for k in resources or {})
    expected = bool(records) + (bool(node) and asks and not (mirror and as_node)) + (tenant not in (None, "", "evil",
                                                                                                     "team-b"))
    assert len(out.denied) == expected, (out, obj)
    assert out.matched or expected == 0


def test_a_pod_with_claims_may_not_opt_itself_out_of_the_webhook() -> None:
    """The pod label vramfit.io/webhook=disabled would keep vramfit's gate off a pod with ResourceClaims, and
    kube-scheduler's first fit would allocate them past the tenant rules: refused. An admin exempts a namespace
    (its label), and the label alone on a pod without claims changes nothing."""
    claims = pod(labels={"vramfit.io/webhook": "disabled"})
    claims["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    assert create(claims).denied == [
        "metadata.labels[vramfit.io/webhook]: a pod with ResourceClaims may not opt out of vramfit's webhook (its "
        "claims would be allocated past the tenant rules); a cluster admin exempts a namespace instead"]
    exempt = namespace("team-a")
    exempt["metadata"]["labels"]["vramfit.io/webhook"] = "disabled"
    assert create(claims, exempt) == Outcome(True, [])
    kube = copy.deepcopy(claims)
    kube["metadata"]["namespace"] = "kube-system"
    assert create(kube).denied == []
    plain = pod(labels={"vramfit.io/webhook": "disabled"})
    assert create(plain).denied == []
