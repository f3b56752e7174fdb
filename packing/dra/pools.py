"""ResourceSlices -> pools: only the newest generation of a pool counts, and only once all its slices are seen
(`pool.resourceSliceCount`), as kube-scheduler's allocator reads them (dra.md §2). Devices and counter sets of one
pool may sit in different slices (1.35+)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from packing.dra.objects import Device, Pool
from packing.dra.parse import slice_devices
from packing.model import InputError


@dataclass
class _Gathered:
    generation: int
    expected: int
    node: str | None
    slices: int = 0
    devices: list[Device] = field(default_factory=list)
    counters: dict[str, dict[str, Fraction]] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolSet:
    pools: tuple[Pool, ...]
    incomplete: tuple[str, ...]  # "driver/pool" still missing slices of their newest generation
    problems: tuple[str, ...]  # slices that could not be read, with the reason


def gather_pools(slices: Iterable[Mapping[str, Any]], drivers: frozenset[str] | None = None) -> PoolSet:
    """Pools of the given drivers (None: all) from ResourceSlice objects, newest complete generation only."""
    gathered: dict[tuple[str, str], _Gathered] = {}
    problems: list[str] = []
    for obj in slices:
        try:
            driver, pool, gen, count, node, devices, counters = slice_devices(obj)
        except InputError as err:
            problems.append(str(err))
            continue
        if drivers is not None and driver not in drivers:
            continue
        g = gathered.get((driver, pool))
        if g is None or gen > g.generation:
            g = gathered[(driver, pool)] = _Gathered(gen, count, node)
        elif gen < g.generation:
            continue
        g.slices += 1
        g.devices.extend(devices)
        g.counters.update(counters)
    pools, incomplete = [], []
    for (driver, name), g in sorted(gathered.items()):
        if g.slices < g.expected:
            incomplete.append(f"{driver}/{name}")
            continue
        pools.append(Pool(driver, name, g.generation, g.node, tuple(g.devices), g.counters))
    return PoolSet(tuple(pools), tuple(incomplete), tuple(problems))
