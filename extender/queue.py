"""The pending queue the extender will be asked about: unbound pods that request vramfit.io/vram.

The store keeps it in step with its pods (`Store._put_pod` / `_forget_pod`, under the store's lock): every
watched (or snapshot, or `POST /queue`) pod that is unbound, not finished and asks for VRAM is an entry, with
its demand (priority included) and creation time. `schedulers` narrows the entries read to pods for those
scheduler names (cluster mode: vramfit's profiles); None reads all (snapshot mode). Pods that already hold
units in the state (a snapshot-mode bind leaves the pod object unbound) are left out when read.

`version` moves on every change of the entries, so the planner can tell a changed queue from a quiet one.

Reading is bounded: the entries for our schedulers are also kept in queue order (`_order`, brought up to date at
the next read: a few changes by bisection, many by one sort), so `read(state, limit)` costs the pods it returns
(and the holders it skips), not the queue's size: the planner and the view read the head of a queue of 100,000
pods (anyone can create pods) as fast as that of 100.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from packing.k8s.demand import epoch_seconds, pending_demand
from packing.k8s.trust import NO_NAMESPACE_RULES, Tenancy
from packing.model import PodDemand
from packing.planning.queue_room import Shape
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


_Order = tuple[int, float, str]  # (-priority, created, key): queue order


def _order_of(e: Entry) -> _Order:
    return (-e.pod.priority, e.created, e.pod.key)


class PendingQueue:
    """key -> Entry for the pending vramfit pods (mutated under the store's lock)."""

    def __init__(self, schedulers: Iterable[str] | None = None) -> None:
        self.entries: dict[str, Entry] = {}
        self.version = 0
        # Pod shape -> [entries of ours with it, one of their demands]: what the planner's roomy check reads
        # (extender.planning.planner `_recheck`) in time per shape, not per pod.
        self._shapes: dict[Shape, list[Any]] = {}
        self._ours = 0
        self._order: list[_Order] = []  # our entries in queue order, as of the last read
        self._ops: list[tuple[int, _Order]] | None = []  # changes since (None: rebuild at the next read)
        self._schedulers: frozenset[str] | None = None
        self.schedulers = frozenset(schedulers) if schedulers is not None else None
        self._bound: set[str] = set()  # keys of the pods bound to a node (any scheduler's): `bound_count`

    @property
    def schedulers(self) -> frozenset[str] | None:
        return self._schedulers

    @schedulers.setter
    def schedulers(self, names: frozenset[str] | None) -> None:
        self._schedulers = names
        self._shapes, self._ours = {}, 0
        self._ops = None
        for e in self.entries.values():
            self._count(e, +1)

    def _count(self, e: Entry, step: int) -> None:
        if self._schedulers is not None and e.scheduler not in self._schedulers:
            return
        self._ours += step
        if self._ops is not None:
            self._ops.append((step, _order_of(e)))
            if len(self._ops) > max(64, len(self._order) // 8):
                self._ops = None  # one sort at the next read is cheaper than these bisections
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

    def shape_count(self) -> int:
        """How many pod shapes our entries have (`shapes` without building it)."""
        return len(self._shapes)

    def ours(self) -> int:
        """How many entries are for our schedulers (holders included; `read` leaves those out)."""
        return self._ours

    def bound_count(self) -> int:
        """How many recorded pods are bound to a node: a bound on the victims a preempt call can name."""
        return len(self._bound)

    def observe(self, key: str, obj: dict[str, Any], tenancy: Tenancy = NO_NAMESPACE_RULES) -> None:
        """A pod object was recorded: it is an entry iff it is pending and asks for VRAM (its tenant allowed)."""
        demand = pending_demand(obj, tenancy)
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("nodeName"):
            self._bound.add(key)
        else:
            self._bound.discard(key)
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
        self._bound.discard(key)
        old = self.entries.pop(key, None)
        if old is not None:
            self._count(old, -1)
            self.version += 1

    def _ordered(self) -> list[_Order]:
        """Our entries in queue order (store lock held): the changes since the last read applied in turn."""
        ops, self._ops = self._ops, []
        if ops is None:
            wanted = self._schedulers
            self._order = sorted(_order_of(e) for e in self.entries.values()
                                 if wanted is None or e.scheduler in wanted)
            return self._order
        order = self._order
        for step, item in ops:
            i = bisect.bisect_left(order, item)
            if step > 0:
                order.insert(i, item)
            elif i < len(order) and order[i] == item:
                del order[i]
        return order

    def _pending(self, state: ClusterState, limit: int | None) -> Iterator[tuple[str, Entry]]:
        """The entries for our schedulers that hold nothing in `state`, in queue order, at most `limit`."""
        if limit is not None and limit <= 0:
            return
        n = 0
        entries = self.entries
        for _, _, key in self._ordered():
            if state.holder(key) is None:
                yield key, entries[key]
                n += 1
                if n == limit:
                    return

    def pending_keys(self, state: ClusterState, limit: int | None = None) -> frozenset[str]:
        """The keys `read` would return, unordered (store lock held)."""
        return frozenset(k for k, _ in self._pending(state, limit))

    def read(self, state: ClusterState, limit: int | None = None) -> list[Entry]:
        """The entries for our schedulers that hold nothing in `state`, in queue order (priority desc, then oldest
        first), the first `limit` of them (None: all); store lock held."""
        return [e for _, e in self._pending(state, limit)]
