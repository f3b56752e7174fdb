"""Where the agent's view of its GPUs comes from: a vendor's `GpuReader` (`READERS`, by the vendor's name in
`packing.vendors`; NVML's by default), or a file standing in for it; and the annotation built from what a reader
returns.

Both give the `vramfit.io/gpus` annotation value (packing/k8s/inventory.py reads it on the extender side): a JSON
list, one object per GPU (index, uuid, product, memory_mib, mode, replicas, mig: [{profile, start, uuid,
memory_mib}]). The agent needs UUIDs everywhere, since Allocate answers with them, so both sources insist on a
uuid for every GPU and every MIG instance, and both validate with the extender's own parser: what the agent
publishes is exactly what the extender will accept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from nodeagent.config import AgentConfig
from nodeagent.nvml import NvmlReader
from packing.catalog import Catalog, default_catalog
from packing.k8s.inventory import GPUS_ANNOTATION, node_from_k8s
from packing.model import InputError
from packing.vendors import DEFAULT_VENDOR
from packing.vendors.base import GpuReader, RawGpu
from packing.vendors.nvidia import NVIDIA

_FIELD_PREFIX = f"metadata.annotations[{GPUS_ANNOTATION}]"


class InventoryError(ValueError):
    """The inventory is unusable; the message names the source and the item index / field."""


# Each vendor's GPU reader, by the vendor's name (`packing.vendors.VENDORS`), made with the library binding it
# uses (None: the real one). A new vendor's agent is its reader and its line here.
READERS: dict[str, Callable[[Any], GpuReader]] = {NVIDIA.name: NvmlReader}


def reader_for(vendor: str | None = None, binding: Any = None) -> GpuReader:
    """The GPU reader of the named vendor (None: `packing.vendors.DEFAULT_VENDOR`); ValueError for a vendor
    without one."""
    name = vendor or DEFAULT_VENDOR.name
    make = READERS.get(name)
    if make is None:
        raise ValueError(f"no GPU reader for vendor {name!r} (readers: {', '.join(sorted(READERS))})")
    return make(binding)


class InventorySource(Protocol):
    def read(self) -> list[dict[str, Any]]:
        """The `vramfit.io/gpus` value, with uuids; raises InventoryError."""
        ...


# ---------------------------------------------------------------------------------------------------------------
# The annotation


def gpu_annotation(gpu: RawGpu, config: AgentConfig, node_name: str) -> dict[str, Any]:
    """One GPU's object in `vramfit.io/gpus` (see packing/k8s/inventory.py `_annotation_gpu`)."""
    item: dict[str, Any] = {"index": gpu.index, "uuid": gpu.uuid, "product": gpu.product,
                            "memory_mib": gpu.memory_mib}
    if gpu.pci_bus_id:
        item["pci_bus_id"] = gpu.pci_bus_id  # Allocate orders a pod's devices by it (CUDA_DEVICE_ORDER=PCI_BUS_ID)
    if gpu.mig_enabled:
        # The hardware decides: a GPU in MIG mode is "mig" whatever the config says. Memory is the reader's
        # figure, which the inventory prefers over the catalog's.
        item["mode"] = "mig"
        item["mig"] = [{"profile": m.profile, "start": m.start, "uuid": m.uuid, "memory_mib": m.memory_mib}
                       for m in sorted(gpu.mig, key=lambda m: m.start)]
        return item
    spec = config.mode_for(node_name, gpu.index, gpu.uuid)
    item["mode"] = spec.mode
    # `replicas` only exists for mps/timeslice in the annotation; exclusive may carry replicas=1 in the config.
    if spec.replicas is not None and spec.mode != "exclusive":
        item["replicas"] = spec.replicas
    return item


def to_annotation(gpus: Iterable[RawGpu], config: AgentConfig, node_name: str) -> list[dict[str, Any]]:
    """The `vramfit.io/gpus` value: healthy GPUs only, by index (unhealthy ones: `health_report`)."""
    return [gpu_annotation(g, config, node_name) for g in sorted(gpus, key=lambda g: g.index) if g.healthy]


def health_report(gpus: Iterable[RawGpu]) -> list[dict[str, Any]]:
    """The GPUs left out of the annotation and why: [{index, uuid, name, reason}]."""
    return [{"index": g.index, "uuid": g.uuid, "name": g.name, "reason": g.reason}
            for g in sorted(gpus, key=lambda g: g.index) if not g.healthy]


# ---------------------------------------------------------------------------------------------------------------
# Validation


class _Invalid(Exception):
    def __init__(self, item: str, problem: str) -> None:
        super().__init__(f"item {item}: {problem}")
        self.item = item  # "[1].mig[0].profile", or "(value)" for the whole value
        self.problem = problem


