"""NVIDIA-shaped DRA objects for benchmarks (and tests, the what-if): ResourceSlices of `gpu.nvidia.com` as its
driver publishes them, its two DeviceClasses, and ResourceClaims asking memory of a GPU or a MIG device.

Shapes (shared/reference/dra.md §7, §10): one pool per node named after the node; whole GPUs `gpu-<minor>` with
capacity `memory`; consumable-share GPUs (`--consumable-shares=memory`): `allowMultipleAllocations` and a
`memory` request policy `default = max = value, min = step = 1Mi`; static MIG devices
`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<start>` with `memory` and `memorySlice<i>`; partitionable
GPUs (DynamicMIG): every placement a device consuming the GPU's counter set `gpu-<minor>-counter-set`, the whole
GPU consuming all of it, counters in a slice of their own (the 1.35+ split) and one devices slice per GPU.

Device order matters to first fit (dra.md §6, §7): the static path publishes in Go map order, emulated here by a
shuffle per slice from the caller's `rng`; the DynamicMIG path sorts devices by name (smallest profile first).
Bench simplifications: `+me` profiles are not published; compute counters are `multiprocessors` = 14 per compute
slice; attributes are those selectors and vramfit read (type, uuid, parentUUID, productName, profile).
"""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packing.catalog import Catalog, GpuModel

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
MIB = 1 << 20
SM_PER_SLICE = 14  # bench simplification: per compute slice (A100: 98 SMs over 7 slices)

WHOLE, SHARES, STATIC_MIG, DYNAMIC_MIG = "whole", "shares", "static-mig", "dynamic-mig"
FORMS = (WHOLE, SHARES, STATIC_MIG, DYNAMIC_MIG)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as published: its catalog model, how the driver exposes it, the static MIG layout
    ((profile, start), ...) and, for traces, the memory to publish instead of the model's."""

    model: str
    form: str = WHOLE
    layout: tuple[tuple[str, int], ...] = ()
    memory_mib: int | None = None
    product: str | None = None  # NVML product name; default: from the catalog model


def _uid(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{uuidlib.UUID(int=rng.getrandbits(128), version=4)}"


def nvml_name(model: GpuModel) -> str:
    """The NVML product name (`NVIDIA A100-SXM4-80GB`) of a catalog model (GFD form with the first dash a space)."""
    gfd = model.products[0] if model.products else f"NVIDIA-{model.name}"
    return gfd.replace("-", " ", 1)


def class_objects() -> list[dict[str, Any]]:
    """The driver's GPU and MIG DeviceClasses (its Helm chart's `deviceclass-{gpu,mig}.yaml`)."""
    def cls(name: str, kind: str) -> dict[str, Any]:
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}}
    return [cls(GPU_CLASS, "gpu"), cls(MIG_CLASS, "mig")]


def _qty_mib(mib: int) -> str:
    return f"{mib}Mi"


def _gpu_device(minor: int, mem_mib: int, product: str, gpu_uuid: str, shared: bool) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": f"gpu-{minor}",
                           "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid},
                                          "productName": {"string": product}},
                           "capacity": {"memory": {"value": _qty_mib(mem_mib)}}}
    if shared:
        dev["allowMultipleAllocations"] = True
        dev["capacity"]["memory"]["requestPolicy"] = {
            "default": _qty_mib(mem_mib), "validRange": {"min": "1Mi", "max": _qty_mib(mem_mib), "step": "1Mi"}}
    return dev


def _mig_name(minor: int, profile: str, gi_id: int | None, start: int) -> str:
    return f"gpu-{minor}-mig-{profile.replace('.', '')}-{gi_id if gi_id is not None else 0}-{start}"


def _mig_device(minor: int, model: GpuModel, profile: str, start: int, product: str, parent: str,
                rng: random.Random, counter_set: str | None) -> dict[str, Any]:
    assert model.mig is not None
    p = model.mig.profiles[profile]
    slices = range(start, start + p.memory_slices)
    dev: dict[str, Any] = {
        "name": _mig_name(minor, profile, p.profile_id, start),
        "attributes": {"type": {"string": "mig"}, "profile": {"string": profile},
                       "uuid": {"string": _uid(rng, "MIG")}, "parentUUID": {"string": parent},
                       "productName": {"string": product}},
        "capacity": {"multiprocessors": {"value": str(SM_PER_SLICE * p.compute_slices)},
                     "memory": {"value": _qty_mib(p.memory_mib)}}}
    if counter_set is None:
        dev["capacity"].update({f"memorySlice{i}": {"value": "1"} for i in slices})
    else:
        counters = {"multiprocessors": {"value": str(SM_PER_SLICE * p.compute_slices)},
                    "memory": {"value": _qty_mib(p.memory_mib)}}
        counters.update({f"memory-slice-{i}": {"value": "1"} for i in slices})
        dev["consumesCounters"] = [{"counterSet": counter_set, "counters": counters}]
    return dev


