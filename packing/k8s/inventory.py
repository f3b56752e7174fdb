"""Kubernetes Node JSON -> `packing.model.Node`.

A node's GPUs come from the first source present:
1. the `vramfit.io/gpus` annotation (exact, one object per GPU), validated strictly;
2. the labels of the first vendor in `packing.vendors.VENDORS` whose discovery labels the node carries
   (NVIDIA: GPU Feature Discovery / the GPU Operator). Labels give counts, not positions, so MIG layouts
   are derived (a valid layout holding exactly the advertised instances).
Node-reported memory always wins over the catalog. Every bad value raises `InputError("node <name>", field, ...)`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard

from packing.catalog import (
    Catalog,
    GpuModel,
    Placement,
    layout_problems,
)
from packing.k8s.quantity import MIB, parse_quantity
from packing.model import Gpu, InputError, MigInstance, Mode, Node
from packing.modes import MODES, mode_rules
from packing.vendors import DEFAULT_PLUGIN_NAMES, DEFAULT_VENDOR, PluginNames, vendor_for

GPUS_ANNOTATION = "vramfit.io/gpus"
# pci_bus_id: the node agent's only (its Allocate numbers CUDA devices by it); the core reads no more than its form.
_GPU_KEYS = ("index", "uuid", "product", "memory_mib", "mode", "replicas", "mig", "pci_bus_id")
_PCI_BUS_ID = re.compile(r"^[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_MIG_KEYS = ("profile", "start", "uuid", "memory_mib")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def node_from_k8s(obj: dict[str, Any], catalog: Catalog,
                  names: PluginNames = DEFAULT_PLUGIN_NAMES) -> Node:
    """Build a Node (GPUs, allocatable CPU/memory, labels, warnings) from a Kubernetes Node object.

    `names`: the device plugin's resource names; the advertised GPU units (NVIDIA: `nvidia.com/gpu`, or
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
    elif (vendor := vendor_for(labels)) is not None:
        gpus = vendor.gpus_from_labels(labels, allocatable, catalog, where, warnings, names)
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


def _check_object(item: Any, known: tuple[str, ...], where: str, f: str) -> None:
    """One entry of the annotation: a JSON object with only known fields (typos must not pass silently)."""
    if not isinstance(item, dict):
        raise InputError(where, f, f"must be a JSON object, got {type(item).__name__}")
    for k in item:
        if k not in known:
            raise InputError(where, f"{f}.{k}", f"unknown field (known: {', '.join(known)})")


