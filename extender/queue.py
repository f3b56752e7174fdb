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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from packing.k8s.demand import epoch_seconds, pending_demand
from packing.k8s.trust import NO_NAMESPACE_RULES, Tenancy
from packing.model import PodDemand
from packing.solvers.queue_room import Shape
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
        self.entries: dict[str, Entry] = {}
        self.version = 0
        # Pod shape -> [entries of ours with it, one of their demands]: what the planner's roomy check reads
        # (extender.planner `_recheck`) in time per shape, not per pod.
        self._shapes: dict[Shape, list[Any]] = {}
        self._ours = 0
        self._schedulers: frozenset[str] | None = None
        self.schedulers = frozenset(schedulers) if schedulers is not None else None

    @property
    def schedulers(self) -> frozenset[str] | None:
        return self._schedulers

    @schedulers.setter
    def schedulers(self, names: frozenset[str] | None) -> None:
        self._schedulers = names
        self._shapes, self._ours = {}, 0
        for e in self.entries.values():
            self._count(e, +1)

    def _count(self, e: Entry, step: int) -> None:
        if self._schedulers is not None and e.scheduler not in self._schedulers:
            return
        self._ours += step
        shape = e.pod.shape
        slot = self._shapes.get(shape)
        if slot is None:
            if step > 0:
                self._shapes[shape] = [step, e.pod]
        elif slot[0] + step > 0:
            slot[0] += step
        else:
            del self._shapes[shape]

    def shapes(self) -> dict[Shape, PodDemand]:
        """The pod shapes among our entries, one demand of each (store lock held). Holders are not taken out: the
        roomy check only needs a bound on them."""
        return {shape: slot[1] for shape, slot in self._shapes.items()}

    def ours(self) -> int:
        """How many entries are for our schedulers (holders included; `read` leaves those out)."""
        return self._ours

    def observe(self, key: str, obj: dict[str, Any], tenancy: Tenancy = NO_NAMESPACE_RULES) -> None:
        """A pod object was recorded: it is an entry iff it is pending and asks for VRAM (its tenant allowed)."""
        demand = pending_demand(obj, tenancy)
        old = self.entries.get(key)
        if demand is None:
            if old is not None:
                del self.entries[key]
                self._count(old, -1)
                self.version += 1
            return
        created = created_at(obj)
        if math.isnan(created):
            created = old.created if old is not None else time.time()
        spec = obj.get("spec") or {}
        entry = Entry(demand, created, str(spec.get("schedulerName") or "") if isinstance(spec, dict) else "")
        if old != entry:
            self.entries[key] = entry
            if old is not None:
                self._count(old, -1)
            self._count(entry, +1)
            self.version += 1

    def drop(self, key: str) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self._count(old, -1)
            self.version += 1

    def _pending(self, state: ClusterState) -> Iterator[tuple[str, Entry]]:
        """The entries for our schedulers that hold nothing in `state`."""
        wanted = self._schedulers
        return ((k, e) for k, e in self.entries.items()
                if (wanted is None or e.scheduler in wanted) and state.holder(k) is None)

    def pending_keys(self, state: ClusterState) -> frozenset[str]:
        """The keys `read` would return, unordered (store lock held)."""
        return frozenset(k for k, _ in self._pending(state))

    def read(self, state: ClusterState) -> list[Entry]:
        """The entries for our schedulers that hold nothing in `state`, in queue order (priority desc, then oldest
        first; store lock held)."""
        out = [e for _, e in self._pending(state)]
        out.sort(key=lambda e: (-e.pod.priority, e.created, e.pod.key))
        return out
