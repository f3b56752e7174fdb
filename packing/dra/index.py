"""Per request shape, the devices it may get on each node: computed once per inventory and reused by every pod
that asks the same (class, selectors, capacity), so a burst of like claims judges each device once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from packing.dra.capacity import to_mib
from packing.dra.eligibility import DeviceFit, SelectorCache, device_fit, request_selectors
from packing.dra.nodes import DraInventory
from packing.dra.objects import DeviceClass, ExactRequest

ShapeKey = tuple[tuple[str, ...], tuple[tuple[str, Fraction], ...]]


@dataclass(frozen=True)
class Eligible:
    """The devices one request shape may get, per node (in the node's GPU order)."""

    per_node: Mapping[str, tuple[DeviceFit, ...]]
    min_mib: int = 1  # the smallest memory one of them gives (the policy ranks nodes by a pod this large)


@dataclass
class EligibleIndex:
    inventory: DraInventory
    classes: dict[str, DeviceClass]
    cache: SelectorCache = field(default_factory=SelectorCache)
    _shapes: dict[ShapeKey, Eligible] = field(default_factory=dict)

    def rebase(self, inventory: DraInventory, classes: dict[str, DeviceClass]) -> None:
        """A new inventory or class set: shapes are recomputed (selector verdicts of unchanged devices are kept)."""
        gone = set(self.inventory.devices) - set(inventory.devices)
        self.cache.forget(gone)
        self.inventory, self.classes = inventory, classes
        self._shapes.clear()

    def eligible(self, req: ExactRequest) -> Eligible:
        """Raises `RequestError` (unknown class, bad selector)."""
        selectors = request_selectors(req, self.classes)
        key: ShapeKey = (selectors, tuple(sorted(req.capacity.items())))
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = self._compute(req, selectors)
        return hit

    def _compute(self, req: ExactRequest, selectors: tuple[str, ...]) -> Eligible:
        per_node: dict[str, tuple[DeviceFit, ...]] = {}
        smallest: int | None = None
        for name, dnode in self.inventory.nodes.items():
            fits = []
            for dev_id in dnode.units:
                fit = device_fit(req, dnode.devices[dev_id], selectors, self.cache)
                if fit is not None:
                    fits.append(fit)
                    mib = _memory_mib(fit)
                    smallest = mib if smallest is None else min(smallest, mib)
            if fits:
                per_node[name] = tuple(fits)
        return Eligible(per_node, max(1, smallest or 1))


def _memory_mib(fit: DeviceFit) -> int:
    if fit.consumed is not None:
        mem = next((v for k, v in fit.consumed.items() if k.rpartition("/")[2] == "memory"), None)
    else:
        found = fit.device.capacity_of("memory")
        mem = found[1].value if found else None
    return to_mib(mem) if mem is not None else 1
