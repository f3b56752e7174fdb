"""What a DRA driver's devices mean to vramfit, behind one small interface: `DraDriver`. A driver module (NVIDIA's:
`packing.vendors.nvidia.dra`) groups a pool's devices by physical GPU and turns each group into one core `Gpu`
plus the unit each device stands for; `packing.dra.nodes` builds nodes from that and names no vendor or mode."""

from __future__ import annotations

from dataclasses import dataclass

from packing.catalog import Catalog
from packing.dra.objects import Device, DeviceId
from packing.model import Gpu


@dataclass(frozen=True)
class UnitRef:
    """The core unit a device stands for: GPU `gpu` of its node, taken whole (`whole`), one hardware instance
    (`mig`: `<profile>@<start>`), or a share of the GPU's memory (neither)."""

    gpu: int
    mig: str | None = None
    whole: bool = False


@dataclass(frozen=True)
class GpuDevices:
    """One physical GPU as a driver published it: the core `Gpu` and the unit of each of its devices."""

    gpu: Gpu
    units: dict[DeviceId, UnitRef]


class DraDriver:
    """One DRA driver's reading. Subclasses set `name` (the driver name in slices) and `default_classes` (the
    DeviceClasses vramfit manages when the operator names none)."""

    name = "abstract"
    default_classes: tuple[str, ...] = ()

    def groups(self, devices: tuple[Device, ...]) -> list[tuple[Device, ...]]:
        """The devices of one pool grouped by physical GPU, in the GPUs' order; devices that are no GPU unit
        (e.g. passthrough) are left out."""
        raise NotImplementedError

    def gpu(self, index: int, group: tuple[Device, ...], catalog: Catalog,
            counters: dict[str, dict[str, object]]) -> GpuDevices | str:
        """The core GPU of one group (its index on the node), or why the group cannot be read."""
        raise NotImplementedError
