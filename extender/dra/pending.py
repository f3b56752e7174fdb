"""Which pods the allocator takes this round (store lock held): pending pods waiting at vramfit's gate or with
claims of managed classes unallocated (e.g. kube-scheduler cleared an allocation when no node fit the pod); and
which claims it gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extender.store import Store
from packing.dra.allocate import PodClaims
from packing.dra.nodes import DRA_DRIVERS
from packing.dra.objects import FINALIZER
from packing.dra.pod_claims import gated, pod_claim_names, pod_claims


@dataclass(frozen=True)
class Job:
    pod_key: str
    pod_uid: str
    pod: dict[str, Any]
    gated: bool
    claims: PodClaims | None  # None: nothing to allocate (ungate only)


def _waiting(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    if (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
        return False
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def pending_jobs(store: Store, limit: int) -> tuple[list[Job], dict[str, str]]:
    """The round's jobs, the oldest first, and the pods that must wait (pod key -> why)."""
    book = store.dra
    assert book is not None
    jobs: list[Job] = []
    waits: dict[str, str] = {}
    for key, pod in store.pod_items():
        if not _waiting(pod):
            continue
        found = pod_claims(pod, book.claims, book.managed, store.tenancy, book.inflight)
        if isinstance(found, str):
            waits[key] = found
            continue
        if not found.claims and not gated(pod):
            continue  # ungated and nothing left to allocate: kube-scheduler's turn
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        jobs.append(Job(key, uid, pod, gated(pod), found if found.claims else None))
    jobs.sort(key=lambda j: (-(j.claims.priority if j.claims else 0), j.claims.created if j.claims else 0.0))
    return jobs[:limit], waits


def stale_claims(store: Store) -> list[dict[str, Any]]:
    """Allocated claims no live pod uses and nothing reserves, carrying the delete-protection finalizer: their
    pod was deleted before it was bound, or their devices are gone. Deallocating them frees the devices (and lets
    a deleted claim go)."""
    book = store.dra
    assert book is not None
    used: set[str] = set()
    for _key, pod in store.pod_items():
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            continue
        used.update(f"{ns}/{e.claim}" for e in pod_claim_names(pod) if e.claim)
    out = []
    for key, c in book.claims.items():
        if c.allocation is None or c.reserved_for or FINALIZER not in c.finalizers:
            continue
        gone = any(r.device not in book.inventory.devices for r in c.allocation.results
                   if r.device.driver in DRA_DRIVERS)
        if key not in used or gone:
            out.append(book.claim_objs[key])
    return out
