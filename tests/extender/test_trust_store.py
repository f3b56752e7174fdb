"""The extender believes only what vramfit wrote and what admins set (issue 26).

- A bound pod's assignment is booked only when vramfit signed it for that pod and node; a pod author's
  hand-written one books nothing.
- A holding is recorded once per pod UID: a later edit of the assignment (or of its signature) is reported and
  never followed; the units recorded at bind stay booked.
- A grant larger than its unit is refused.
- A pod's tenant is its namespace's, unless the namespace allows the one it names: a pending pod naming another
  is never placed, and a bound one counts under its namespace's tenant.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import flush_reports, pending_demands

from extender.binder import binding_annotations
from extender.store import EDIT_REASON, Conflict, NoFit, Store
from packing import fit
from packing.catalog import load_catalog
from packing.k8s.demand import pod_demand
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys, sign
from packing.model import Assignment, GpuGrant, InputError, Isolation, Mode, PodDemand
from packing.policies import get_policy
from packing.state import ClusterState, PlacementError

CAT = load_catalog()
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
KEYS = SigningKeys.from_text("k" * 40)
OTHER_KEYS = SigningKeys.from_text("o" * 40)
ONE_G = [{"profile": "1g.10gb", "start": s} for s in range(4)]  # four small instances per GPU (16 a node)


def node(name: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}}


def mig_node(name: str = "n1") -> dict[str, Any]:
    return node(name, [{"index": i, "product": A100, "mode": "mig", "mig": ONE_G} for i in range(4)])


def namespace(name: str, tenant: str | None = None, allowed: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/metadata.name": name}}
    if tenant:
        meta["labels"]["vramfit.io/tenant"] = tenant
    if allowed is not None:
        meta["annotations"] = {"vramfit.io/allowed-tenants": allowed}
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": meta, "status": {"phase": "Active"}}


def pod(name: str, *, ns: str = "team-a", vram: int | None = 8192, node_name: str | None = None,
        grants: list[dict[str, Any]] | None = None, keys: SigningKeys | None = None, tenant: str | None = None,
        isolation: str | None = None, uid: str | None = None) -> dict[str, Any]:
    """A pod; with `grants` an assignment annotation, signed with `keys` when given."""
    uid = uid or f"uid-{ns}-{name}"
    ann: dict[str, str] = {}
    if isolation:
        ann["vramfit.io/isolation"] = isolation
    if grants is not None:
        text = json.dumps({"gpus": grants}, separators=(",", ":"))
        ann["vramfit.io/assignment"] = text
        ann["vramfit.io/gpus"] = str(len(grants))
        if keys is not None and node_name:
            ann[ANN_SIGNATURE] = sign(keys, uid, node_name, text)
    resources = {"limits": {"vramfit.io/vram": str(vram)}} if vram else {"requests": {"cpu": "1"}}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}],
                            "schedulerName": "vramfit-scheduler" if vram else "default-scheduler"}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "1",
                         "creationTimestamp": "2026-05-04T08:00:00Z", "annotations": ann,
                         "labels": {"vramfit.io/tenant": tenant} if tenant else {}},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def held(store: Store, key: str) -> tuple[GpuGrant, ...] | None:
    h = store.state.holder(key)
    return None if h is None else h.assignment.gpus


def free_instances(store: Store, name: str = "n1") -> int:
    with store.lock:
        return sum(len(gu.free_instances()) for gu in store.state.usage(name).gpus if gu.gpu.mode is Mode.MIG)


# ---- signatures ---------------------------------------------------------------------------------------


def test_cpu_only_pods_with_hand_written_assignments_book_nothing() -> None:
    """The probe's case: CPU-only pods bound by the default scheduler, their assignments naming every MIG
    instance of the node."""
    store = Store(CAT, signing_keys=KEYS)
    store.replace("nodes", [mig_node()])
    # An assignment holds one grant per GPU: sixteen such pods name every instance of the node.
    pods = [pod(f"cpu-{g}-{s}", vram=None, node_name="n1",
                grants=[{"index": g, "mig": f"1g.10gb@{s}", "vram_mib": 9728}]) for g in range(4) for s in range(4)]
    store.replace("pods", pods)
    assert store.state.holders() == []
    assert free_instances(store) == 16


def test_without_a_key_the_same_pods_would_take_every_instance() -> None:
    """The control: the pods above are what the probe found booked before signatures."""
    store = Store(CAT)
    store.replace("nodes", [mig_node()])
    store.replace("pods", [pod(f"cpu-{g}-{s}", vram=None, node_name="n1",
                               grants=[{"index": g, "mig": f"1g.10gb@{s}", "vram_mib": 9728}])
                           for g in range(4) for s in range(4)])
    assert free_instances(store) == 0


@pytest.mark.parametrize("forgery", ["unsigned", "other key", "other pod", "other node", "other text"])
def test_a_forged_assignment_on_a_vramfit_pod_is_not_booked_as_written(forgery: str) -> None:
    store = Store(CAT, signing_keys=KEYS)
    store.replace("nodes", [mig_node(), mig_node("n2")])
    grants = [{"index": 3, "mig": "1g.10gb@2", "vram_mib": 8192}]
    p = pod("p", node_name="n1", grants=grants, keys=KEYS, isolation="hardware")
    ann = p["metadata"]["annotations"]
    if forgery == "unsigned":
        del ann[ANN_SIGNATURE]
    elif forgery == "other key":
        ann[ANN_SIGNATURE] = sign(OTHER_KEYS, "uid-team-a-p", "n1", ann["vramfit.io/assignment"])
    elif forgery == "other pod":
        ann[ANN_SIGNATURE] = sign(KEYS, "uid-someone-else", "n1", ann["vramfit.io/assignment"])
    elif forgery == "other node":
        ann[ANN_SIGNATURE] = sign(KEYS, "uid-team-a-p", "n2", ann["vramfit.io/assignment"])
    else:
        ann["vramfit.io/assignment"] = ann["vramfit.io/assignment"].replace("@2", "@3")
    store.replace("pods", [p])
    units = held(store, "team-a/p")
    # A vramfit pod still holds capacity (its demand, units picked by best fit), never the ones it named.
    assert units is not None and len(units) == 1
    assert units[0].vram_mib <= 9728
    assert any("not signed by vramfit" in w for w in store.warnings)


def test_a_signed_assignment_is_booked_as_written_and_a_restart_rebuilds_it() -> None:
    grants = [{"index": 2, "mig": "1g.10gb@1", "vram_mib": 8192}]
    objs = [mig_node(), pod("p", node_name="n1", grants=grants, keys=KEYS)]
    store = Store.from_objects(objs, CAT, signing_keys=KEYS)
    assert held(store, "team-a/p") == (GpuGrant(2, 8192, mig="1g.10gb@1"),)
    again = Store.from_objects(copy.deepcopy(objs), CAT, signing_keys=KEYS)
    assert held(again, "team-a/p") == held(store, "team-a/p")


# ---- once per UID: an edit is a conflict, never a move --------------------------------------------------


def test_an_edited_assignment_keeps_the_booking_and_is_reported() -> None:
    reports: list[Conflict] = []
    store = Store(CAT, on_conflict=reports.append)  # no key: even an assignment taken as written is not re-read
    store.replace("nodes", [mig_node()])
    victim = pod("victim", ns="team-b", node_name="n1", grants=[{"index": 1, "mig": "1g.10gb@0", "vram_mib": 8192}])
    p = pod("p", node_name="n1", grants=[{"index": 0, "mig": "1g.10gb@0", "vram_mib": 8192}])
    store.replace("pods", [p])
    original = held(store, "team-a/p")
    edited = copy.deepcopy(p)
    edited["metadata"]["resourceVersion"] = "2"
    edited["metadata"]["annotations"]["vramfit.io/assignment"] = json.dumps(
        {"gpus": [{"index": 1, "mig": "1g.10gb@0", "vram_mib": 8192}]})
    store.apply("pods", "MODIFIED", edited)
    assert held(store, "team-a/p") == original  # the booking did not move
    # The unit the container still uses is not offered to anyone; the one it names is still free for others.
    store.apply("pods", "ADDED", victim)
    assert held(store, "team-b/victim") == (GpuGrant(1, 8192, mig="1g.10gb@0"),)
    assert "team-a/p" in store.edited and store.edited["team-a/p"].edit
    assert "vramfit.io/assignment" in store.edited["team-a/p"].reason
    assert flush_reports(store)
    assert [(c.key, c.event_reason) for c in reports] == [("team-a/p", EDIT_REASON)]
    assert "ignores a change" in reports[0].message
    # A settle of the node (another pod leaves) reads the recorded assignment, not the edited one.
    store.apply("pods", "DELETED", victim)
    assert held(store, "team-a/p") == original
    # Putting the original back clears the report; deleting the pod frees its units.
    store.apply("pods", "MODIFIED", p)
    assert "team-a/p" not in store.edited
    store.apply("pods", "DELETED", p)
    assert store.state.holder("team-a/p") is None and free_instances(store) == 16


def test_removing_the_signature_does_not_drop_the_booking() -> None:
    store = Store(CAT, signing_keys=KEYS)
    store.replace("nodes", [mig_node()])
    p = pod("p", node_name="n1", grants=[{"index": 0, "mig": "1g.10gb@3", "vram_mib": 8192}], keys=KEYS)
    store.replace("pods", [p])
    original = held(store, "team-a/p")
    assert original == (GpuGrant(0, 8192, mig="1g.10gb@3"),)
    stripped = copy.deepcopy(p)
    del stripped["metadata"]["annotations"][ANN_SIGNATURE]
    store.apply("pods", "MODIFIED", stripped)
    assert held(store, "team-a/p") == original
    assert ANN_SIGNATURE in store.edited["team-a/p"].reason


def test_a_pod_recreated_under_the_same_name_starts_afresh() -> None:
    store = Store(CAT, signing_keys=KEYS)
    store.replace("nodes", [mig_node()])
    first = pod("p", node_name="n1", grants=[{"index": 0, "mig": "1g.10gb@0", "vram_mib": 8192}], keys=KEYS)
    store.replace("pods", [first])
    second = pod("p", node_name="n1", grants=[{"index": 2, "mig": "1g.10gb@1", "vram_mib": 8192}], keys=KEYS,
                 uid="uid-second")
    store.apply("pods", "DELETED", first)
    store.apply("pods", "ADDED", second)
    assert held(store, "team-a/p") == (GpuGrant(2, 8192, mig="1g.10gb@1"),)
    assert store.edited == {}


# ---- a grant larger than its unit ----------------------------------------------------------------------


def test_a_grant_larger_than_its_unit_is_refused_in_one_place() -> None:
    store = Store(CAT)
    store.replace("nodes", [mig_node(), node("ex", [{"index": 0, "product": H100, "mode": "exclusive"}])])
    state: ClusterState = store.state
    p = PodDemand(key="t/p", vram_mib=1, tenant="t", uid="u")
    for forced in (True, False):
        with pytest.raises(PlacementError, match="more than MIG instance 1g.10gb@0 has"):
            state.check(p, Assignment("n1", (GpuGrant(0, 40960, mig="1g.10gb@0"),)), force=forced)
        with pytest.raises(PlacementError, match="more than the GPU has"):
            state.check(p, Assignment("ex", (GpuGrant(0, 200_000),)), force=forced)
    # Through the store: the pod is conflicted and its oversized grant never recorded as written.
    big = pod("big", node_name="n1", vram=40960, grants=[{"index": 0, "mig": "1g.10gb@0", "vram_mib": 40960}])
    store.replace("pods", [big])
    assert store.state.holder("team-a/big") is None
    assert "more than MIG instance" in store.conflicted["team-a/big"].reason


# ---- tenancy ----------------------------------------------------------------------------------------------


def mps_node() -> dict[str, Any]:
    return node("mps", [{"index": 0, "product": H100, "mode": "mps", "replicas": 4}])


def test_a_bound_pod_naming_a_tenant_its_namespace_does_not_allow_counts_under_its_namespace() -> None:
    store = Store(CAT)
    store.replace("namespaces", [namespace("team-a"), namespace("evil")])
    store.replace("nodes", [mps_node()])
    intruder = pod("x", ns="evil", tenant="team-a", node_name="mps", grants=[{"index": 0, "vram_mib": 4096}])
    store.replace("pods", [intruder])
    h = store.state.holder("evil/x")
    assert h is not None and h.pod.tenant == "evil"
    mate = pod_demand(pod("mate", ns="team-a", vram=4096), store.tenancy)
    assert mate is not None and mate.tenant == "team-a"
    with store.lock:
        assert not fit.explain(store.state, "mps", mate).options  # evil's GPU is not team-a's to share


def test_a_namespace_change_rereads_pending_pods_and_moves_nothing_held() -> None:
    store = Store(CAT)
    store.replace("namespaces", [namespace("ml")])
    store.replace("nodes", [mps_node()])
    waiting = pod("w", ns="ml", tenant="team-a", vram=4096)
    running = pod("r", ns="ml", tenant="team-a", node_name="mps", grants=[{"index": 0, "vram_mib": 4096}])
    store.replace("pods", [waiting, running])
    assert store.queued() == [] and pending_demands(store) == []
    before = store.state.holder("ml/r")
    assert before is not None and before.pod.tenant == "ml"
    store.apply("namespaces", "MODIFIED", namespace("ml", allowed="team-a"))
    assert [e.pod.tenant for e in store.queued()] == ["team-a"]
    assert [p.key for p in pending_demands(store)] == ["ml/w"]
    assert store.state.holder("ml/r") == before  # held pods are not settled again
    store.apply("namespaces", "DELETED", namespace("ml", allowed="team-a"))
    assert store.queued() == []


def test_pods_listed_before_their_namespaces_are_read_again_on_the_first_namespace_list() -> None:
    store = Store(CAT)
    store.replace("nodes", [mps_node()])
    store.replace("pods", [pod("r", ns="ml", tenant="team-a", node_name="mps",
                               grants=[{"index": 0, "vram_mib": 4096}])])
    assert store.state.holder("ml/r").pod.tenant == "ml"  # type: ignore[union-attr]
    store.replace("namespaces", [namespace("ml", allowed="team-a")])
    h = store.state.holder("ml/r")
    assert h is not None and h.pod.tenant == "team-a" and h.assignment.gpus == (GpuGrant(0, 4096),)


def test_a_malformed_namespace_allows_nothing_and_is_warned() -> None:
    store = Store(CAT)
    bad = namespace("ml")
    bad["metadata"]["annotations"] = {"vramfit.io/allowed-tenants": 7}
    store.replace("namespaces", [bad])
    assert store.tenancy.of("ml").allowed == frozenset()
    assert any("namespace ml" in w for w in store.warnings)


# ---- forged pods against the store (hypothesis) ---------------------------------------------------------

SHARED = (Mode.MPS, Mode.TIMESLICE)
NAMESPACES = ("team-a", "team-b", "evil")
TENANT_LABELS = (None, "team-a", "team-b", "evil", "other")
POLICY = get_policy("best-fit")


def cluster_nodes() -> list[dict[str, Any]]:
    return [node("g1", [{"index": 0, "product": H100, "mode": "mps", "replicas": 4},
                        {"index": 1, "product": H100, "mode": "timeslice", "replicas": 4},
                        {"index": 2, "product": A100, "mode": "mig", "mig": ONE_G},
                        {"index": 3, "product": H100, "mode": "exclusive"}])]


@st.composite
def action(draw: st.DrawFn, k: int) -> tuple[str, dict[str, Any]]:
    """("bind", a pending pod vramfit places and signs) or ("forged", a bound pod with a hand-written,
    unsigned or wrongly signed assignment) or ("edit", k: an edit of the k-th pod's assignment)."""
    ns = draw(st.sampled_from(NAMESPACES))
    label = draw(st.sampled_from(TENANT_LABELS))
    kind = draw(st.sampled_from(["bind", "forged", "edit"]))
    if kind == "bind":
        return kind, pod(f"p{k}", ns=ns, tenant=label, vram=draw(st.sampled_from([2048, 8192, 30000])),
                         isolation=draw(st.sampled_from([None, "process", "hardware"])))
    grant: dict[str, Any] = {"index": draw(st.integers(0, 3)),
                             "vram_mib": draw(st.sampled_from([1024, 4096, 9728, 30000, 90000]))}
    if draw(st.booleans()):
        grant["mig"] = f"1g.10gb@{draw(st.integers(0, 4))}"
    if kind == "edit":
        return kind, {"target": draw(st.integers(0, 9)), "grant": grant, "keep_signature": draw(st.booleans())}
    p = pod(f"p{k}", ns=ns, tenant=label, vram=draw(st.sampled_from([None, 2048, 8192])), node_name="g1",
            grants=[grant])
    text = p["metadata"]["annotations"]["vramfit.io/assignment"]
    forgery = draw(st.sampled_from(["none", "wrong key", "wrong uid", "wrong node"]))
    sig = {"wrong key": sign(OTHER_KEYS, p["metadata"]["uid"], "g1", text),
           "wrong uid": sign(KEYS, "uid-x", "g1", text), "wrong node": sign(KEYS, p["metadata"]["uid"], "g2", text),
           "none": None}[forgery]
    if sig is not None:
        p["metadata"]["annotations"][ANN_SIGNATURE] = sig
    return kind, p


def place_and_sign(store: Store, obj: dict[str, Any]) -> dict[str, Any] | None:
    """What vramfit does with a pending pod: its demand by the namespace rules, units by the store, a signed
    Binding; None where it is refused (a tenant its namespace does not allow, or no room)."""
    try:
        demand = pod_demand(obj, store.tenancy)
    except InputError:
        return None
    assert demand is not None
    try:
        assignment = store.reserve(demand, "g1", POLICY)
    except NoFit:
        return None
    bound = copy.deepcopy(obj)
    bound["spec"]["nodeName"] = "g1"
    bound["status"]["phase"] = "Running"
    ann = binding_annotations(assignment, datetime.now(UTC), uid=demand.uid, keys=KEYS)
    bound["metadata"]["annotations"].update(ann)
    store.confirm(demand.uid)
    store.apply("pods", "MODIFIED", bound)
    return bound


def play(store: Store, actions: tuple[tuple[str, dict[str, Any]], ...]
         ) -> tuple[list[dict[str, Any]], dict[str, tuple[GpuGrant, ...]]]:
    """Apply the actions to the store: the bound pods as the API shows them after, and what vramfit bound and
    signed, by pod key."""
    pods: list[dict[str, Any]] = []
    signed: dict[str, tuple[GpuGrant, ...]] = {}
    for kind, obj in actions:
        if kind == "bind":
            store.apply("pods", "ADDED", obj)
            bound = place_and_sign(store, obj)
            if bound is not None:
                pods.append(bound)
                key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
                signed[key] = held(store, key) or ()
        elif kind == "forged":
            store.apply("pods", "ADDED", obj)
            pods.append(obj)
        elif pods:
            store.apply("pods", "MODIFIED", edited(pods[obj["target"] % len(pods)], obj))
    return pods, signed


def edited(pod_obj: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """The pod with its assignment rewritten to the edit's grant (and its signature dropped, if asked)."""
    target = copy.deepcopy(pod_obj)
    ann = target["metadata"]["annotations"]
    ann["vramfit.io/assignment"] = json.dumps({"gpus": [edit["grant"]]})
    if not edit["keep_signature"]:
        ann.pop(ANN_SIGNATURE, None)
    return target


def assert_holders_trusted(store: Store, pods: list[dict[str, Any]],
                           signed: dict[str, tuple[GpuGrant, ...]]) -> None:
    by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    rules = store.tenancy
    for h in store.state.holders():
        key = h.pod.key.split("#", 1)[0]
        ns = key.split("/", 1)[0]
        assert rules.of(ns).permits(h.pod.tenant), key  # its namespace's tenant, or one it allows
        if key in signed:
            assert h.assignment.gpus == signed[key], key  # an edit never moves what vramfit signed
        else:
            # Never a unit booked from an unsigned record: a CPU-only pod holds nothing; a vramfit pod only
            # what its demand gets by best fit.
            assert by_key[key]["spec"]["containers"][0]["resources"].get("limits"), key
            assert all(g.vram_mib >= h.pod.vram_mib for g in h.assignment.gpus), key


def assert_gpus_within_their_modes(store: Store) -> None:
    for gu in store.state.usage("g1").gpus:
        g = gu.gpu
        for key, grant in gu.grants.items():
            inst = g.instance(grant.mig) if grant.mig else None
            assert grant.vram_mib <= (inst.memory_mib if inst else g.memory_mib), (key, grant)
        if g.mode is Mode.MIG:
            assert len(set(gu.mig_holder.values())) == len(gu.mig_holder)
        elif g.mode is Mode.EXCLUSIVE:
            assert len(gu.grants) <= 1
        else:
            assert gu.used_mib <= g.memory_mib
        if g.mode in SHARED:
            assert len({t for t, n in gu.tenants.items() if n}) <= 1, gu.tenants  # one failure domain


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([None, "team-a", "team-b", "team-a,evil"]), min_size=3, max_size=3),
       st.integers(1, 10).flatmap(lambda n: st.tuples(*(action(k) for k in range(n)))))
