"""NVIDIA's DRA driver (`gpu.nvidia.com`, kubernetes-sigs/dra-driver-nvidia-gpu) read into core GPUs.

What it publishes (dra.md §7, from the driver's `deviceinfo.go`, `mig.go`, `partitions.go`): one pool per node;
attribute `type` `gpu` | `mig` | `vfio`; whole GPUs `gpu-<minor>` with `uuid`, `productName` (the NVML name,
`NVIDIA A100-SXM4-80GB`) and capacity `memory` in bytes; MIG devices `gpu-<minor>-mig-<profile>-<id>-<start>`
with `profile`, `parentUUID`, capacity `memory` and `memorySlice<i>` (static) or counters `memory-slice-<i>`
(partitionable); GPUs that allow multiple allocations (consumable shares, `shares: N` in the `N` mode); under
dynamic MIG, every placement is a device consuming the GPU's counter set `gpu-<minor>-counter-set`.
"""

from __future__ import annotations

import re

from packing.catalog import Catalog, GpuModel
from packing.dra.driver_base import DraDriver, GpuDevices, UnitRef
from packing.dra.objects import Device, DeviceId
from packing.k8s.quantity import MIB
from packing.model import Gpu, MigInstance, Mode
from packing.vendors.nvidia.products import resolve_product

_SLICE_CAP = re.compile(r"^memorySlice(\d+)$")
_SLICE_COUNTER = re.compile(r"^memory-slice-(\d+)$")
_MINOR = re.compile(r"^gpu-(\d+)")
_START = re.compile(r"-(\d+)$")
_COMPUTE = re.compile(r"^(\d+)g\.")


def _text(device: Device, name: str) -> str:
    value = device.attribute(name)
    return value if isinstance(value, str) else ""


def _minor(device: Device) -> int:
    m = _MINOR.match(device.id.device)
    return int(m.group(1)) if m else 1 << 20


def _memory_mib(device: Device) -> int:
    found = device.capacity_of("memory")
    return int(found[1].value // MIB) if found else 0


def _slices(device: Device) -> list[int]:
    """Memory slices a MIG device covers: its `memorySlice<i>` capacities, else the counters it consumes."""
    own = [int(m.group(1)) for k in device.capacity if (m := _SLICE_CAP.match(k))]
    if own:
        return sorted(own)
    return sorted(int(m.group(1)) for use in device.consumes for k, _ in use.counters if (m := _SLICE_COUNTER.match(k)))


def _instance(device: Device) -> MigInstance | str:
    profile = _text(device, "profile")
    slices = _slices(device)
    start = slices[0] if slices else (int(m.group(1)) if (m := _START.search(device.id.device)) else -1)
    compute = _COMPUTE.match(profile)
    if not profile or start < 0 or compute is None:
        return f"MIG device {device.id} has no readable profile and placement"
    return MigInstance(profile=profile, start=start, memory_slices=max(1, len(slices)),
                       compute_slices=int(compute.group(1)), memory_mib=_memory_mib(device),
                       uuid=_text(device, "uuid") or None)


def _model(catalog: Catalog, product: str) -> GpuModel | None:
    # The NVML name (`NVIDIA A100-SXM4-80GB`) is the GFD product with spaces as dashes.
    return resolve_product(catalog, product.replace(" ", "-")).model if product else None


def _shares(device: Device) -> int | None:
    found = device.capacity_of("shares")
    return int(found[1].value) if found else None


class NvidiaDra(DraDriver):
    name = "gpu.nvidia.com"
    default_classes = ("gpu.nvidia.com", "mig.nvidia.com")

    def groups(self, devices: tuple[Device, ...]) -> list[tuple[Device, ...]]:
        by_gpu: dict[str, list[Device]] = {}
        order: dict[str, int] = {}
        for d in devices:
            kind = _text(d, "type")
            if kind not in ("gpu", "mig"):
                continue
            key = (_text(d, "parentUUID") if kind == "mig" else _text(d, "uuid")) or f"minor-{_minor(d)}"
            by_gpu.setdefault(key, []).append(d)
            order[key] = min(order.get(key, 1 << 30), _minor(d))
        return [tuple(by_gpu[k]) for k in sorted(by_gpu, key=lambda k: (order[k], k))]

    def gpu(self, index: int, group: tuple[Device, ...], catalog: Catalog,
            counters: dict[str, dict[str, object]]) -> GpuDevices | str:
        whole = [d for d in group if _text(d, "type") == "gpu"]
        migs = [d for d in group if _text(d, "type") == "mig"]
        if len(whole) > 1:
            return f"GPU {whole[0].id}: {len(whole)} whole-GPU devices share one UUID"
        first = (whole or migs)[0]
        product = _text(first, "productName")
        model = _model(catalog, product)
        uuid = _text(whole[0], "uuid") if whole else _text(migs[0], "parentUUID")
        if migs:
            return self._mig_gpu(index, whole[0] if whole else None, migs, product, model, uuid or None)
        return self._plain_gpu(index, whole[0], product, model)

    @staticmethod
    def _plain_gpu(index: int, device: Device, product: str, model: GpuModel | None) -> GpuDevices | str:
        memory = _memory_mib(device)
        if memory <= 0:
            return f"GPU {device.id} publishes no memory capacity"
        if device.allow_multiple:
            # Consumable shares: claims share the GPU's memory with no limit enforced, as time-slicing does.
            gpu = Gpu(index, memory, Mode.TIMESLICE, product=product, model=model.name if model else None,
                      uuid=_text(device, "uuid") or None, replicas=_shares(device))
            return GpuDevices(gpu, {device.id: UnitRef(index)})
        gpu = Gpu(index, memory, Mode.EXCLUSIVE, product=product, model=model.name if model else None,
                  uuid=_text(device, "uuid") or None)
        return GpuDevices(gpu, {device.id: UnitRef(index)})

    @staticmethod
    def _mig_gpu(index: int, whole: Device | None, migs: list[Device], product: str, model: GpuModel | None,
                 uuid: str | None) -> GpuDevices | str:
        units: dict[DeviceId, UnitRef] = {}
        instances: dict[str, MigInstance] = {}
        for d in migs:
            inst = _instance(d)
            if isinstance(inst, str):
                return inst
            instances.setdefault(inst.ref, inst)
            units[d.id] = UnitRef(index, mig=inst.ref)
        dynamic = any(d.consumes for d in migs)
        memory = (_memory_mib(whole) if whole is not None else 0) or (model.memory_mib if model else 0) \
            or sum(i.memory_mib for i in instances.values())
        if whole is not None and dynamic:
            units[whole.id] = UnitRef(index, whole=True)
        mode = Mode.MIG_DYNAMIC if dynamic else Mode.MIG
        mig = tuple(sorted(instances.values(), key=lambda i: (i.start, i.memory_slices)))
        gpu = Gpu(index, memory, mode, product=product, model=model.name if model else None, uuid=uuid, mig=mig)
        return GpuDevices(gpu, units)


NVIDIA_DRA = NvidiaDra()

