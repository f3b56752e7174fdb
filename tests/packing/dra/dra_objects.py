"""NVIDIA-shaped `resource.k8s.io/v1` objects for the DRA core's tests: ResourceSlices as the
`gpu.nvidia.com` driver publishes them (dra.md §7, §10), DeviceClasses, ResourceClaims, and a ready-made
allocator over them. Plain dicts in wire format, so every test goes through `packing.dra.parse`."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from packing.catalog import Catalog, load_catalog
from packing.dra.allocate import Allocator, PodClaims
from packing.dra.index import EligibleIndex
from packing.dra.nodes import DraInventory, dra_inventory
from packing.dra.objects import Claim, DeviceClass
from packing.dra.parse import claim as parse_claim
from packing.dra.parse import device_class
from packing.model import Isolation, MigInstance
from packing.modes.mig_dynamic import MEDIA_SUFFIX, placements_for
from packing.policies import get_policy
from packing.state import ClusterState
from packing.vendors.nvidia.products import resolve_product

NV = "gpu.nvidia.com"
MIB = 2**20
GI = 2**30
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
T4 = "Tesla T4"
# GPU instance profile ids (`nvidia-smi mig -lgip` on A100/H100); the driver puts them in MIG device names.
GI_PROFILE_ID = {"1g.10gb": 19, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0}
GPU_CLASS_EXPR = f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'"
MIG_CLASS_EXPR = f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'mig'"


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    return load_catalog()


def uuid_of(node: str, minor: int) -> str:
    """A stable, unique GPU UUID per (node, minor)."""
    digits = f"{abs(hash((node, minor))) % 16**12:012x}"
    return f"GPU-00000000-0000-4000-8000-{digits}"


def _attrs(kind: str, product: str, uuid: str, **extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"type": {"string": kind}, "uuid": {"string": uuid}, "productName": {"string": product},
                             "brand": {"string": "Nvidia"}, "cudaComputeCapability": {"version": "8.0.0"},
                             "driverVersion": {"version": "580.126.20"}}
    for k, v in extra.items():
        attrs[k] = v
    return attrs


def quantity_bytes(n: int) -> str:
    """Bytes as the driver writes them (BinarySI): whole GiB as `Gi`, whole MiB as `Mi`, else bare."""
    if n % GI == 0:
        return f"{n // GI}Gi"
    if n % MIB == 0:
        return f"{n // MIB}Mi"
    return str(n)


def whole_gpu(minor: int, node: str, product: str = A100, memory_mib: int = 81920,
              shares: str | int | None = None) -> dict[str, Any]:
    """`gpu-<minor>`; `shares` is the driver's `--consumable-shares` mode (`memory`, `unlimited` or N)."""
    dev: dict[str, Any] = {"name": f"gpu-{minor}", "attributes": _attrs("gpu", product, uuid_of(node, minor)),
                           "capacity": {"memory": {"value": quantity_bytes(memory_mib * MIB)}}}
    if shares is None:
        return dev
    dev["allowMultipleAllocations"] = True
    mem = quantity_bytes(memory_mib * MIB)
    if shares == "memory":
        policy = {"default": mem, "validRange": {"min": "1Mi", "max": mem, "step": "1Mi"}}
    else:
        policy = {"default": "0", "validRange": {"min": "0", "max": mem, "step": "1Mi"}}
    dev["capacity"]["memory"]["requestPolicy"] = policy
    if isinstance(shares, int):
        dev["capacity"]["shares"] = {"value": str(shares), "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}}}
    return dev


def mig_name(minor: int, inst: MigInstance) -> str:
    return (f"gpu-{minor}-mig-{inst.profile.replace('.', '')}-{GI_PROFILE_ID.get(inst.profile, 99)}"
            f"-{inst.start}")


def static_mig(minor: int, node: str, inst: MigInstance, product: str = A100) -> dict[str, Any]:
    """A pre-created MIG device: `memory` and one `memorySlice<i>` capacity per slice it covers."""
    cap: dict[str, Any] = {"multiprocessors": {"value": str(14 * inst.compute_slices)},
                           "memory": {"value": quantity_bytes(inst.memory_mib * MIB)}}
    for i in range(inst.start, inst.start + inst.memory_slices):
        cap[f"memorySlice{i}"] = {"value": "1"}
    parent = uuid_of(node, minor)
    attrs = _attrs("mig", product, f"MIG-{parent[4:]}-{inst.start}", profile={"string": inst.profile},
                   parentUUID={"string": parent})
    return {"name": mig_name(minor, inst), "attributes": attrs, "capacity": cap}


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def _slice_counters(inst_start: int, slices: int) -> dict[str, Any]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(inst_start, inst_start + slices)}


def model_of(product: str) -> Any:
    return resolve_product(catalog(), product.replace(" ", "-")).model


