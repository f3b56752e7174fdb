"""The DRA part of a snapshot: ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates
(`resource.k8s.io/v1`) beside Nodes and Pods -> the DRA nodes, the classes, the claims, and the pods waiting for
vramfit to allocate their claims, as the live allocator would see them (dra.md §4, §8).

Pure: `read_dra` takes objects and returns a typed result; `install_dra` puts the DRA nodes into a state (with
their Node object's host side) and books the allocations already written into claims. A bad DRA object is an
`InputError` naming the object and the field; a pod whose claims cannot be offered to the allocator (a claim
not in the snapshot) is listed in `waiting`, with why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packing.catalog import Catalog
from packing.dra.allocate import Ledger, PodClaims
from packing.dra.books import book_claim
from packing.dra.nodes import DEFAULT_CLASSES, DraInventory, dra_inventory, with_host
from packing.dra.objects import POD_CLAIM_NAME, Claim, DeviceClass
from packing.dra.parse import claim as parse_claim
from packing.dra.parse import device_class, slice_devices
from packing.dra.pod_claims import gated, uses_classes
from packing.k8s.demand import epoch_seconds, held_tenant, pod_isolation, pod_tenant
from packing.k8s.trust import Tenancy
from packing.model import InputError, Isolation
from packing.state import ClusterState

SLICE, CLASS, CLAIM, TEMPLATE = "ResourceSlice", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate"
DRA_KINDS = (SLICE, CLASS, CLAIM, TEMPLATE)
MAX_BASE_LEN = 57  # the resource-claim controller's generateName base: room for "-" and 5 random characters


@dataclass(frozen=True)
class Waiting:
    """A DRA pod the allocator cannot take now, and why (a claim or template not in the snapshot, ...)."""

    pod: str
    reason: str
    gated: bool


@dataclass(frozen=True)
class DraObjects:
    """What the DRA objects of a snapshot say. `claims` holds every claim by key, those the what-if made from a
    template included (`templated`: claim key -> template name; named by their `generateName`)."""

    inventory: DraInventory
    classes: dict[str, DeviceClass]
    claims: dict[str, Claim]
    claim_tenants: dict[str, tuple[str, Isolation]]  # claim key -> who holds it (for booking)
    pending: tuple[PodClaims, ...]
    waiting: tuple[Waiting, ...]
    gated: frozenset[str]  # pending pods carrying vramfit's scheduling gate
    templated: dict[str, str] = field(default_factory=dict)
    managed: tuple[str, ...] = DEFAULT_CLASSES
    warnings: tuple[str, ...] = ()

    @property
    def node_names(self) -> frozenset[str]:
        return frozenset(self.inventory.nodes)

    @property
    def present(self) -> bool:
        return bool(self.inventory.devices or self.claims or self.pending or self.waiting)


def _kinds(objs: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {k: [] for k in (*DRA_KINDS, "Pod")}
    for o in objs:
        kind = o.get("kind")
        if isinstance(kind, str) and kind in out:
            out[kind].append(o)
    return out


def _section(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _section(obj, "metadata")


def _ns_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(obj)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _template_claim(tmpl: Mapping[str, Any], pod: Mapping[str, Any], pod_claim: str) -> dict[str, Any]:
    """The claim the resource-claim controller would create from `tmpl` for `pod` (dra.md §4): its spec, the
    pod as controlling owner, named by the controller's `generateName`."""
    ns, pod_name = _ns_name(pod)
    spec = _section(tmpl, "spec")
    meta = {"name": generate_name(pod_name, pod_claim), "namespace": ns,
            "annotations": {POD_CLAIM_NAME: pod_claim},
            "ownerReferences": [{"kind": "Pod", "name": pod_name, "uid": _meta(pod).get("uid", ""),
                                 "controller": True}]}
    return {"kind": CLAIM, "metadata": meta, "spec": spec.get("spec") or {}}


def generate_name(pod_name: str, claim_name: str) -> str:
    """`<pod>-<claim>-`, both parts cut in proportion above 57 characters (the controller's `generateName`)."""
    base = f"{pod_name}-{claim_name}-"
    if len(base) <= MAX_BASE_LEN:
        return base
    return (f"{pod_name[:len(pod_name) * MAX_BASE_LEN // len(base)]}-"
            f"{claim_name[:len(claim_name) * MAX_BASE_LEN // len(base)]}")


