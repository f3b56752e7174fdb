"""The GPU vendors vramfit reads, one module each behind `Vendor`: `VENDORS` is the registry."""

from __future__ import annotations

from collections.abc import Mapping

from packing.vendors.base import Vendor
from packing.vendors.nvidia import NVIDIA

__all__ = ["DEFAULT_VENDOR", "VENDORS", "Vendor", "vendor_for"]

VENDORS: tuple[Vendor, ...] = (NVIDIA,)
# The vendor of GPUs described exactly (the node agent's `vramfit.io/gpus` annotation, snapshot files).
DEFAULT_VENDOR: Vendor = NVIDIA


def vendor_for(labels: Mapping[str, str]) -> Vendor | None:
    """The first vendor whose discovery labels the node carries; None for a node without GPU labels."""
    return next((v for v in VENDORS if v.discovers(labels)), None)