def _dynamic(minor: int, model: GpuModel, product: str, gpu_uuid: str, rng: random.Random
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the GPU's counter set, its devices sorted by name): every placement of every profile, the whole GPU."""
    assert model.mig is not None
    geo = model.mig
    name = f"gpu-{minor}-counter-set"
    total = {"multiprocessors": {"value": str(SM_PER_SLICE * geo.compute_slices)},
             "memory": {"value": _qty_mib(model.memory_mib)}}
    total.update({f"memory-slice-{i}": {"value": "1"} for i in range(geo.memory_slices)})
    devices = [_mig_device(minor, model, prof, start, product, gpu_uuid, rng, name)
               for prof, p in geo.profiles.items() if not prof.endswith("+me") for start in p.allowed_starts]
    whole = _gpu_device(minor, model.memory_mib, product, gpu_uuid, False)
    whole["consumesCounters"] = [{"counterSet": name, "counters": total}]
    devices.append(whole)
    return {"name": name, "counters": total}, sorted(devices, key=lambda d: d["name"])


def _slice(node: str, index: int, generation: int, count: int, rng: random.Random, body: dict[str, Any]
           ) -> dict[str, Any]:
    suffix = "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{index:05x}-{DRIVER}-{node}-{suffix}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count}, **body}}


def node_slices(node: str, gpus: Sequence[GpuSpec], catalog: Catalog, rng: random.Random,
                generation: int = 1) -> list[dict[str, Any]]:
    """One node's ResourceSlices. Static devices (whole, shares, static MIG) go in one slice, shuffled (Go map
    order); partitionable GPUs add a counters slice and one devices slice each, devices sorted by name."""
    static: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    dynamic: list[list[dict[str, Any]]] = []
    for minor, spec in enumerate(gpus):
        model = catalog.get(spec.model)
        if model is None:
            raise ValueError(f"GPU model {spec.model!r} is not in the catalog")
        product = spec.product or nvml_name(model)
        gpu_uuid = _uid(rng, "GPU")
        mem = spec.memory_mib or model.memory_mib
        if spec.form in (WHOLE, SHARES):
            static.append(_gpu_device(minor, mem, product, gpu_uuid, spec.form == SHARES))
        elif spec.form == STATIC_MIG:
            static.extend(_mig_device(minor, model, prof, start, product, gpu_uuid, rng, None)
                          for prof, start in spec.layout)
        elif spec.form == DYNAMIC_MIG:
            cs, devs = _dynamic(minor, model, product, gpu_uuid, rng)
            counter_sets.append(cs)
            dynamic.append(devs)
        else:
            raise ValueError(f"unknown GPU form {spec.form!r}; known: {', '.join(FORMS)}")
    rng.shuffle(static)
    bodies: list[dict[str, Any]] = []
    if counter_sets:
        bodies.append({"sharedCounters": counter_sets})
    if static:
        bodies.append({"devices": static})
    bodies.extend({"devices": d} for d in dynamic)
    return [_slice(node, i, generation, len(bodies), rng, b) for i, b in enumerate(bodies)]


def claim_object(namespace: str, name: str, device_class: str = GPU_CLASS, memory_mib: int | None = None,
                 count: int = 1, requests: Sequence[tuple[str, str, int | None, int]] | None = None
                 ) -> dict[str, Any]:
    """A ResourceClaim: one request `gpu` of `count` devices of the class, asking `memory` (MiB) when given; or
    several requests (name, class, memory MiB or None, count)."""
    reqs = requests if requests is not None else [("gpu", device_class, memory_mib, count)]
    out = []
    for rname, cls, mem, n in reqs:
        exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": n}
        if mem is not None:
            exactly["capacity"] = {"requests": {"memory": _qty_mib(mem)}}
        out.append({"name": rname, "exactly": exactly})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}",
                         "resourceVersion": "1"},
            "spec": {"devices": {"requests": out}}}
