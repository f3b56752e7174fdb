"""The pending queue the extender will be asked about (issue 13): unbound pods that request vramfit.io/vram.

The store keeps it in step with its pods (`Store._put_pod` / `_forget_pod`, under the store's lock): every
watched (or snapshot, or `POST /queue`) pod that is unbound, not finished and asks for VRAM is an entry, with
its demand (priority included) and creation time. `schedulers` narrows the entries read to pods for those
scheduler names (cluster mode: vramfit's profiles); None reads all (snapshot mode). Pods that already hold
units in the state (a snapshot-mode bind leaves the pod object unbound) are left out when read.

`version` moves on every change of the entries, so the planner can tell a changed queue from a quiet one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from packing.k8s.demand import epoch_seconds, pending_demand
from packing.model import PodDemand
from packing.state import ClusterState


@dataclass(frozen=True)
class Entry:
    pod: PodDemand
    created: float  # epoch seconds (creationTimestamp; the time first seen when the pod has none)
    scheduler: str  # spec.schedulerName ("" when unset)


def created_at(obj: dict[str, Any]) -> float:
    """metadata.creationTimestamp as epoch seconds; NaN when missing or unreadable."""
    meta = obj.get("metadata")
    stamp = epoch_seconds(meta.get("creationTimestamp")) if isinstance(meta, dict) else None
    return math.nan if stamp is None else stamp


class PendingQueue:
    """key -> Entry for the pending vramfit pods (mutated under the store's lock)."""

    def __init__(self, schedulers: Iterable[str] | None = None) -> None:
        self.schedulers: frozenset[str] | None = frozenset(schedulers) if schedulers is not None else None
        self.entries: dict[str, Entry] = {}
        self.version = 0

    def observe(self, key: str, obj: dict[str, Any]) -> None:
        """A pod object was recorded: it is an entry iff it is pending and asks for VRAM."""
        demand = pending_demand(obj)
        old = self.entries.get(key)
        if demand is None:
            if old is not None:
                del self.entries[key]
                self.version += 1
            return
        created = created_at(obj)
        if math.isnan(created):
            created = old.created if old is not None else time.time()
        spec = obj.get("spec") or {}
        entry = Entry(demand, created, str(spec.get("schedulerName") or "") if isinstance(spec, dict) else "")
        if old != entry:
            self.entries[key] = entry
            self.version += 1

    def drop(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.version += 1

    def read(self, state: ClusterState) -> list[Entry]:
        """The entries for our schedulers that hold nothing in `state`, oldest first (store lock held)."""
        wanted = self.schedulers
        out = [e for k, e in self.entries.items()
               if (wanted is None or e.scheduler in wanted) and state.holder(k) is None]
        out.sort(key=lambda e: (-e.pod.priority, e.created, e.pod.key))
        return out
