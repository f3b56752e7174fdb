"""The labels NVIDIA GPU Feature Discovery / the GPU Operator put on nodes -> GPUs (`node_from_k8s`'s second
source). Labels give counts, not positions, so MIG layouts are derived: a valid layout holding exactly the
advertised instances. Every bad value raises `InputError("node <name>", field, ...)`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packing.catalog import (
    Catalog,
    GpuModel,
    Placement,
    distribute_counts,
    max_fit,
    named_layout,
)
from packing.k8s.quantity import parse_quantity
from packing.model import MPS_MAX_CLIENTS, Gpu, InputError, MigInstance, Mode
from packing.vendors.base import UNIT_GPU, PluginNames
from packing.vendors.nvidia.products import resolve_product

L_PRODUCT = "nvidia.com/gpu.product"
L_COUNT = "nvidia.com/gpu.count"
L_MEMORY = "nvidia.com/gpu.memory"
L_REPLICAS = "nvidia.com/gpu.replicas"
L_SHARING = "nvidia.com/gpu.sharing-strategy"
L_MIG_STRATEGY = "nvidia.com/mig.strategy"
L_MIG_CONFIG = "nvidia.com/mig.config"
L_MIG_STATE = "nvidia.com/mig.config.state"
_MIG_LABEL = re.compile(r"^nvidia\.com/mig-(.+)\.(count|memory|replicas)$")
_SHARING = {"none": Mode.EXCLUSIVE, "time-slicing": Mode.TIMESLICE, "mps": Mode.MPS}

# CUDA MPS client limit: 48 from compute capability 7.5 on, 16 before (device plugin; gpu-facts.md §2).
_MPS_16_FAMILIES = frozenset({"pascal", "volta", "maxwell", "kepler"})


def mps_client_limit(model: GpuModel | None) -> int:
    return 16 if model is not None and model.family in _MPS_16_FAMILIES else MPS_MAX_CLIENTS



def _label_int(labels: Mapping[str, str], key: str, where: str, minimum: int = 0) -> int | None:
    if key not in labels:
        return None
    text = labels[key].strip()
    if not re.fullmatch(r"\d+", text):
        raise InputError(where, f"metadata.labels[{key}]", f"must be a whole number, got {labels[key]!r}")
    value = int(text)
    if value < minimum:
        raise InputError(where, f"metadata.labels[{key}]", f"must be >= {minimum}, got {value}")
    return value


def _alloc_count(allocatable: Mapping[str, Any], key: str) -> int | None:
    if key not in allocatable:
        return None
    try:
        value = parse_quantity(allocatable[key])
    except ValueError:
        return None
    return int(value) if value.denominator == 1 and value >= 0 else None


def _gpu_units(allocatable: Mapping[str, Any], names: PluginNames) -> int | None:
    """GPU units the device plugin advertises: `nvidia.com/gpu`, or under renameByDefault `nvidia.com/gpu.shared`,
    or a renamed resource; None when the node advertises none of them."""
    counts = [n for key in allocatable if isinstance(key, str) and names.unit(key) == UNIT_GPU
              and (n := _alloc_count(allocatable, key)) is not None]
    return sum(counts) if counts else None


def from_labels(labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog, where: str,
                 warnings: list[str], names: PluginNames) -> list[Gpu]:
    product = labels.get(L_PRODUCT, "")
    info = resolve_product(catalog, product)
    model = info.model
    count, strategy = _count_and_strategy(labels, where)
    if info.mig_invalid:
        warnings.append(f"product {product!r}: MIG strategy single with differing MIG profiles; "
                        "the device plugin advertises no GPUs")
        return []
    if count == 0:
        return []
    mig_counts, mig_mem, mig_replicas = _mig_labels(labels, where)
    if info.mig_profile is not None:
        return _single_strategy(labels, info.mig_profile, product, info.shared, model, count, catalog, where,
                                warnings)
    if strategy == "single" and any(mig_counts.values()):
        raise InputError(where, f"metadata.labels[{L_PRODUCT}]",
                         "mig.strategy single with nvidia.com/mig-<profile>.count labels but no -MIG-<profile> product")
    if any(n > 1 for n in mig_replicas.values()):
        warnings.append("shared MIG instances (nvidia.com/mig-<profile>.replicas > 1) are not modelled: "
                        "each instance holds one pod")
    memory = _label_int(labels, L_MEMORY, where, minimum=1)
    mig_gpus, layouts = _mig_gpu_layouts(labels, allocatable, model, product, count, mig_counts, strategy, where,
                                         warnings, names)
    gpu_mem = _gpu_memory(memory, model, product, where, warnings)
    gpus: list[Gpu] = []
    if mig_gpus:
        assert model is not None
        for idx, layout in enumerate(layouts):
            gpus.append(Gpu(index=idx, memory_mib=gpu_mem, mode=Mode.MIG, product=info.base, model=model.name,
                            mig=_instances(model, layout, mig_mem, catalog)))
    full = count - mig_gpus
    if full:
        mode, replicas = _sharing(labels, allocatable, info.shared, full, model, where, warnings, names)
        for idx in range(mig_gpus, count):
            gpus.append(Gpu(index=idx, memory_mib=gpu_mem, mode=mode, product=info.base,
                            model=model.name if model is not None else None, replicas=replicas))
    return gpus


def _count_and_strategy(labels: Mapping[str, str], where: str) -> tuple[int, str]:
    """The node's GPU count (MIG devices under strategy single) and its MIG strategy."""
    count = _label_int(labels, L_COUNT, where)
    if count is None:
        raise InputError(where, f"metadata.labels[{L_COUNT}]", f"missing (needed with {L_PRODUCT})")
    strategy = labels.get(L_MIG_STRATEGY, "none").strip().lower()
    if strategy not in ("none", "single", "mixed"):
        raise InputError(where, f"metadata.labels[{L_MIG_STRATEGY}]",
                         f"must be single, mixed or none, got {labels[L_MIG_STRATEGY]!r}")
    return count, strategy


