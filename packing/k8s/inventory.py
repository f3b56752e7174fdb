"""Kubernetes Node JSON -> `packing.model.Node`.

A node's GPUs come from the first source present:
1. the `vramfit.io/gpus` annotation (exact, one object per GPU), validated strictly;
2. the labels NVIDIA GPU Feature Discovery / the GPU Operator put on nodes. Labels give counts, not positions,
   so MIG layouts are derived (a valid layout holding exactly the advertised instances).
Node-reported memory always wins over the catalog. Every bad value raises `InputError("node <name>", field, ...)`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from packing.catalog import (
    Catalog,
    GpuModel,
    Placement,
    distribute_counts,
    layout_problems,
    max_fit,
    named_layout,
)
from packing.k8s.demand import DEFAULT_DEVICE_PLUGIN_NAMES, UNIT_GPU, DevicePluginNames
from packing.k8s.quantity import MIB, parse_quantity
from packing.model import MPS_MAX_CLIENTS, Gpu, InputError, MigInstance, Mode, Node

GPUS_ANNOTATION = "vramfit.io/gpus"
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
_GPU_KEYS = ("index", "uuid", "product", "memory_mib", "mode", "replicas", "mig")
_MIG_KEYS = ("profile", "start", "uuid", "memory_mib")


# CUDA MPS client limit: 48 from compute capability 7.5 on, 16 before (device plugin; gpu-facts.md §2).
_MPS_16_FAMILIES = frozenset({"pascal", "volta", "maxwell", "kepler"})


def _mps_limit(model: GpuModel | None) -> int:
    return 16 if model is not None and model.family in _MPS_16_FAMILIES else MPS_MAX_CLIENTS


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def node_from_k8s(obj: dict[str, Any], catalog: Catalog,
                  names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES) -> Node:
    """Build a Node (GPUs, allocatable CPU/memory, labels, warnings) from a Kubernetes Node object.

    `names`: the device plugin's resource names; the advertised GPU units (`nvidia.com/gpu`, or
    `nvidia.com/gpu.shared` / a renamed resource when replicated) tell full GPUs from MIG ones and replicas."""
    if not isinstance(obj, dict):
        raise InputError("node", "(object)", f"must be a mapping, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise InputError("node", "metadata", "missing or not a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("node", "metadata.name", "missing or not a string")
    where = f"node {name}"
    labels = _str_map(meta.get("labels"), where, "metadata.labels")
    annotations = _str_map(meta.get("annotations"), where, "metadata.annotations")
    cpu_milli, memory_mib, allocatable = _allocatable(obj.get("status"), where)
    warnings: list[str] = []
    if GPUS_ANNOTATION in annotations:
        gpus = _from_annotation(annotations[GPUS_ANNOTATION], catalog, where, warnings)
    elif L_PRODUCT in labels or L_COUNT in labels:
        gpus = _from_labels(labels, allocatable, catalog, where, warnings, names)
    else:
        gpus = []
    return Node(name=name, gpus=tuple(gpus), cpu_milli=cpu_milli, memory_mib=memory_mib, labels=dict(labels),
                warnings=tuple(warnings))


def _str_map(v: Any, where: str, field: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(where, field, "must be a mapping")
    out: dict[str, str] = {}
    for k, val in v.items():
        if not isinstance(k, str):
            raise InputError(where, f"{field}[{k!r}]", "key must be a string")
        # YAML snapshots written by hand may carry unquoted numbers; the API server would hold strings.
        if isinstance(val, bool) or not isinstance(val, str | int):
            raise InputError(where, f"{field}[{k}]", f"must be a string, got {val!r}")
        out[k] = str(val)
    return out


def _allocatable(status: Any, where: str) -> tuple[int | None, int | None, dict[str, Any]]:
    if status is None:
        return None, None, {}
    if not isinstance(status, dict):
        raise InputError(where, "status", "must be a mapping")
    alloc = status.get("allocatable")
    if alloc is None:
        return None, None, {}
    if not isinstance(alloc, dict):
        raise InputError(where, "status.allocatable", "must be a mapping")
    cpu = mem = None
    # Capacity rounds down: a node cannot hand out a partial millicore or MiB it does not have.
    if "cpu" in alloc:
        try:
            cpu = math.floor(parse_quantity(alloc["cpu"]) * 1000)
        except ValueError as exc:
            raise InputError(where, "status.allocatable.cpu", str(exc)) from exc
    if "memory" in alloc:
        try:
            mem = math.floor(parse_quantity(alloc["memory"]) / MIB)
        except ValueError as exc:
            raise InputError(where, "status.allocatable.memory", str(exc)) from exc
    return cpu, mem, alloc


# ---------------------------------------------------------------------------------------------------------------
# 1. the vramfit.io/gpus annotation


def _from_annotation(text: str, catalog: Catalog, where: str, warnings: list[str]) -> list[Gpu]:
    base = f"metadata.annotations[{GPUS_ANNOTATION}]"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, base, f"not valid JSON: {exc.msg} at position {exc.pos}") from exc
    if not isinstance(data, list):
        raise InputError(where, base, f"must be a JSON list of GPU objects, got {type(data).__name__}")
    gpus: list[Gpu] = []
    seen: dict[int, int] = {}
    for i, item in enumerate(data):
        gpu = _annotation_gpu(item, f"{base}[{i}]", catalog, where, warnings)
        if gpu.index in seen:
            raise InputError(where, f"{base}[{i}].index",
                             f"duplicate GPU index {gpu.index} (also in {base}[{seen[gpu.index]}])")
        seen[gpu.index] = i
        gpus.append(gpu)
    return sorted(gpus, key=lambda g: g.index)


def _annotation_gpu(item: Any, f: str, catalog: Catalog, where: str, warnings: list[str]) -> Gpu:
    if not isinstance(item, dict):
        raise InputError(where, f, f"must be a JSON object, got {type(item).__name__}")
    for k in item:
        if k not in _GPU_KEYS:
            raise InputError(where, f"{f}.{k}", f"unknown field (known: {', '.join(_GPU_KEYS)})")
    index = item.get("index")
    if not _is_int(index) or index < 0:
        raise InputError(where, f"{f}.index", f"must be a non-negative integer, got {index!r}")
    uuid = item.get("uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise InputError(where, f"{f}.uuid", f"must be a string, got {uuid!r}")
    product = item.get("product", "")
    if not isinstance(product, str):
        raise InputError(where, f"{f}.product", f"must be a string, got {product!r}")
    info = catalog.resolve_product(product) if product else None
    model = info.model if info is not None else None
    mem = item.get("memory_mib")
    if mem is not None and (not _is_int(mem) or mem < 1):
        raise InputError(where, f"{f}.memory_mib", f"must be a positive integer (MiB), got {mem!r}")
    if mem is None:
        if model is None:
            why = f"unknown product {product!r}" if product else "no product given"
            raise InputError(where, f"{f}.memory_mib", f"required: {why}")
        mem = model.memory_mib
    elif product and model is None:
        warnings.append(f"GPU {index}: unknown product {product!r}: treated as non-MIG with {mem} MiB")
    mode_raw = item.get("mode")
    try:
        mode = Mode(mode_raw) if isinstance(mode_raw, str) else None
    except ValueError:
        mode = None
    if mode is None:
        raise InputError(where, f"{f}.mode", f"must be one of {', '.join(m.value for m in Mode)}, got {mode_raw!r}")
    replicas = item.get("replicas")
    if replicas is not None:
        if mode not in (Mode.MPS, Mode.TIMESLICE):
            raise InputError(where, f"{f}.replicas", f"only applies to modes mps and timeslice, not {mode.value}")
        if not _is_int(replicas) or replicas < 1:
            raise InputError(where, f"{f}.replicas", f"must be an integer >= 1, got {replicas!r}")
        if mode is Mode.MPS and replicas > _mps_limit(model):
            raise InputError(where, f"{f}.replicas",
                             f"MPS allows at most {_mps_limit(model)} clients per GPU here, got {replicas}")
    elif mode is Mode.TIMESLICE:
        raise InputError(where, f"{f}.replicas", "required for mode timeslice (the device plugin's replica count)")
    if "mig" in item and mode is Mode.MPS:
        raise InputError(where, f"{f}.mode", "MPS on MIG devices is not supported by the NVIDIA device plugin")
    if info is not None and (info.mig_profile is not None or info.mig_invalid) and mode is not Mode.MIG:
        raise InputError(where, f"{f}.product", f"a MIG device product ({product!r}) needs mode mig")
    instances: tuple[MigInstance, ...] = ()
    if mode is Mode.MIG:
        if model is None:
            raise InputError(where, f"{f}.product",
                             f"mode mig needs a known MIG-capable product, got {product!r} "
                             "(add the model to the catalog override file)")
        if model.mig is None:
            raise InputError(where, f"{f}.mode", f"{model.name} does not support MIG")
        instances = _annotation_mig(item.get("mig", []), f"{f}.mig", model, catalog, where)
    elif "mig" in item:
        raise InputError(where, f"{f}.mig", f"only applies to mode mig, not {mode.value}")
    return Gpu(index=index, memory_mib=mem, mode=mode, product=info.base if info is not None else "",
               model=model.name if model is not None else None, uuid=uuid, replicas=replicas, mig=instances)


def _annotation_mig(raw: Any, f: str, model: GpuModel, catalog: Catalog, where: str) -> tuple[MigInstance, ...]:
    assert model.mig is not None
    if not isinstance(raw, list):
        raise InputError(where, f, f"must be a list of MIG instances, got {type(raw).__name__}")
    layout: list[Placement] = []
    extra: list[tuple[str | None, int | None]] = []
    for j, inst in enumerate(raw):
        fj = f"{f}[{j}]"
        if not isinstance(inst, dict):
            raise InputError(where, fj, f"must be a JSON object, got {type(inst).__name__}")
        for k in inst:
            if k not in _MIG_KEYS:
                raise InputError(where, f"{fj}.{k}", f"unknown field (known: {', '.join(_MIG_KEYS)})")
        pname = inst.get("profile")
        if not isinstance(pname, str):
            raise InputError(where, f"{fj}.profile", f"must be a string, got {pname!r}")
        prof = model.mig.profile(pname)
        if prof is None:
            raise InputError(where, f"{fj}.profile",
                             f"{model.name} has no MIG profile {pname!r} (known: {', '.join(model.mig.profiles)})")
        start = inst.get("start")
        if not _is_int(start) or start < 0:
            raise InputError(where, f"{fj}.start", f"must be a non-negative integer, got {start!r}")
        uuid = inst.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            raise InputError(where, f"{fj}.uuid", f"must be a string, got {uuid!r}")
        mem = inst.get("memory_mib")
        if mem is not None and (not _is_int(mem) or mem < 1):
            raise InputError(where, f"{fj}.memory_mib", f"must be a positive integer (MiB), got {mem!r}")
        layout.append(Placement(prof.name, start))
        extra.append((uuid, mem))
    problems = layout_problems(model, layout)
    if problems:
        bad, attr, msg = problems[0]
        field = f if bad is None else f"{f}[{bad}]" + (f".{attr}" if attr else "")
        raise InputError(where, field, f"invalid MIG layout for {model.name}: {msg}")
    out = []
    for pl, (inst_uuid, inst_mem) in zip(layout, extra, strict=True):
        p = model.mig.profiles[pl.profile]
        out.append(MigInstance(profile=pl.profile, start=pl.start, memory_slices=p.memory_slices,
                               compute_slices=p.compute_slices,
                               memory_mib=catalog.profile_memory(model, pl.profile, inst_mem), uuid=inst_uuid))
    return tuple(sorted(out, key=lambda m: m.start))


# ---------------------------------------------------------------------------------------------------------------
# 2. GPU Feature Discovery / GPU Operator labels


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


def _gpu_units(allocatable: Mapping[str, Any], names: DevicePluginNames) -> int | None:
    """GPU units the device plugin advertises: `nvidia.com/gpu`, or under renameByDefault `nvidia.com/gpu.shared`,
    or a renamed resource; None when the node advertises none of them."""
    counts = [n for key in allocatable if isinstance(key, str) and names.unit(key) == UNIT_GPU
              and (n := _alloc_count(allocatable, key)) is not None]
    return sum(counts) if counts else None


def _from_labels(labels: Mapping[str, str], allocatable: Mapping[str, Any], catalog: Catalog, where: str,
                 warnings: list[str], names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES) -> list[Gpu]:
    product = labels.get(L_PRODUCT, "")
    info = catalog.resolve_product(product)
    model = info.model
    count = _label_int(labels, L_COUNT, where)
    if count is None:
        raise InputError(where, f"metadata.labels[{L_COUNT}]", f"missing (needed with {L_PRODUCT})")
    strategy = labels.get(L_MIG_STRATEGY, "none").strip().lower()
    if strategy not in ("none", "single", "mixed"):
        raise InputError(where, f"metadata.labels[{L_MIG_STRATEGY}]",
                         f"must be single, mixed or none, got {labels[L_MIG_STRATEGY]!r}")
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
    mig_gpus = 0
    layouts: list[list[Placement]] = []
    if model is not None and model.mig is not None and (any(mig_counts.values()) or strategy == "mixed"):
        mig_gpus, layouts = _mixed_layouts(labels, allocatable, model, count, mig_counts, where, warnings,
                                           names)
    elif any(mig_counts.values()):
        why = f"unknown product {product!r}" if model is None else f"{model.name} does not support MIG"
        raise InputError(where, f"metadata.labels[{L_PRODUCT}]",
                         f"{why}, but the node advertises MIG instances (add the model to the catalog override file)")
    if model is None:
        if memory is None:
            raise InputError(where, f"metadata.labels[{L_MEMORY}]",
                             f"missing: needed for unknown product {product!r}")
        warnings.append(f"unknown product {product!r}: treated as non-MIG with {memory} MiB")
    gpu_mem = memory if memory is not None else model.memory_mib if model is not None else 0
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
             names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES) -> tuple[Mode, int | None]:
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
    if mode is Mode.MPS and replicas > _mps_limit(model):
        raise InputError(where, f"metadata.labels[{L_REPLICAS}]",
                         f"MPS allows at most {_mps_limit(model)} clients per GPU here, got {replicas}")
    return mode, replicas


def _mixed_layouts(labels: Mapping[str, str], allocatable: Mapping[str, Any], model: GpuModel, count: int,
                   mig_counts: dict[str, int], where: str, warnings: list[str],
                   names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES) -> tuple[int, list[list[Placement]]]:
    """How many GPUs are MIG-enabled and a valid layout for each, from the node-wide instance counts."""
    assert model.mig is not None
    counts: dict[str, int] = {}
    for pname, n in mig_counts.items():
        prof = model.mig.profile(pname)
        if prof is None:
            raise InputError(where, f"metadata.labels[nvidia.com/mig-{pname}.count]",
                             f"{model.name} has no MIG profile {pname!r} (known: {', '.join(model.mig.profiles)})")
        if n:
            counts[prof.name] = counts.get(prof.name, 0) + n
    config = labels.get(L_MIG_CONFIG, "").strip()
    state = labels.get(L_MIG_STATE, "").strip()
    if state and state != "success":
        warnings.append(f"{L_MIG_STATE}={state}: MIG reconfiguration in progress; layouts follow the instances "
                        "advertised now")
    named: list[Placement] | None = None
    named_known = False
    if config:
        try:
            named = named_layout(model, config)
            named_known = True
        except ValueError:
            named_known = False
    # Full (non-MIG) GPUs under the mixed strategy are advertised as nvidia.com/gpu (x replicas when shared; as
    # nvidia.com/gpu.shared or a renamed resource when the sharing config renames them).
    full_units = _gpu_units(allocatable, names)
    if full_units is not None:
        reps = _label_int(labels, L_REPLICAS, where) or 1
        full = min(count, full_units // max(reps, 1))
    elif counts:
        full = 0
    elif named_known:
        full = count if named is None else 0
    else:
        # No instances and no hint: nvidia.com/gpu.replicas=0 marks MIG-enabled GPUs.
        full = 0 if labels.get(L_REPLICAS, "").strip() == "0" else count
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
    base = catalog.resolve_product(product).base
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
