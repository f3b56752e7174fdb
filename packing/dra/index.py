"""Per request shape, the devices it may get on each node: computed once per inventory and reused by every pod
that asks the same (class, selectors, capacity), so a burst of like claims judges each device once.

The cluster's GPU-unit devices sit in one flat table (node order); a shape is one boolean array over it: the
selectors' verdicts (one array per selector set; a device's verdict is kept while the device object is the same)
and the capacity's (judged once per group of devices that publish the same capacities). Per node, the fits are
built only for the nodes a pod's allocation looks at."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from packing.dra.capacity import MEMORY, memory_of
from packing.dra.eligibility import DeviceFit, SelectorCache, capacity_fit, request_selectors
from packing.dra.nodes import DraInventory
from packing.dra.objects import Device, DeviceClass, ExactRequest
from packing.k8s.quantity import bytes_to_mib

ShapeKey = tuple[tuple[str, ...], tuple[tuple[str, Fraction], ...]]


@dataclass
class _Table:
    """The inventory's GPU-unit devices, flat, in node order."""

    devices: list[Device]
    nodes: list[str]
    starts: np.ndarray  # [len(nodes) + 1] offsets into `devices`
    group: np.ndarray  # [D] capacity group of each device (devices publishing the same capacities)
    groups: list[Device]  # one device of each group

    @classmethod
    def of(cls, inventory: DraInventory) -> _Table:
        devices: list[Device] = []
        nodes: list[str] = []
        starts = [0]
        for name, dnode in inventory.nodes.items():
            devices.extend(dnode.devices[d] for d in dnode.units)
            nodes.append(name)
            starts.append(len(devices))
        index: dict[tuple[bool, str], int] = {}
        groups: list[Device] = []
        group = np.empty(len(devices), dtype=np.int64)
        for i, d in enumerate(devices):
            key = (d.allow_multiple, d.capacity_key or f"#{d.id}")
            if key not in index:
                index[key] = len(groups)
                groups.append(d)
            group[i] = index[key]
        return cls(devices, nodes, np.asarray(starts, dtype=np.int64), group, groups)


class _PerNode(Mapping[str, tuple[DeviceFit, ...]]):
    """node -> the fits of one shape there, built when first asked (most nodes never are)."""

    def __init__(self, table: _Table, ok: np.ndarray, consumed: list[dict[str, Fraction] | None]) -> None:
        self._table, self._ok, self._consumed = table, ok, consumed
        counts = np.add.reduceat(ok.astype(np.int64), table.starts[:-1]) if ok.size else np.zeros(0, np.int64)
        counts[table.starts[:-1] == table.starts[1:]] = 0  # reduceat reads an empty node's slot from the next
        self.counts = counts
        self._row = {n: i for i, n in enumerate(table.nodes)}
        self.table_nodes = table.nodes  # the node of each entry of `counts`
        self._built: dict[str, tuple[DeviceFit, ...]] = {}

    def __getitem__(self, node: str) -> tuple[DeviceFit, ...]:
        hit = self._built.get(node)
        if hit is not None:
            return hit
        i = self._row.get(node)
        if i is None or self.counts[i] == 0:
            raise KeyError(node)
        t = self._table
        fits = tuple(DeviceFit(t.devices[k], self._consumed[t.group[k]])
                     for k in range(int(t.starts[i]), int(t.starts[i + 1])) if self._ok[k])
        self._built[node] = fits
        return fits

    def __iter__(self) -> Iterator[str]:
        return (self._table.nodes[i] for i in np.flatnonzero(self.counts).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.counts))

    def with_at_least(self, need: int) -> set[str]:
        """The nodes with at least `need` of these devices."""
        return {self._table.nodes[i] for i in np.flatnonzero(self.counts >= max(need, 1)).tolist()}


@dataclass(frozen=True)
class Eligible:
    """The devices one request shape may get, per node (in the node's GPU order)."""

    per_node: _PerNode
    min_mib: int = 1  # the smallest memory one of them gives (the policy ranks nodes by a pod this large)


@dataclass
class EligibleIndex:
    inventory: DraInventory
    classes: dict[str, DeviceClass]
    cache: SelectorCache = field(default_factory=SelectorCache)
    _shapes: dict[ShapeKey, Eligible] = field(default_factory=dict)
    _verdicts: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)
    _table: _Table | None = None

    def rebase(self, inventory: DraInventory, classes: dict[str, DeviceClass]) -> None:
        """A new inventory or class set: shapes are recomputed (selector verdicts of unchanged devices are kept)."""
        gone = set(self.inventory.devices) - set(inventory.devices)
        self.cache.forget(gone)
        self.inventory, self.classes = inventory, classes
        self._shapes.clear()
        self._verdicts.clear()
        self._table = None

    def eligible(self, req: ExactRequest) -> Eligible:
        """Raises `RequestError` (unknown class, bad selector)."""
        selectors = request_selectors(req, self.classes)
        key: ShapeKey = (selectors, tuple(sorted(req.capacity.items())))
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = self._compute(req, selectors)
        return hit

    def _compute(self, req: ExactRequest, selectors: tuple[str, ...]) -> Eligible:
        if self._table is None:
            self._table = _Table.of(self.inventory)
        t = self._table
        verdict = self._verdicts.get(selectors)
        if verdict is None:
            verdict = self._verdicts[selectors] = np.fromiter(
                (not d.tainted and self.cache.matches(selectors, d) for d in t.devices), dtype=bool,
                count=len(t.devices))
        fits = [capacity_fit(req, rep, self.cache) for rep in t.groups]
        group_ok = np.fromiter((f is not None for f in fits), dtype=bool, count=len(fits))
        consumed = [f.consumed if f is not None else None for f in fits]
        ok = verdict & group_ok[t.group] if len(t.devices) else np.zeros(0, dtype=bool)
        used = {int(g) for g in np.unique(t.group[ok])} if ok.any() else set()
        smallest = min((_memory_mib(f) for g, f in enumerate(fits) if f is not None and g in used), default=1)
        return Eligible(_PerNode(t, ok, consumed), max(1, smallest))


def _memory_mib(fit: DeviceFit) -> int:
    if fit.consumed is not None:
        mem = memory_of(fit.consumed)
    else:
        found = fit.device.capacity_of(MEMORY)
        mem = found[1].value if found else None
    return bytes_to_mib(mem) if mem is not None else 1