def _check_template(tmpl: Mapping[str, Any]) -> None:
    """A template's claim spec read as a claim's, errors naming the template and its `spec.spec` field."""
    spec = _section(tmpl, "spec")
    try:
        parse_claim({"kind": TEMPLATE, "metadata": _meta(tmpl), "spec": spec.get("spec") or {}})
    except InputError as err:
        raise InputError(err.obj, f"spec.{err.field_name}", err.problem) from None


def _is_pending(pod: Mapping[str, Any]) -> bool:
    spec = _section(pod, "spec")
    status = _section(pod, "status")
    return not spec.get("nodeName") and status.get("phase") not in ("Succeeded", "Failed")


@dataclass
class _Reader:
    """Resolves pods' claims against the snapshot's claims and templates."""

    claims: dict[str, Claim]
    templates: dict[str, Mapping[str, Any]]
    tenancy: Tenancy
    managed: tuple[str, ...]
    templated: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)  # claim key -> its pod-claim-name annotation

    def pod_claim(self, pod: Mapping[str, Any], entry: Mapping[str, Any]) -> Claim | str | None:
        """The claim behind one `spec.resourceClaims` entry (resourceclaim.Name, dra.md §4); a str: why none can
        be read; None: none is needed."""
        ns, pod_name = _ns_name(pod)
        name = str(entry.get("name") or "")
        direct = entry.get("resourceClaimName")
        if isinstance(direct, str) and direct:
            return self.claims.get(f"{ns}/{direct}") or f"claim {ns}/{direct} is not in the snapshot"
        tmpl_name = entry.get("resourceClaimTemplateName")
        if not isinstance(tmpl_name, str) or not tmpl_name:
            return f"pod claim {name!r} names neither resourceClaimName nor resourceClaimTemplateName"
        status = _section(pod, "status")
        recorded = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()
                    if isinstance(s, Mapping)}
        if name in recorded:
            made = recorded[name]
            if not made:
                return None
            return self.claims.get(f"{ns}/{made}") or f"claim {ns}/{made} (made from template {tmpl_name}) is " \
                                                       "not in the snapshot"
        owned = self._owned(ns, str(_meta(pod).get("uid") or ""), name)
        if owned is not None:
            return owned
        tmpl = self.templates.get(f"{ns}/{tmpl_name}")
        if tmpl is None:
            return f"template {ns}/{tmpl_name} is not in the snapshot"
        made_claim = parse_claim(_template_claim(tmpl, pod, name))
        self.templated[made_claim.ref.key] = tmpl_name
        return made_claim

    def _owned(self, ns: str, uid: str, pod_claim: str) -> Claim | None:
        if not uid:
            return None
        return next((c for c in self.claims.values() if c.ref.namespace == ns and c.owner_pod_uid == uid
                     and self.annotations.get(c.ref.key) == pod_claim), None)

    def pod(self, pod: Mapping[str, Any], who: str) -> PodClaims | Waiting | None:
        """A pending pod's unallocated managed claims (None: it waits for none)."""
        spec = _section(pod, "spec")
        entries = [e for e in spec.get("resourceClaims") or () if isinstance(e, Mapping)]
        claims: list[Claim] = []
        nodes: set[str] = set()
        for entry in entries:
            got = self.pod_claim(pod, entry)
            if isinstance(got, str):
                return Waiting(who, got, gated(pod))
            if got is None or not uses_classes(got, frozenset(self.managed)):
                continue
            if got.allocation is None:
                claims.append(got)
            elif got.allocation.node is not None:
                nodes.add(got.allocation.node)
        if not claims:
            return None
        if len(nodes) > 1:
            return Waiting(who, f"its allocated claims name different nodes ({', '.join(sorted(nodes))})",
                           gated(pod))
        meta = _meta(pod)
        try:
            tenant = pod_tenant(meta, f"pod {who}", self.tenancy)
            isolation = pod_isolation(_meta(pod).get("annotations") or {}, f"pod {who}")
        except InputError as err:
            return Waiting(who, str(err), gated(pod))
        priority = spec.get("priority")
        return PodClaims(who, str(meta.get("uid") or ""), tenant, isolation, tuple(claims),
                         next(iter(nodes), None), priority if isinstance(priority, int) else 0,
                         epoch_seconds(meta.get("creationTimestamp")) or 0.0)


def _claims(objs: list[Mapping[str, Any]]) -> tuple[dict[str, Claim], dict[str, str]]:
    claims: dict[str, Claim] = {}
    annotations: dict[str, str] = {}
    for o in objs:
        c = parse_claim(o)
        claims[c.ref.key] = c
        ann = _meta(o).get("annotations")
        if isinstance(ann, Mapping) and isinstance(ann.get(POD_CLAIM_NAME), str):
            annotations[c.ref.key] = ann[POD_CLAIM_NAME]
    return claims, annotations


