"""`Vendor`: what vramfit reads of one GPU vendor, behind one small interface.

A vendor says how its node labels describe GPUs (NVIDIA: GPU Feature Discovery), the device-plugin resource
names its pods ask for, and its per-GPU client limit for daemon-shared modes. The inventory
(`packing.k8s.inventory`) asks the vendors in `packing.vendors.VENDORS` and names none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from packing.catalog import Catalog, GpuModel
from packing.k8s.demand import DevicePluginNames
from packing.model import Gpu


class Vendor(Protocol):
    name: str
    plugin_names: DevicePluginNames  # the device plugin's resource names when none are configured

    def discovers(self, labels: Mapping[str, str]) -> bool:
        """The node carries this vendor's GPU discovery labels."""
        ...

    def gpus_from_labels(self, labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog,
                         where: str, warnings: list[str], names: DevicePluginNames) -> list[Gpu]:
        """The node's GPUs from its labels and the units the device plugin advertises; raises InputError."""
        ...

    def client_limit(self, model: GpuModel | None) -> int:
        """Most clients one daemon-shared GPU (`ModeRules.client_limited`) of this model serves."""
        ...