def test_forged_pods_never_get_units_vramfit_did_not_sign_nor_share_a_gpu_across_tenants(
        allowed: list[str | None], actions: tuple[tuple[str, dict[str, Any]], ...]) -> None:
    store = Store(CAT, signing_keys=KEYS)
    store.replace("namespaces", [namespace(n, allowed=a) for n, a in zip(NAMESPACES, allowed, strict=True)])
    store.replace("nodes", cluster_nodes())
    store.replace("pods", [])
    pods, signed = play(store, actions)
    with store.lock:
        assert_holders_trusted(store, pods, signed)
        assert_gpus_within_their_modes(store)


def test_a_pending_pod_naming_a_tenant_its_namespace_does_not_allow_has_no_demand() -> None:
    store = Store(CAT)
    store.replace("namespaces", [namespace("evil")])
    with pytest.raises(InputError, match="namespace evil does not allow tenant 'team-a'"):
        pod_demand(pod("x", ns="evil", tenant="team-a"), store.tenancy)
    p = pod_demand(pod("x", ns="evil", tenant="team-a", isolation="hardware"), store.tenancy.__class__(
        {"evil": store.tenancy.of("evil").__class__("evil", frozenset({"team-a"}))}))
    assert p is not None and p.tenant == "team-a" and p.isolation is Isolation.HARDWARE