def _check(value: Any, catalog: Catalog | None) -> list[str]:
    """Parse as the extender does, then the uuid rule; the parser's warnings. Raises _Invalid."""
    if not isinstance(value, list):
        raise _Invalid("(value)", f"expected a JSON list of GPU objects, got {type(value).__name__}")
    node = {"metadata": {"name": "inventory", "annotations": {GPUS_ANNOTATION: json.dumps(value)}}}
    try:
        parsed = node_from_k8s(node, catalog or default_catalog())
    except InputError as exc:
        raise _Invalid(exc.field_name.removeprefix(_FIELD_PREFIX) or "(value)", exc.problem) from None
    _require_uuids(value)
    return list(parsed.warnings)


def validate_annotation(value: Any, source: str, catalog: Catalog | None = None) -> list[str]:
    """Check a `vramfit.io/gpus` value as the extender will read it, plus the agent's uuid rule.

    Returns the parser's warnings (e.g. an unknown product treated as non-MIG). Raises InventoryError naming
    `source` and the item, e.g. "gpus.json: item [1].mig[0].profile: ...".
    """
    try:
        return _check(value, catalog)
    except _Invalid as exc:
        raise InventoryError(f"{source}: {exc}") from None


def _require_uuids(value: list[Any]) -> None:
    seen: dict[str, str] = {}

    def check(uuid: Any, where: str) -> None:
        if not isinstance(uuid, str) or not uuid:
            raise _Invalid(f"{where}.uuid", "required (Allocate answers with UUIDs)")
        if uuid in seen:
            raise _Invalid(f"{where}.uuid", f"duplicate {uuid!r} (also {seen[uuid]})")
        seen[uuid] = where

    for i, gpu in enumerate(value):
        check(gpu.get("uuid"), f"[{i}]")
        for j, inst in enumerate(gpu.get("mig") or []):
            check(inst.get("uuid"), f"[{i}].mig[{j}]")


# ---------------------------------------------------------------------------------------------------------------
# Sources


class NvmlInventory:
    """The GPUs read now through a vendor's `GpuReader` (the default vendor's, NVML's, unless `reader` names
    another; `nvml` is the binding the default reader uses); modes of non-MIG GPUs from the agent's config."""

    def __init__(self, config: AgentConfig, node_name: str, nvml: Any = None, catalog: Catalog | None = None,
                 reader: GpuReader | None = None):
        self.config = config
        self.node_name = node_name
        self._reader: GpuReader = reader if reader is not None else reader_for(None, nvml)
        self._catalog = catalog
        self.last_gpus: list[RawGpu] = []
        self.rejected: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def read(self) -> list[dict[str, Any]]:
        """Raises GpuReaderUnavailable (NVML's: nodeagent.nvml.NvmlUnavailable) when the GPUs cannot be read,
        InventoryError on a bad result."""
        gpus = self._reader.read()
        kept, self.rejected = self._publishable(to_annotation(gpus, self.config, self.node_name), gpus)
        self.warnings = validate_annotation(kept, f"NVML on {self.node_name}", self._catalog)
        self.last_gpus = gpus
        return kept

    def _publishable(self, value: list[dict[str, Any]],
                     gpus: list[RawGpu]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        # One GPU the extender could not read (a MIG GPU of a model missing from the catalog, say) is left
        # out and reported, instead of keeping the whole node unpublished.
        names = {g.index: g.name for g in gpus}
        kept, rejected = [], []
        for item in value:
            try:
                _check([item], self._catalog)
            except _Invalid as exc:
                field = exc.item.removeprefix("[0]").lstrip(".") or "(GPU)"
                rejected.append({"index": item["index"], "uuid": item.get("uuid"), "name": names.get(item["index"]),
                                 "reason": f"not publishable: {field}: {exc.problem}"})
                continue
            kept.append(item)
        return kept, rejected

    def unhealthy(self) -> list[dict[str, Any]]:
        """GPUs of the last read left out of the annotation, with the reason."""
        return sorted(health_report(self.last_gpus) + self.rejected, key=lambda g: g["index"])


class FileInventory:
    """`--inventory-file GPUS.json`: the annotation value itself, for machines without NVML (tests, demos)."""

    def __init__(self, path: str | Path, catalog: Catalog | None = None):
        self.path = Path(path)
        self._catalog = catalog
        self.warnings: list[str] = []

    def read(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InventoryError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InventoryError(f"{self.path}: not valid JSON: {exc.msg} at line {exc.lineno} "
                                 f"column {exc.colno}") from None
        self.warnings = validate_annotation(value, str(self.path), self._catalog)
        return value

    def unhealthy(self) -> list[dict[str, Any]]:
        return []  # a file lists only the GPUs it means