def _holders(pods: list[Mapping[str, Any]], tenancy: Tenancy) -> dict[str, tuple[str, Isolation]]:
    """Pod UID -> (tenant, isolation) of pods that may hold claims (what their booked devices are held as)."""
    out: dict[str, tuple[str, Isolation]] = {}
    for p in pods:
        meta = _meta(p)
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            continue
        ns, name = _ns_name(p)
        who = f"pod {ns}/{name}"
        try:
            out[uid] = (held_tenant(meta, who, tenancy)[0], pod_isolation(_meta(p).get("annotations") or {}, who))
        except InputError:
            out[uid] = (tenancy.of(ns).tenant, Isolation.NONE)
    return out


def read_dra(objs: Iterable[Mapping[str, Any]], catalog: Catalog, tenancy: Tenancy,
             managed: tuple[str, ...] = DEFAULT_CLASSES) -> DraObjects:
    """The DRA objects of a snapshot (any other kind is skipped). Raises InputError for a bad DRA object."""
    by_kind = _kinds(objs)
    for s in by_kind[SLICE]:
        slice_devices(s)  # a bad slice is an error here; the live inventory only reports it
    inventory = dra_inventory(by_kind[SLICE], catalog)
    classes = {c.name: c for c in map(device_class, by_kind[CLASS])}
    claims, annotations = _claims(by_kind[CLAIM])
    templates: dict[str, Mapping[str, Any]] = {}
    for t in by_kind[TEMPLATE]:
        _check_template(t)
        ns, name = _ns_name(t)
        templates[f"{ns}/{name}"] = t
    reader = _Reader(claims, templates, tenancy, managed, annotations=annotations)
    pending: list[PodClaims] = []
    waiting: list[Waiting] = []
    gated_keys: set[str] = set()
    for p in by_kind["Pod"]:
        if not _is_pending(p):
            continue
        ns, name = _ns_name(p)
        got = reader.pod(p, f"{ns}/{name}")
        if isinstance(got, PodClaims):
            pending.append(got)
            if gated(p):
                gated_keys.add(got.key)
        elif got is not None:
            waiting.append(got)
    holders = _holders(by_kind["Pod"], tenancy)
    claim_tenants = {k: _claim_holder(c, holders, tenancy) for k, c in claims.items() if c.allocation is not None}
    warnings = [*inventory.problems, *(f"pool {p} is incomplete (slices missing): not read" for p in
                                       inventory.incomplete)]
    return DraObjects(inventory, classes, {**claims, **{c.ref.key: c for c in _made(pending, reader)}},
                      claim_tenants, tuple(pending), tuple(waiting), frozenset(gated_keys), dict(reader.templated),
                      managed, tuple(warnings))


def _made(pending: list[PodClaims], reader: _Reader) -> list[Claim]:
    return [c for p in pending for c in p.claims if c.ref.key in reader.templated]


def _claim_holder(claim: Claim, holders: dict[str, tuple[str, Isolation]], tenancy: Tenancy
                  ) -> tuple[str, Isolation]:
    """Who an allocated claim is held for: the first pod it is reserved for that the snapshot holds, else its
    namespace's tenant (packing.k8s.trust)."""
    for uid in (*claim.reserved_for, claim.owner_pod_uid or ""):
        if uid in holders:
            return holders[uid]
    return tenancy.of(claim.ref.namespace).tenant, Isolation.NONE


def install_dra(state: ClusterState, dra: DraObjects) -> tuple[Ledger, list[str]]:
    """Put the DRA nodes into `state` (the host side of a Node already there kept, `with_host`) and book every
    allocation written into a claim. DRA pools of nodes without a Node object are left out (warned)."""
    warnings: list[str] = []
    for name, dnode in dra.inventory.nodes.items():
        if not state.has_node(name):
            warnings.append(f"node {name}: ResourceSlices but no Node object: its devices are not counted")
            continue
        state.upsert_node(with_host(dnode.node, state.node(name)))
    ledger = Ledger()
    for key, (tenant, isolation) in sorted(dra.claim_tenants.items()):
        booked = book_claim(state, dra.inventory, ledger, dra.claims[key], tenant, isolation)
        warnings.extend(f"claim {key}: allocation not booked: {p}" for p in booked.problems)
    return ledger, warnings