def _annotation_gpu(item: Any, f: str, catalog: Catalog, where: str, warnings: list[str]) -> Gpu:
    _check_object(item, _GPU_KEYS, where, f)
    index = item.get("index")
    if not _is_int(index) or index < 0:
        raise InputError(where, f"{f}.index", f"must be a non-negative integer, got {index!r}")
    uuid = item.get("uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise InputError(where, f"{f}.uuid", f"must be a string, got {uuid!r}")
    bus = item.get("pci_bus_id")
    if bus is not None and not (isinstance(bus, str) and _PCI_BUS_ID.match(bus)):
        raise InputError(where, f"{f}.pci_bus_id", f"must be a PCI bus id like 00000000:3b:00.0, got {bus!r}")
    product = item.get("product", "")
    if not isinstance(product, str):
        raise InputError(where, f"{f}.product", f"must be a string, got {product!r}")
    info = DEFAULT_VENDOR.resolve_product(catalog, product) if product else None
    model = info.model if info is not None else None
    mem = _annotation_memory(item.get("memory_mib"), f, where, index, product, model, warnings)
    mode = _annotation_mode(item.get("mode"), f, where)
    replicas = _annotation_replicas(item.get("replicas"), f, where, mode, model)
    rules = mode_rules(mode)
    if "mig" in item and rules.client_limited:
        raise InputError(where, f"{f}.mode", "MPS on MIG devices is not supported by the NVIDIA device plugin")
    if info is not None and (info.mig_profile is not None or info.mig_invalid) and not rules.instanced:
        raise InputError(where, f"{f}.product", f"a MIG device product ({product!r}) needs mode mig")
    instances: tuple[MigInstance, ...] = ()
    if rules.instanced:
        instances = _annotation_mig(item.get("mig", []), f"{f}.mig", _mig_model(model, product, f, where),
                                    catalog, where)
    elif "mig" in item:
        raise InputError(where, f"{f}.mig", f"only applies to mode mig, not {mode.value}")
    return Gpu(index=index, memory_mib=mem, mode=mode, product=info.base if info is not None else "",
               model=model.name if model is not None else None, uuid=uuid, replicas=replicas, mig=instances)


def _annotation_memory(mem: Any, f: str, where: str, index: int, product: str, model: GpuModel | None,
                       warnings: list[str]) -> int:
    """The GPU's memory: as reported, else the catalog model's; required for an unknown product."""
    if mem is not None and (not _is_int(mem) or mem < 1):
        raise InputError(where, f"{f}.memory_mib", f"must be a positive integer (MiB), got {mem!r}")
    if mem is None:
        if model is None:
            why = f"unknown product {product!r}" if product else "no product given"
            raise InputError(where, f"{f}.memory_mib", f"required: {why}")
        return model.memory_mib
    if product and model is None:
        warnings.append(f"GPU {index}: unknown product {product!r}: treated as non-MIG with {mem} MiB")
    return int(mem)


def _annotation_mode(mode_raw: Any, f: str, where: str) -> Mode:
    try:
        mode = Mode(mode_raw) if isinstance(mode_raw, str) else None
    except ValueError:
        mode = None
    if mode is None:
        raise InputError(where, f"{f}.mode", f"must be one of {', '.join(m.value for m in Mode)}, got {mode_raw!r}")
    return mode


def _annotation_replicas(replicas: Any, f: str, where: str, mode: Mode, model: GpuModel | None) -> int | None:
    """The device plugin's replica count, as the mode uses one (`ModeRules.replica_use`)."""
    rules = mode_rules(mode)
    if replicas is None:
        if rules.replica_use == "required":
            raise InputError(where, f"{f}.replicas",
                             f"required for mode {mode.value} (the device plugin's replica count)")
        return None
    if rules.replica_use == "refused":
        replicated = " and ".join(m.value for m in MODES if mode_rules(m).replica_use != "refused")
        raise InputError(where, f"{f}.replicas", f"only applies to modes {replicated}, not {mode.value}")
    if not _is_int(replicas) or replicas < 1:
        raise InputError(where, f"{f}.replicas", f"must be an integer >= 1, got {replicas!r}")
    if rules.client_limited and replicas > DEFAULT_VENDOR.client_limit(model):
        raise InputError(where, f"{f}.replicas",
                         f"MPS allows at most {DEFAULT_VENDOR.client_limit(model)} clients per GPU here, got {replicas}")
    return int(replicas)


def _mig_model(model: GpuModel | None, product: str, f: str, where: str) -> GpuModel:
    """The catalog model of a GPU in an instanced mode: known and MIG-capable."""
    if model is None:
        raise InputError(where, f"{f}.product",
                         f"mode mig needs a known MIG-capable product, got {product!r} "
                         "(add the model to the catalog override file)")
    if model.mig is None:
        raise InputError(where, f"{f}.mode", f"{model.name} does not support MIG")
    return model


def _annotation_mig(raw: Any, f: str, model: GpuModel, catalog: Catalog, where: str) -> tuple[MigInstance, ...]:
    assert model.mig is not None
    if not isinstance(raw, list):
        raise InputError(where, f, f"must be a list of MIG instances, got {type(raw).__name__}")
    layout: list[Placement] = []
    extra: list[tuple[str | None, int | None]] = []
    for j, inst in enumerate(raw):
        fj = f"{f}[{j}]"
        _check_object(inst, _MIG_KEYS, where, fj)
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


AGENT_RESOURCE = "vramfit.io/gpu"  # what the node agent's device plugin advertises (nodeagent.allocate)


def agent_absent(obj: Any) -> str | None:
    """Why vramfit cannot place pods on this node, or None when it can: only a node whose kubelet advertises
    `vramfit.io/gpu` runs the node agent, and kube-scheduler offers vramfit pods (which the webhook gives a
    `vramfit.io/gpu` limit) to no other node. One rule for the extender, `inspect` and the what-if."""
    status = obj.get("status") if isinstance(obj, dict) else None
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    raw = allocatable.get(AGENT_RESOURCE) if isinstance(allocatable, dict) else None
    try:
        if raw is not None and parse_quantity(raw) > 0:
            return None
    except ValueError:
        return f"status.allocatable[{AGENT_RESOURCE}] is {raw!r}, not a count"
    return (f"no {AGENT_RESOURCE} in status.allocatable: the vramfit node agent does not run here, so "
            "kube-scheduler never offers this node to vramfit pods")
