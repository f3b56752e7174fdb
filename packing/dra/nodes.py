"""Pools -> core nodes: each node's GPUs as its DRA drivers publish them, and which device is which unit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from packing.catalog import Catalog
from packing.dra.driver_base import DraDriver, UnitRef
from packing.dra.objects import Device, DeviceId, Pool
from packing.dra.pools import gather_pools
from packing.model import Gpu, Node
from packing.vendors.nvidia.dra import NVIDIA_DRA

# The DRA drivers vramfit reads, by driver name: one line per driver module.
DRA_DRIVERS: dict[str, DraDriver] = {NVIDIA_DRA.name: NVIDIA_DRA}
DEFAULT_CLASSES: tuple[str, ...] = tuple(c for d in DRA_DRIVERS.values() for c in d.default_classes)


@dataclass(frozen=True)
class DraNode:
    """One node's DRA GPUs: the core node, the unit of each device, and the devices."""

    node: Node
    units: dict[DeviceId, UnitRef]
    devices: dict[DeviceId, Device]

    def device_of(self, unit: UnitRef) -> DeviceId | None:
        return next((d for d, u in self.units.items() if u == unit), None)


@dataclass(frozen=True)
class DraInventory:
    nodes: dict[str, DraNode]
    devices: dict[DeviceId, Device]  # every device of a complete pool, GPU units or not
    problems: tuple[str, ...]
    incomplete: tuple[str, ...]

    def node_of(self, device: DeviceId) -> str | None:
        d = self.devices.get(device)
        return d.node if d is not None else None


def _node_gpus(name: str, pools: list[Pool], catalog: Catalog, problems: list[str]
               ) -> tuple[list[Gpu], dict[DeviceId, UnitRef]]:
    gpus: list[Gpu] = []
    units: dict[DeviceId, UnitRef] = {}
    for pool in pools:
        driver = DRA_DRIVERS[pool.driver]
        for group in driver.groups(pool.devices):
            read = driver.gpu(len(gpus), group, catalog, dict(pool.counter_sets))  # type: ignore[arg-type]
            if isinstance(read, str):
                problems.append(f"node {name}: {read}")
                continue
            gpus.append(read.gpu)
            units.update(read.units)
    return gpus, units


def dra_inventory(slices: Iterable[Mapping[str, Any]], catalog: Catalog) -> DraInventory:
    """The DRA nodes of the ResourceSlices of every driver vramfit reads (node-local pools only)."""
    found = gather_pools(slices, frozenset(DRA_DRIVERS))
    by_node: dict[str, list[Pool]] = {}
    devices: dict[DeviceId, Device] = {}
    problems = list(found.problems)
    for pool in found.pools:
        for d in pool.devices:
            devices[d.id] = d
        if pool.node is None:
            problems.append(f"pool {pool.driver}/{pool.name} is not node-local: not allocated by vramfit")
            continue
        by_node.setdefault(pool.node, []).append(pool)
    nodes: dict[str, DraNode] = {}
    for name, pools in sorted(by_node.items()):
        gpus, units = _node_gpus(name, pools, catalog, problems)
        if gpus:
            own = {d.id: d for p in pools for d in p.devices}
            nodes[name] = DraNode(Node(name, tuple(gpus)), units, own)
    return DraInventory(nodes, devices, tuple(problems), found.incomplete)


def combine(parts: Iterable[DraInventory], unplaced: int = 0) -> DraInventory:
    """One inventory of several (each node's own); `unplaced`: slices naming no node (not allocated by vramfit)."""
    nodes: dict[str, DraNode] = {}
    devices: dict[DeviceId, Device] = {}
    problems: list[str] = []
    incomplete: list[str] = []
    for part in parts:
        nodes.update(part.nodes)
        devices.update(part.devices)
        problems.extend(part.problems)
        incomplete.extend(part.incomplete)
    if unplaced:
        problems.append(f"{unplaced} ResourceSlices are not node-local: their devices are not allocated by vramfit")
    return DraInventory(nodes, devices, tuple(problems), tuple(incomplete))


def with_host(dra: Node, host: Node | None) -> Node:
    """A DRA node with the host side (CPU, memory, labels) of its Node object, when known."""
    if host is None:
        return dra
    return replace(host, gpus=dra.gpus, warnings=host.warnings)
