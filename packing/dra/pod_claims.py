"""A pod's ResourceClaims by name, as kubelet and kube-scheduler find them (dynamic-resource-allocation
`resourceclaim.Name()`, dra.md §4): `resourceClaimName` when set; for a template, the pod's
`status.resourceClaimStatuses` entry (absent: not created yet; null name: none needed), and the claim must be
controlled by the pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packing.dra.objects import GATE, Claim

DRA_ANNOTATION = "vramfit.io/dra"  # set by the webhook on pods it gates: vramfit allocates their claims


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
