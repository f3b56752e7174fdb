"""`Vendor`: what vramfit reads of one GPU vendor, behind one small interface.

A vendor says how its node labels describe GPUs (NVIDIA: GPU Feature Discovery), the device-plugin resource
names its pods ask for and what one unit of each is, its per-GPU client limit for daemon-shared modes, and how its
product strings name a model. The inventory (`packing.k8s.inventory`) asks the vendors in `packing.vendors.VENDORS` and
names none of them. A node agent reads its GPUs through a `GpuReader` (NVIDIA's: `nodeagent.nvml.NvmlReader`); the
types it returns live here, so the core stays free of any vendor's library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from packing.catalog import Catalog, GpuModel, ProductInfo
from packing.model import Gpu, Node

# What one unit of a device plugin resource is: `UNIT_GPU` is a GPU as its node's plugin counts them (a whole GPU,
# a replica of a time-sliced/MPS GPU, or a MIG device where the plugin advertises those as GPUs, see
# `Vendor.gpu_units_are_instances`); `mig-<profile>` is one hardware instance of that profile.
UNIT_GPU = "gpu"
UNIT_MIG_PREFIX = "mig-"


class PluginNames(Protocol):
    """A device plugin's resource names (the vendor's own, and those an operator renamed them to)."""

    def unit(self, resource: str) -> str | None:
        """`UNIT_GPU`, `mig-<profile>`, or None when the resource is no GPU the device plugin hands out."""
        ...


class Vendor(Protocol):
    name: str

    @property
    def plugin_names(self) -> PluginNames:
        """The device plugin's resource names when none are configured."""
        ...

    def discovers(self, labels: Mapping[str, str]) -> bool:
        """The node carries this vendor's GPU discovery labels."""
        ...

    def gpus_from_labels(self, labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog,
                         where: str, warnings: list[str], names: PluginNames) -> list[Gpu]:
        """The node's GPUs from its labels and the units the device plugin advertises; raises InputError."""
        ...

    def gpu_units_are_instances(self, node: Node) -> bool:
        """The device plugin advertises the node's hardware instances as `UNIT_GPU` units (NVIDIA: MIG strategy
        `single`), so a pod holding GPU units holds instances."""
        ...

    def client_limit(self, model: GpuModel | None) -> int:
        """Most clients one daemon-shared GPU (`ModeRules.client_limited`) of this model serves."""
        ...

    def resolve_product(self, catalog: Catalog, product: str) -> ProductInfo:
        """The vendor's product string taken apart, its base matched to a catalog model (None: unknown) by
        `Catalog.match_model(base, ignore=...)`, the words the vendor's products carry that name no model ignored."""
        ...

    def product_forms(self, product: str) -> Iterable[str]:
        """The names a GPU of this product answers to in a pod's `vramfit.io/gpu-models` (the product first)."""
        ...


class GpuReaderUnavailable(RuntimeError):
    """The vendor's management library cannot be loaded or initialised (no driver, no library): nothing can be read."""


@dataclass(frozen=True)
class RawMig:
    """One hardware instance (NVIDIA: a MIG device, a GPU instance with its compute instance) as the library reports it."""

    slot: int  # the instance's handle index on its parent GPU
    uuid: str  # "MIG-..."
    memory_mib: int  # the instance's own memory info, floor MiB
    gpu_instance_id: int
    profile_id: int  # the library's GPU-instance profile ID (19, 9, ...), as in `nvidia-smi mig -lgi`
    profile: str  # e.g. "3g.40gb", "1g.10gb+me"
    start: int  # placement start: first memory slice


@dataclass(frozen=True)
class RawGpu:
    """One physical GPU as the vendor's management library reports it."""

    index: int
    uuid: str | None
    name: str  # raw library name, e.g. "NVIDIA A100-SXM4-80GB"
    product: str  # the discovery labels' spelling, e.g. "NVIDIA-A100-SXM4-80GB"
    memory_mib: int  # total, floor MiB
    compute_capability: tuple[int, int] | None
    mig_enabled: bool  # current instance mode (a pending change only counts after a GPU reset)
    mig_pending: bool | None = None
    healthy: bool = True
    reason: str = ""  # why unhealthy
    mig: tuple[RawMig, ...] = field(default_factory=tuple)
    pci_bus_id: str | None = None  # "dddddddd:bb:dd.f": CUDA's PCI_BUS_ID device order follows it


class GpuReader(Protocol):
    """A node agent's reading of its GPUs through the vendor's management library; read-only."""

    def read(self) -> list[RawGpu]:
        """All GPUs of this machine, healthy or not, in index order. Raises GpuReaderUnavailable."""
        ...