def _mig_gpu_layouts(labels: Mapping[str, str], allocatable: Mapping[str, Any], model: GpuModel | None,
                     product: str, count: int, mig_counts: dict[str, int], strategy: str, where: str,
                     warnings: list[str], names: PluginNames) -> tuple[int, list[list[Placement]]]:
    """How many GPUs are MIG-enabled (the first ones) and their layouts; none on a model without MIG."""
    if model is not None and model.mig is not None and (any(mig_counts.values()) or strategy == "mixed"):
        return _mixed_layouts(labels, allocatable, model, count, mig_counts, where, warnings, names)
    if any(mig_counts.values()):
        why = f"unknown product {product!r}" if model is None else f"{model.name} does not support MIG"
        raise InputError(where, f"metadata.labels[{L_PRODUCT}]",
                         f"{why}, but the node advertises MIG instances (add the model to the catalog override file)")
    return 0, []


def _gpu_memory(memory: int | None, model: GpuModel | None, product: str, where: str, warnings: list[str]) -> int:
    """Each GPU's memory: the label's, else the catalog model's; the label is required for an unknown product."""
    if model is None:
        if memory is None:
            raise InputError(where, f"metadata.labels[{L_MEMORY}]",
                             f"missing: needed for unknown product {product!r}")
        warnings.append(f"unknown product {product!r}: treated as non-MIG with {memory} MiB")
    return memory if memory is not None else model.memory_mib if model is not None else 0


def _mig_labels(labels: Mapping[str, str], where: str) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    counts: dict[str, int] = {}
    memory: dict[str, int] = {}
    replicas: dict[str, int] = {}
    for key in labels:
        m = _MIG_LABEL.match(key)
        if m is None:
            continue
        profile, what = m.group(1), m.group(2)
        value = _label_int(labels, key, where, minimum=1 if what == "memory" else 0)
        assert value is not None
        {"count": counts, "memory": memory, "replicas": replicas}[what][profile] = value
    return counts, memory, replicas


