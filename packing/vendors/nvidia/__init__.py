"""NVIDIA: GPU Feature Discovery labels (`gfd_labels`), the device plugin's resource names (`plugin_names`:
`nvidia.com/gpu`, `nvidia.com/mig-<profile>`, their `.shared` forms), GFD's product strings (`products`:
`-MIG-<profile>`, `-SHARED`), and the MPS client limit per GPU family."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from packing.catalog import Catalog, GpuModel, ProductInfo
from packing.model import Gpu, Node
from packing.vendors.base import PluginNames
from packing.vendors.nvidia.gfd_labels import L_COUNT, L_PRODUCT, from_labels, mps_client_limit
from packing.vendors.nvidia.plugin_names import DEFAULT_DEVICE_PLUGIN_NAMES, mig_devices_are_gpus
from packing.vendors.nvidia.products import product_forms, resolve_product


class Nvidia:
    name = "nvidia"
    plugin_names = DEFAULT_DEVICE_PLUGIN_NAMES

    def discovers(self, labels: Mapping[str, str]) -> bool:
        return L_PRODUCT in labels or L_COUNT in labels

    def gpus_from_labels(self, labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog,
                         where: str, warnings: list[str], names: PluginNames) -> list[Gpu]:
        return from_labels(labels, allocatable, catalog, where, warnings, names)

    def gpu_units_are_instances(self, node: Node) -> bool:
        return mig_devices_are_gpus(node)

    def client_limit(self, model: GpuModel | None) -> int:
        return mps_client_limit(model)

    def resolve_product(self, catalog: Catalog, product: str) -> ProductInfo:
        return resolve_product(catalog, product)

    def product_forms(self, product: str) -> Iterable[str]:
        return product_forms(product)


NVIDIA = Nvidia()
