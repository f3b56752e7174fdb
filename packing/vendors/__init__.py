"""The GPU vendors vramfit reads, one module each behind `Vendor`: `VENDORS` is the registry."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from packing.catalog import Catalog, GpuModel
from packing.model import Node
from packing.vendors.base import UNIT_GPU, UNIT_MIG_PREFIX, PluginNames, Vendor
from packing.vendors.nvidia import NVIDIA

__all__ = ["DEFAULT_PLUGIN_NAMES", "DEFAULT_VENDOR", "UNIT_GPU", "UNIT_MIG_PREFIX", "VENDORS", "PluginNames",
           "Vendor", "gpu_names", "node_vendor", "plugin_unit", "product_model", "vendor_for"]

VENDORS: tuple[Vendor, ...] = (NVIDIA,)
# The vendor of GPUs described exactly (the node agent's `vramfit.io/gpus` annotation, snapshot files).
DEFAULT_VENDOR: Vendor = NVIDIA
# The device plugin's resource names when the operator configures none.
DEFAULT_PLUGIN_NAMES: PluginNames = DEFAULT_VENDOR.plugin_names


def vendor_for(labels: Mapping[str, str]) -> Vendor | None:
    """The first vendor whose discovery labels the node carries; None for a node without GPU labels."""
    return next((v for v in VENDORS if v.discovers(labels)), None)


def node_vendor(node: Node) -> Vendor:
    """The vendor of a node's GPUs: by its discovery labels, else the default (GPUs described exactly)."""
    return vendor_for(node.labels) or DEFAULT_VENDOR


def plugin_unit(resource: str) -> str | None:
    """The unit a resource stands for under any vendor's own device plugin names; None: no device plugin GPU."""
    return next((u for v in VENDORS if (u := v.plugin_names.unit(resource)) is not None), None)


def product_model(catalog: Catalog, product: str) -> GpuModel | None:
    """The catalog model of a product string as the first vendor that knows it reads it; None: unknown."""
    return next((m for v in VENDORS if (m := v.resolve_product(catalog, product).model) is not None), None)


@functools.lru_cache(maxsize=4096)
def gpu_names(model: str | None, product: str) -> frozenset[str]:
    """The names, lower case, a GPU of this catalog model and product string answers to in a pod's
    `vramfit.io/gpu-models`: the model and every vendor's `product_forms`. Cached: the filter asks per GPU."""
    names = {form.lower() for v in VENDORS for form in v.product_forms(product)}
    names.add((model or "").lower())
    names.discard("")
    return frozenset(names)