def _sharing(labels: Mapping[str, str], allocatable: Mapping[str, Any], shared: bool, n_gpus: int,
             model: GpuModel | None, where: str, warnings: list[str],
             names: PluginNames) -> tuple[Mode, int | None]:
    """Mode and replicas of full (non-MIG) GPUs; the same sharing applies to all of them (per-node config)."""
    raw = labels.get(L_SHARING)
    replicas = _label_int(labels, L_REPLICAS, where)
    if raw is not None:
        mode = _SHARING.get(raw.strip().lower())
        if mode is None:
            raise InputError(where, f"metadata.labels[{L_SHARING}]",
                             f"must be one of {', '.join(_SHARING)}, got {raw!r}")
    else:
        # Older GFD has no sharing-strategy label: replicas > 1 or a -SHARED product means time-slicing.
        mode = Mode.TIMESLICE if shared or (replicas or 0) > 1 else Mode.EXCLUSIVE
    if mode is Mode.EXCLUSIVE:
        if replicas is not None and replicas > 1:
            warnings.append(f"{L_SHARING}=none but {L_REPLICAS}={replicas}: GPUs treated as unshared")
        return mode, None
    if replicas is None or replicas < 1:
        # Fall back to the advertised units: N GPUs x R replicas.
        units = _gpu_units(allocatable, names)
        if units and units % n_gpus == 0:
            replicas = units // n_gpus
        else:
            raise InputError(where, f"metadata.labels[{L_REPLICAS}]",
                             f"missing or 0 for sharing strategy {raw or 'time-slicing'}")
    if mode is Mode.MPS and replicas > mps_client_limit(model):
        raise InputError(where, f"metadata.labels[{L_REPLICAS}]",
                         f"MPS allows at most {mps_client_limit(model)} clients per GPU here, got {replicas}")
    return mode, replicas


def _mixed_layouts(labels: Mapping[str, str], allocatable: Mapping[str, Any], model: GpuModel, count: int,
                   mig_counts: dict[str, int], where: str, warnings: list[str],
                   names: PluginNames) -> tuple[int, list[list[Placement]]]:
    """How many GPUs are MIG-enabled and a valid layout for each, from the node-wide instance counts."""
    counts = _profile_counts(model, mig_counts, where)
    config = labels.get(L_MIG_CONFIG, "").strip()
    state = labels.get(L_MIG_STATE, "").strip()
    if state and state != "success":
        warnings.append(f"{L_MIG_STATE}={state}: MIG reconfiguration in progress; layouts follow the instances "
                        "advertised now")
    named, named_known = _named_config(model, config)
    full = _full_gpus(labels, allocatable, count, counts, named, named_known, names, where)
    mig_gpus = count - full
    if mig_gpus == 0:
        if counts:
            raise InputError(where, "metadata.labels[nvidia.com/mig-<profile>.count]",
                             f"MIG instances advertised but all {count} GPUs are in use as full GPUs")
        return 0, []
    if named is not None and all(
        sum(1 for p in named if p.profile == name) * mig_gpus == counts.get(name, 0)
        for name in {*counts, *(p.profile for p in named)}
    ):
        return mig_gpus, [list(named) for _ in range(mig_gpus)]
    layouts = distribute_counts(model, mig_gpus, counts)
    if layouts is None:
        shown = ", ".join(f"{n}x{p}" for p, n in sorted(counts.items()))
        raise InputError(where, "metadata.labels[nvidia.com/mig-<profile>.count]",
                         f"{shown} do not fit on {mig_gpus} {model.name} GPU(s) in any valid MIG layout")
    if config and not named_known:
        warnings.append(f"MIG config {config!r} is not a standard config for {model.name}: "
                        "layouts derived from the instance counts")
    return mig_gpus, layouts


def _profile_counts(model: GpuModel, mig_counts: dict[str, int], where: str) -> dict[str, int]:
    """The advertised instance counts by the catalog's profile names (labels carry sanitised names), zeros left out."""
    assert model.mig is not None
    counts: dict[str, int] = {}
    for pname, n in mig_counts.items():
        prof = model.mig.profile(pname)
        if prof is None:
            raise InputError(where, f"metadata.labels[nvidia.com/mig-{pname}.count]",
                             f"{model.name} has no MIG profile {pname!r} (known: {', '.join(model.mig.profiles)})")
        if n:
            counts[prof.name] = counts.get(prof.name, 0) + n
    return counts


def _named_config(model: GpuModel, config: str) -> tuple[list[Placement] | None, bool]:
    """The layout the MIG manager's config label names (None: MIG off), and whether the name is a known config."""
    if not config:
        return None, False
    try:
        return named_layout(model, config), True
    except ValueError:
        return None, False


