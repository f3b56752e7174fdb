"""A pod's ResourceClaims by name, as kubelet and kube-scheduler find them (dynamic-resource-allocation
`resourceclaim.Name()`, dra.md §4): `resourceClaimName` when set; for a template, the pod's
`status.resourceClaimStatuses` entry (absent: not created yet; null name: none needed), and the claim must be
controlled by the pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packing.dra.allocate import PodClaims
from packing.dra.objects import GATE, Claim
from packing.k8s.demand import epoch_seconds, pod_gpu_per_process, pod_host, pod_isolation, pod_tenant
from packing.k8s.trust import Tenancy
from packing.model import InputError


@dataclass(frozen=True)
class PodClaimName:
    """One entry of `spec.resourceClaims`: the claim's name (None: not known yet, or none needed)."""

    entry: str  # the pod's name for it
    claim: str | None
    template: str | None  # the template it is made from, if any
    waiting: bool  # a template claim the resource-claim controller has not created yet


def pod_claim_names(pod: Mapping[str, Any]) -> list[PodClaimName]:
    spec = pod.get("spec") or {}
    statuses = {s.get("name"): s for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or ())}
    out = []
    for entry in spec.get("resourceClaims") or ():
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            out.append(PodClaimName(name, str(entry["resourceClaimName"]), None, False))
            continue
        template = entry.get("resourceClaimTemplateName")
        status = statuses.get(name)
        if status is None:
            out.append(PodClaimName(name, None, template, True))
        else:
            made = status.get("resourceClaimName")
            out.append(PodClaimName(name, str(made) if made else None, template, False))
    return out


def owned_by(claim: Claim, pod: Mapping[str, Any], template: str | None) -> bool:
    """A template claim must be controlled by the pod (a claim of the same name from elsewhere is not its)."""
    return template is None or claim.owner_pod_uid == (pod.get("metadata") or {}).get("uid")


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def without_gate(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's scheduling gates less vramfit's."""
    return [dict(g) for g in (pod.get("spec") or {}).get("schedulingGates") or () if g.get("name") != GATE]


def uses_classes(claim: Claim, classes: frozenset[str]) -> bool:
    """Some request (or alternative) of the claim asks for one of `classes`."""
    return any(alt.device_class in classes for r in claim.requests for alt in r.alternatives)


def pod_claims(pod: Mapping[str, Any], claims: Mapping[str, Claim], managed: frozenset[str], tenancy: Tenancy,
               inflight: Mapping[str, str] | None = None) -> PodClaims | str:
    """What vramfit must allocate for a pod: its claims of `managed` classes not allocated (nor being written:
    `inflight`, claim key -> node), and the node its allocated claims bind it to; or why it must wait (a claim
    not created or seen yet, a claim another pod controls, a tenant its namespace does not allow)."""
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    who = f"pod {ns}/{meta.get('name')}"
    try:
        tenant = pod_tenant(meta, who, tenancy)
        isolation = pod_isolation(meta.get("annotations") or {}, who)
        cpu, mem = pod_host(pod.get("spec") or {}, who)
        per_process = pod_gpu_per_process(meta.get("annotations") or {}, who)
    except InputError as err:
        return str(err)
    todo: list[Claim] = []
    nodes: set[str] = set()
    keys: dict[str, str] = {}  # the pod's name for a claim -> the claim's key
    for entry in pod_claim_names(pod):
        if entry.waiting:
            return f"claim {entry.entry}: the resource-claim controller has not created it from its template yet"
        if entry.claim is None:
            continue
        keys[entry.entry] = f"{ns}/{entry.claim}"
        c = claims.get(f"{ns}/{entry.claim}")
        if c is None:
            return f"claim {ns}/{entry.claim} does not exist (yet)"
        if not owned_by(c, pod, entry.template):
            return f"claim {ns}/{entry.claim} is controlled by another pod"
        node = c.allocation.node if c.allocation is not None else (inflight or {}).get(c.ref.key)
        if node is not None:
            nodes.add(node)
        elif c.allocation is None and uses_classes(c, managed):
            todo.append(c)
    if len(nodes) > 1:
        return f"its claims are allocated on different nodes ({', '.join(sorted(nodes))}): it can run on none"
    return PodClaims(f"{ns}/{meta.get('name')}", str(meta.get("uid", "")), tenant, isolation, tuple(todo),
                     next(iter(nodes), None), int((pod.get("spec") or {}).get("priority") or 0), epoch_seconds(meta.get("creationTimestamp")) or 0.0,
                     cpu, mem, per_process, _containers(pod, keys))


def _containers(pod: Mapping[str, Any], keys: Mapping[str, str]) -> tuple[frozenset[str], ...]:
    """The claim keys each container (init containers too) names in `resources.claims`."""
    spec = pod.get("spec") or {}
    out = []
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        used = {keys[str(r.get("name"))] for r in ((c or {}).get("resources") or {}).get("claims") or ()
                if isinstance(r, Mapping) and str(r.get("name")) in keys}
        if used:
            out.append(frozenset(used))
    return tuple(out)
