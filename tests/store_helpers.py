"""Test-side views of an extender Store that the shipped code does not need."""

from __future__ import annotations

from typing import Any

from extender.store import Store
from packing.k8s.demand import pending_demand
from packing.model import PodDemand


def flush_reports(store: Store, timeout_s: float = 5.0) -> bool:
    """Wait until every conflict the store found so far was handed to its `on_conflict` callback."""
    return store._reporter.flush(timeout_s)


def pending_demands(store: Store, limit: int = 10_000) -> list[PodDemand]:
    """Pods waiting to be placed that ask vramfit for VRAM, oldest first."""
    with store.lock:
        objs: list[dict[str, Any]] = sorted((o for _k, o in store.pod_items()),
                                            key=lambda o: str((o.get("metadata") or {}).get("creationTimestamp") or ""))
        tenancy = store.tenancy
    out = [p for p in (pending_demand(o, tenancy) for o in objs) if p is not None]
    return out[:limit]