def _full_gpus(labels: Mapping[str, str], allocatable: Mapping[str, Any], count: int, counts: dict[str, int],
               named: list[Placement] | None, named_known: bool, names: PluginNames, where: str) -> int:
    """How many of the node's GPUs are full (non-MIG) GPUs under the mixed strategy."""
    # Full GPUs are advertised as nvidia.com/gpu (x replicas when shared; as nvidia.com/gpu.shared or a renamed
    # resource when the sharing config renames them).
    full_units = _gpu_units(allocatable, names)
    if full_units is not None:
        reps = _label_int(labels, L_REPLICAS, where) or 1
        return min(count, full_units // max(reps, 1))
    if counts:
        return 0
    if named_known:
        return count if named is None else 0
    # No instances and no hint: nvidia.com/gpu.replicas=0 marks MIG-enabled GPUs.
    return 0 if labels.get(L_REPLICAS, "").strip() == "0" else count


def _single_strategy(labels: Mapping[str, str], profile: str, product: str, shared: bool, model: GpuModel | None,
                     count: int, catalog: Catalog, where: str, warnings: list[str]) -> list[Gpu]:
    """migStrategy=single: every GPU carries the same profile; gpu.count counts MIG devices, not GPUs."""
    device_mem = _label_int(labels, L_MEMORY, where, minimum=1)
    if model is None or model.mig is None:
        if device_mem is None:
            raise InputError(where, f"metadata.labels[{L_MEMORY}]", f"missing: needed for unknown product {product!r}")
        warnings.append(f"unknown MIG product {product!r}: each of the {count} MIG devices treated as a non-MIG "
                        f"GPU with {device_mem} MiB")
        return [Gpu(index=i, memory_mib=device_mem, mode=Mode.EXCLUSIVE, product=product) for i in range(count)]
    prof = model.mig.profile(profile)
    if prof is None:
        raise InputError(where, f"metadata.labels[{L_PRODUCT}]",
                         f"{model.name} has no MIG profile {profile!r} (known: {', '.join(model.mig.profiles)})")
    per_gpu = max_fit(model, prof.name)
    config = labels.get(L_MIG_CONFIG, "").strip()
    if config:
        try:
            named = named_layout(model, config)
        except ValueError:
            named = None
        if named and all(p.profile == prof.name for p in named):
            per_gpu = len(named)
    n_gpus = -(-count // per_gpu)
    if count % per_gpu:
        warnings.append(f"{count} {prof.name} devices are not a multiple of {per_gpu} per GPU: "
                        f"assumed {n_gpus} physical GPUs")
    layouts = distribute_counts(model, n_gpus, {prof.name: count})
    if layouts is None:  # pragma: no cover - n_gpus x per_gpu always holds count
        raise InputError(where, f"metadata.labels[{L_COUNT}]", f"{count} {prof.name} devices do not fit")
    replicas = _label_int(labels, L_REPLICAS, where)
    if shared or (replicas or 0) > 1:
        warnings.append("shared MIG devices (-SHARED / nvidia.com/gpu.replicas > 1) are not modelled: "
                        "each instance holds one pod")
    mem_by_profile = {prof.name: device_mem} if device_mem is not None else {}
    base = resolve_product(catalog, product).base
    return [Gpu(index=i, memory_mib=model.memory_mib, mode=Mode.MIG, product=base, model=model.name,
                mig=_instances(model, layout, mem_by_profile, catalog)) for i, layout in enumerate(layouts)]


def _instances(model: GpuModel, layout: list[Placement], mig_mem: Mapping[str, int],
               catalog: Catalog) -> tuple[MigInstance, ...]:
    assert model.mig is not None
    # Label keys carry the sanitised profile name (`+` as `.`); match them like the catalog does.
    reported: dict[str, int] = {}
    for pname, mem in mig_mem.items():
        prof = model.mig.profile(pname)
        if prof is not None:
            reported[prof.name] = mem
    out = []
    for pl in sorted(layout, key=lambda p: p.start):
        prof = model.mig.profiles[pl.profile]
        out.append(MigInstance(profile=prof.name, start=pl.start, memory_slices=prof.memory_slices,
                               compute_slices=prof.compute_slices,
                               memory_mib=catalog.profile_memory(model, prof.name, reported.get(prof.name))))
    return tuple(out)
