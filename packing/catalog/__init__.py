"""GPU models and MIG geometry: the types (`types`), the loader of the data file and a user's overrides
(`load`), and MIG layout logic (`mig_layout`). The public names are re-exported here."""

from packing.catalog.load import DATA_FILE, default_catalog, load_catalog
from packing.catalog.mig_layout import (
    all_layouts,
    derive_layout,
    distribute_counts,
    layout_problems,
    max_fit,
    named_layout,
    validate_layout,
)
from packing.catalog.types import (
    MIG_DISABLED_CONFIG,
    Catalog,
    GpuModel,
    MigGeometry,
    MigProfile,
    Placement,
    ProductInfo,
    profile_key,
)

__all__ = [
    "DATA_FILE", "MIG_DISABLED_CONFIG", "Catalog", "GpuModel", "MigGeometry", "MigProfile", "Placement",
    "ProductInfo", "all_layouts", "default_catalog", "derive_layout", "distribute_counts", "layout_problems",
    "load_catalog", "max_fit", "named_layout", "profile_key", "validate_layout",
]