def partitionable_gpu(minor: int, node: str, product: str = A100, with_whole: bool = True
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(counter set, devices) of a GPU under dynamic MIG: every placement (but `+me`, whose name is no DNS
    label) as a device consuming its memory slices, and the whole GPU consuming all of them."""
    model = model_of(product)
    geo = model.mig
    counters = {"memory": {"value": quantity_bytes(model.memory_mib * MIB)}}
    counters.update(_slice_counters(0, geo.memory_slices))
    cset = {"name": counter_set_name(minor), "counters": counters}
    devices: list[dict[str, Any]] = []
    parent = uuid_of(node, minor)
    for inst in placements_for(model):
        if inst.profile.endswith(MEDIA_SUFFIX):
            continue
        used = _slice_counters(inst.start, inst.memory_slices)
        used["memory"] = {"value": quantity_bytes(inst.memory_mib * MIB)}
        devices.append({"name": mig_name(minor, inst),
                        "attributes": _attrs("mig", product, f"MIG-dyn-{minor}-{inst.ref}",
                                             profile={"string": inst.profile}, parentUUID={"string": parent}),
                        "capacity": {"memory": {"value": quantity_bytes(inst.memory_mib * MIB)}},
                        "consumesCounters": [{"counterSet": counter_set_name(minor), "counters": used}]})
    if with_whole:
        devices.append({"name": f"gpu-{minor}", "attributes": _attrs("gpu", product, parent),
                        "capacity": {"memory": {"value": quantity_bytes(model.memory_mib * MIB)}},
                        "consumesCounters": [{"counterSet": counter_set_name(minor), "counters": counters}]})
    return cset, sorted(devices, key=lambda d: str(d["name"]))


def resource_slice(node: str, devices: Sequence[dict[str, Any]] = (), generation: int = 1, count: int = 1,
                   index: int = 0, counters: Sequence[dict[str, Any]] = (), driver: str = NV,
                   pool: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "nodeName": node,
                            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count}}
    if devices:
        spec["devices"] = list(devices)
    if counters:
        spec["sharedCounters"] = list(counters)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{index:05x}-{driver}-{node}-g{generation}"}, "spec": spec}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a generated node: kind `whole` | `shared` | `mig` (static) | `partitionable`."""

    kind: str
    product: str = A100
    shares: str | int = "memory"  # `shared` only
    layout: tuple[str, ...] = ()  # `mig` only: `<profile>@<start>` refs of the pre-created instances


def static_layout(product: str, refs: Iterable[str]) -> list[MigInstance]:
    by_ref = {i.ref: i for i in placements_for(model_of(product))}
    return [by_ref[r] for r in refs]


def node_slices(node: str, gpus: Sequence[GpuSpec], split: bool = True, generation: int = 1
                ) -> list[dict[str, Any]]:
    """A node's slices: split (1.35+: one counters-only slice, then one devices slice per GPU) or combined."""
    per_gpu: list[list[dict[str, Any]]] = []
    counters: list[dict[str, Any]] = []
    for minor, g in enumerate(gpus):
        model = model_of(g.product)
        if g.kind == "whole":
            per_gpu.append([whole_gpu(minor, node, g.product, model.memory_mib)])
        elif g.kind == "shared":
            per_gpu.append([whole_gpu(minor, node, g.product, model.memory_mib, shares=g.shares)])
        elif g.kind == "mig":
            per_gpu.append([static_mig(minor, node, inst, g.product) for inst in static_layout(g.product, g.layout)])
        elif g.kind == "partitionable":
            cset, devs = partitionable_gpu(minor, node, g.product)
            counters.append(cset)
            per_gpu.append(devs)
        else:
            raise ValueError(g.kind)
    if not split:
        return [resource_slice(node, [d for devs in per_gpu for d in devs], generation, 1, 0, counters)]
    out: list[dict[str, Any]] = []
    total = len(per_gpu) + (1 if counters else 0)
    if counters:
        out.append(resource_slice(node, (), generation, total, 0, counters))
    for devs in per_gpu:
        out.append(resource_slice(node, devs, generation, total, len(out)))
    return out


def class_obj(name: str, expr: str, config: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expr}}]}
    if config:
        spec["config"] = list(config)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


CLASS_OBJS = (class_obj("gpu.nvidia.com", GPU_CLASS_EXPR), class_obj("mig.nvidia.com", MIG_CLASS_EXPR))


def exact(name: str, cls: str = "gpu.nvidia.com", count: int | None = None, memory: str | None = None,
          selectors: Sequence[str] = (), all_devices: bool = False, **capacity: str) -> dict[str, Any]:
    """One request with `exactly` (as stored: allocationMode and count filled in)."""
    body: dict[str, Any] = {"deviceClassName": cls}
    if all_devices:
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = count if count is not None else 1
    caps = dict(capacity)
    if memory is not None:
        caps["memory"] = memory
    if caps:
        body["capacity"] = {"requests": caps}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    """A `firstAvailable` request; each sub is an `exact(...)` entry (its `exactly` body gets the name)."""
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subs]}


def claim_obj(name: str, namespace: str = "team-a", requests: Sequence[dict[str, Any]] = (),
              constraints: Sequence[dict[str, Any]] = (), config: Sequence[dict[str, Any]] = (),
              uid: str | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests) or [exact("gpu")]}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                         "resourceVersion": "1"},
            "spec": {"devices": devices}}


@dataclass
class World:
    """An inventory, its classes, a state and an allocator over them."""

    inventory: DraInventory
    classes: dict[str, DeviceClass]
    state: ClusterState
    allocator: Allocator
    slices: list[dict[str, Any]] = field(default_factory=list)


def world(slices: Sequence[dict[str, Any]], classes: Sequence[dict[str, Any]] = CLASS_OBJS,
          policy: str = "vramfit") -> World:
    inv = dra_inventory(slices, catalog())
    cls = {c.name: c for c in map(device_class, classes)}
    state = ClusterState([n.node for n in inv.nodes.values()])
    alloc = Allocator(state, inv.nodes, EligibleIndex(inv, cls), get_policy(policy))
    return World(inv, cls, state, alloc, list(slices))


def pod(key: str, *claims: dict[str, Any] | Claim, tenant: str = "team-a", isolation: Isolation = Isolation.NONE,
        node: str | None = None) -> PodClaims:
    parsed = tuple(c if isinstance(c, Claim) else parse_claim(c) for c in claims)
    return PodClaims(key, f"uid-{key}", tenant, isolation, parsed, node=node)
