"""NVIDIA: GPU Feature Discovery labels (`gfd_labels`), the device plugin's resource names (`nvidia.com/gpu`,
`nvidia.com/mig-<profile>`, their `.shared` forms), and the MPS client limit per GPU family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packing.catalog import Catalog, GpuModel
from packing.k8s.demand import DEFAULT_DEVICE_PLUGIN_NAMES, DevicePluginNames
from packing.model import Gpu
from packing.vendors.nvidia.gfd_labels import L_COUNT, L_PRODUCT, from_labels, mps_client_limit


class Nvidia:
    name = "nvidia"
    plugin_names = DEFAULT_DEVICE_PLUGIN_NAMES

    def discovers(self, labels: Mapping[str, str]) -> bool:
        return L_PRODUCT in labels or L_COUNT in labels

    def gpus_from_labels(self, labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog,
                         where: str, warnings: list[str], names: DevicePluginNames) -> list[Gpu]:
        return from_labels(labels, allocatable, catalog, where, warnings, names)

    def client_limit(self, model: GpuModel | None) -> int:
        return mps_client_limit(model)


NVIDIA = Nvidia()
