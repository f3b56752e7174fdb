"""Pod (Kubernetes JSON) -> what it asks of vramfit, and what an already-bound pod holds.

Every malformed value raises `InputError` naming the pod and the field: a wrong annotation must never
become a silent default (a pod that asked for hardware isolation and got time-slicing is a breach).

VRAM, from the resource `vramfit.io/vram` (per container, summed as Kubernetes sums requests) or else the
annotation of the same name, follows one unit rule in both places (`packing.k8s.quantity.vram_to_mib`): a bare
number is MiB, a quantity with a unit is bytes (`14Gi` = 14336 MiB), and the pod's VRAM must be between
1 MiB and 16 TiB.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from packing.k8s.pod_keys import check_pod_keys
from packing.k8s.quantity import MAX_VRAM_MIB, count_value, cpu_to_milli, quantity_to_mib, vram_to_mib
from packing.k8s.trust import (
    LABEL_TENANT,
    NO_NAMESPACE_RULES,
    TRUST_AS_WRITTEN,
    PodTrust,
    Tenancy,
    signed_assignment,
)
from packing.model import GpuGrant, InputError, Isolation, PodDemand
from packing.vendors import DEFAULT_PLUGIN_NAMES, UNIT_GPU, UNIT_MIG_PREFIX, PluginNames, plugin_unit

# The NVIDIA device plugin's names, re-exported for the shells that configure them (the extender, kubeio).

VRAM_RESOURCE = "vramfit.io/vram"
ANN_VRAM = "vramfit.io/vram"
ANN_GPUS = "vramfit.io/gpus"
ANN_ISOLATION = "vramfit.io/isolation"
ANN_MODELS = "vramfit.io/gpu-models"
# "true": each of the pod's processes uses one of its GPUs (e.g. one DDP rank per GPU), so its GPUs may be
# MIG instances (a CUDA process enumerates one MIG device at most).
ANN_GPU_PER_PROCESS = "vramfit.io/gpu-per-process"
ANN_ASSIGNMENT = "vramfit.io/assignment"
# The bind handshake (extender binds, node agent answers Allocate): written with the assignment in the Binding.
ANN_PHASE = "vramfit.io/phase"
PHASE_ALLOCATING = "allocating"
ANN_BOUND_AT = "vramfit.io/bound-at"
MAX_GPUS_PER_POD = 64
MAX_PLUGIN_UNITS = MAX_GPUS_PER_POD * 48  # 64 GPUs x 48 MPS replicas: no real pod holds more


def _dict(value: Any, obj: str, field_name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(obj, field_name, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, obj: str, field_name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(obj, field_name, f"expected a list, got {type(value).__name__}")
    return value


def pod_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`; raises InputError when metadata.name is missing."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, dict):
        raise InputError("pod", "metadata", "missing or not an object")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("pod", "metadata.name", "missing or not a string")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise InputError(f"pod {name}", "metadata.namespace", "not a string")
    return f"{namespace}/{name}"


def _container_amount(container: dict[str, Any], resource: str, obj: str, path: str,
                      parse: Any) -> int | None:
    resources = _dict(container.get("resources"), obj, f"{path}.resources")
    for section in ("requests", "limits"):
        values = _dict(resources.get(section), obj, f"{path}.resources.{section}")
        if resource in values:
            try:
                return int(parse(values[resource]))
            except ValueError as err:
                raise InputError(obj, f"{path}.resources.{section}[{resource}]", str(err)) from None
    return None


def _effective(obj_name: str, spec: dict[str, Any], resource: str, parse: Any) -> int | None:
    """Kubernetes' effective pod request: max(sum of app containers + sidecars, each init's peak).

    Returns None when no container names the resource at all.
    """
    seen = False
    running = 0  # sidecars (restartable init containers) keep running beside what starts after them
    init_peak = 0
    for i, c in enumerate(_list(spec.get("initContainers"), obj_name, "spec.initContainers")):
        c = _dict(c, obj_name, f"spec.initContainers[{i}]")
        amount = _container_amount(c, resource, obj_name, f"spec.initContainers[{i}]", parse)
        seen |= amount is not None
        amount = amount or 0
        if c.get("restartPolicy") == "Always":
            running += amount
            init_peak = max(init_peak, running)
        else:
            init_peak = max(init_peak, running + amount)
    total = running
    for i, c in enumerate(_list(spec.get("containers"), obj_name, "spec.containers")):
        c = _dict(c, obj_name, f"spec.containers[{i}]")
        amount = _container_amount(c, resource, obj_name, f"spec.containers[{i}]", parse)
        seen |= amount is not None
        total += amount or 0
    return max(total, init_peak) if seen else None


def _annotation_int(ann: dict[str, Any], key: str, obj: str, low: int, high: int) -> int | None:
    if key not in ann:
        return None
    raw = ann[key]
    try:
        if not isinstance(raw, str) or not raw.strip().isdigit():
            raise ValueError
        value = int(raw.strip())
    except ValueError:
        raise InputError(obj, f"metadata.annotations[{key}]", f"expected a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise InputError(obj, f"metadata.annotations[{key}]", f"must be between {low} and {high}, got {value}")
    return value


def _namespace(meta: Mapping[str, Any]) -> str:
    namespace = meta.get("namespace") or "default"
    return namespace if isinstance(namespace, str) else "default"


def pod_host(spec: Mapping[str, Any], who: str) -> tuple[int, int]:
    """The pod's effective CPU (milli) and memory (MiB) requests, as kube-scheduler sums them."""
    s = dict(spec)
    return (_effective(who, s, "cpu", cpu_to_milli) or 0), (_effective(who, s, "memory", quantity_to_mib) or 0)


def pod_isolation(ann: Mapping[str, Any], who: str) -> Isolation:
    """The weakest isolation the pod accepts (`vramfit.io/isolation`, default none); InputError if unknown."""
    raw_iso = ann.get(ANN_ISOLATION, Isolation.NONE.value)
    try:
        return Isolation(str(raw_iso).strip().lower())
    except ValueError:
        raise InputError(who, f"metadata.annotations[{ANN_ISOLATION}]",
                         f"must be one of hardware, process, none; got {raw_iso!r}") from None


def pod_gpu_per_process(ann: Mapping[str, Any], who: str) -> bool:
    """`vramfit.io/gpu-per-process`: "true" or "false" (default false); InputError for anything else."""
    raw = ann.get(ANN_GPU_PER_PROCESS, "false")
    text = str(raw).strip().lower() if isinstance(raw, str | bool) else ""
    if text not in ("true", "false"):
        raise InputError(who, f"metadata.annotations[{ANN_GPU_PER_PROCESS}]",
                         f"must be \"true\" or \"false\"; got {raw!r}")
    return text == "true"


def pod_tenant(meta: Mapping[str, Any], who: str, tenancy: Tenancy) -> str:
    """The pod's tenant by its namespace's rules (`packing.k8s.trust`); InputError when the pod names one its
    namespace does not allow."""
    labels = _dict(meta.get("labels"), who, "metadata.labels")
    return tenancy.resolve(_namespace(meta), labels.get(LABEL_TENANT), who)


def held_tenant(meta: Mapping[str, Any], who: str, tenancy: Tenancy) -> tuple[str, str]:
    """A bound pod's tenant, and a note when the one it names was not allowed: it then counts as its
    namespace's tenant, because what it holds must stay booked whatever its label says."""
    try:
        return pod_tenant(meta, who, tenancy), ""
    except InputError as err:
        return tenancy.of(_namespace(meta)).tenant, str(err)


def pod_demand(obj: Mapping[str, Any], tenancy: Tenancy = NO_NAMESPACE_RULES) -> PodDemand | None:
    """What the pod asks of vramfit, or None when it asks for no VRAM. Its tenant follows `tenancy`."""
    who = f"pod {pod_key(obj)}"
    meta, spec = _dict(obj.get("metadata"), who, "metadata"), _dict(obj.get("spec"), who, "spec")
    check_pod_keys(meta, spec, who)
    demand = _demand(obj, lambda meta, who: pod_tenant(meta, who, tenancy))
    if demand is not None:
        _check_one_request(who, _dict(meta.get("annotations"), who, "metadata.annotations"), spec, demand)
    return demand


def _check_one_request(who: str, ann: Mapping[str, Any], spec: dict[str, Any], demand: PodDemand) -> None:
    """A pod asks for its GPU one way: the VRAM written twice with two values, or beside a device plugin GPU
    (which would hand it a second, unbooked GPU), has no one meaning; say so instead of picking one."""
    if ANN_VRAM in ann and _effective(who, spec, VRAM_RESOURCE, vram_to_mib) is not None:
        try:
            written = vram_to_mib(ann[ANN_VRAM])
        except ValueError as err:
            raise InputError(who, f"metadata.annotations[{ANN_VRAM}]", str(err)) from None
        if written != demand.vram_mib:
            raise InputError(who, f"metadata.annotations[{ANN_VRAM}]",
                             f"{written} MiB, but the containers' {VRAM_RESOURCE} resources ask for "
                             f"{demand.vram_mib} MiB: write the VRAM once (the resource), not twice")
    for section in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec.get(section), who, f"spec.{section}")):
            resources = c.get("resources") if isinstance(c, dict) else None
            for part in ("limits", "requests"):
                values = resources.get(part) if isinstance(resources, dict) else None
                for name in values if isinstance(values, dict) else ():
                    if isinstance(name, str) and plugin_unit(name) is not None:
                        raise InputError(who, f"spec.{section}[{i}].resources.{part}[{name}]",
                                         f"the pod asks vramfit for VRAM and the device plugin for {name}: it "
                                         f"would get a second GPU nobody booked; ask for {VRAM_RESOURCE} only")


def _demand(obj: Mapping[str, Any], tenant_of: Callable[[Mapping[str, Any], str], str]) -> PodDemand | None:
    key = pod_key(obj)
    who = f"pod {key}"
    meta = _dict(obj.get("metadata"), who, "metadata")
    spec = _dict(obj.get("spec"), who, "spec")
    ann = _dict(meta.get("annotations"), who, "metadata.annotations")

    vram = _effective(who, spec, VRAM_RESOURCE, vram_to_mib)
    if vram is None and ANN_VRAM in ann:
        try:
            vram = vram_to_mib(ann[ANN_VRAM])
        except ValueError as err:
            raise InputError(who, f"metadata.annotations[{ANN_VRAM}]", str(err)) from None
    if vram is None:
        return None
    if vram > MAX_VRAM_MIB:  # each container's value is bounded; their sum may still not be
        raise InputError(who, f"spec.containers[*].resources[{VRAM_RESOURCE}]",
                         f"the pod's VRAM, {vram} MiB summed over its containers, is more than 16 TiB")

    gpus = _annotation_int(ann, ANN_GPUS, who, 1, MAX_GPUS_PER_POD) or 1
    isolation = pod_isolation(ann, who)
    models: frozenset[str] | None = None
    if ANN_MODELS in ann:
        raw = ann[ANN_MODELS]
        items = [m.strip().lower() for m in str(raw).split(",") if m.strip()] if isinstance(raw, str) else []
        if not items:
            raise InputError(who, f"metadata.annotations[{ANN_MODELS}]",
                             f"expected a comma-separated list of GPU products, got {raw!r}")
        models = frozenset(items)
    tenant = tenant_of(meta, who)
    cpu, mem = pod_host(spec, who)
    priority = spec.get("priority") or 0
    if not isinstance(priority, int):
        raise InputError(who, "spec.priority", "not an integer")
    uid = meta.get("uid") or ""
    return PodDemand(key=key, vram_mib=vram, gpu_count=gpus, tenant=tenant, isolation=isolation,
                     models=models, uid=str(uid), cpu_milli=cpu, memory_mib=mem, priority=priority,
                     gpu_per_process=pod_gpu_per_process(ann, who))


def parse_assignment(raw: Any, who: str) -> list[GpuGrant]:
    """The `vramfit.io/assignment` annotation -> grants."""
    where = f"metadata.annotations[{ANN_ASSIGNMENT}]"
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as err:
        raise InputError(who, where, f"not JSON: {err.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list) or not doc["gpus"]:
        raise InputError(who, where, 'expected {"gpus": [{"index", "mig", "vram_mib"}, ...]}')
    grants: list[GpuGrant] = []
    for i, g in enumerate(doc["gpus"]):
        path = f"{where}.gpus[{i}]"
        if not isinstance(g, dict):
            raise InputError(who, path, "expected an object")
        index, vram, mig = g.get("index"), g.get("vram_mib"), g.get("mig")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise InputError(who, f"{path}.index", f"expected a GPU index >= 0, got {index!r}")
        if not isinstance(vram, int) or isinstance(vram, bool) or vram < 0:
            raise InputError(who, f"{path}.vram_mib", f"expected MiB >= 0, got {vram!r}")
        if mig is not None and (not isinstance(mig, str) or "@" not in mig):
            raise InputError(who, f"{path}.mig", f'expected "<profile>@<start>" or null, got {mig!r}')
        grants.append(GpuGrant(index=index, vram_mib=vram, mig=mig, whole=bool(g.get("whole", False))))
    if len({g.index for g in grants}) != len(grants):
        raise InputError(who, where, "the same GPU index appears twice")
    return grants


@dataclass(frozen=True)
class Holding:
    """What a bound pod occupies. grants None: the state picks concrete units (pods placed without vramfit)."""

    pod: PodDemand
    grants: tuple[GpuGrant, ...] | None
    whole_gpus: int = 0  # `UNIT_GPU` units (whole GPUs, replicas, or instances the plugin advertises as GPUs)
    mig_profiles: tuple[str, ...] = ()  # one entry per `mig-<profile>` instance held (under any resource name)
    # Why something the pod carries was not believed (an unsigned assignment, a tenant its namespace does not
    # allow); "" when all of it was. For operators: the holding itself is already what may be believed.
    distrusted: str = ""


def is_active(obj: Mapping[str, Any]) -> bool:
    """Bound and not finished: the pod holds capacity on its node."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    phase = status.get("phase") if isinstance(status, dict) else None
    return bool(isinstance(spec, dict) and spec.get("nodeName")) and phase not in ("Succeeded", "Failed")


def pending_demand(obj: Mapping[str, Any], tenancy: Tenancy = NO_NAMESPACE_RULES) -> PodDemand | None:
    """The demand of a pod still waiting to be placed (a Pod, unbound, not finished), or None — also for a pod
    whose vramfit fields are malformed (it is reported where it is filtered, not here)."""
    if obj.get("kind") not in (None, "Pod"):
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(spec, dict) or spec.get("nodeName"):
        return None
    if isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        return pod_demand(obj, tenancy)
    except InputError:
        return None


def in_admission(obj: Mapping[str, Any], node_name: str) -> bool:
    """Bound to the node by vramfit's handshake and not admitted by its kubelet yet (no `status.startTime`),
    not finished, not going away. The extender keeps at most one such pod per node; the node agent answers
    Allocate for it. One rule, read by both."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    if not (isinstance(meta, dict) and isinstance(status, dict) and isinstance(spec, dict)):
        return False
    annotations = meta.get("annotations") or {}
    return (spec.get("nodeName") == node_name
            and isinstance(annotations, dict) and annotations.get(ANN_PHASE) == PHASE_ALLOCATING
            and not status.get("startTime")
            and status.get("phase") not in ("Succeeded", "Failed")
            and not meta.get("deletionTimestamp"))


def pod_holding(obj: Mapping[str, Any], names: PluginNames = DEFAULT_PLUGIN_NAMES,
                trust: PodTrust = TRUST_AS_WRITTEN) -> Holding | None:
    """What a pod bound to a node holds, or None when it holds no GPU capacity.

    A pod placed without vramfit holds what the device plugin gave it: every resource `names` knows counts
    (NVIDIA's `nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-<p>[.shared]`, renamed ones), one unit each.
    With `trust.keys`, an assignment counts only when vramfit signed it for this pod and node: anyone may write
    the annotation, and the node agent hands out nothing for an unsigned one."""
    key = pod_key(obj)
    who = f"pod {key}"
    meta = _dict(obj.get("metadata"), who, "metadata")
    ann = _dict(meta.get("annotations"), who, "metadata.annotations")
    spec = _dict(obj.get("spec"), who, "spec")
    tenant, distrusted = held_tenant(meta, who, trust.tenancy)
    demand = _held_demand(obj, tenant)
    if ANN_ASSIGNMENT in ann:
        if trust.keys is not None and signed_assignment(trust.keys, obj, ANN_ASSIGNMENT) is None:
            distrusted = (f"{who}: field metadata.annotations[{ANN_ASSIGNMENT}]: not signed by vramfit for this "
                          f"pod and node; ignored")
        else:
            return _assigned(who, key, meta, ann[ANN_ASSIGNMENT], demand, tenant, distrusted)
    if demand is not None:
        return Holding(demand, None, distrusted=distrusted)
    return _plugin_holding(who, key, meta, spec, names, tenant, distrusted)


def _held_demand(obj: Mapping[str, Any], tenant: str) -> PodDemand | None:
    """The bound pod's demand with its believed tenant (its label may name one its namespace does not allow)."""
    return _demand(obj, lambda _meta, _who: tenant)


def _assigned(who: str, key: str, meta: Mapping[str, Any], raw: Any, demand: PodDemand | None, tenant: str,
              distrusted: str) -> Holding:
    grants = parse_assignment(raw, who)
    if demand is None:
        demand = PodDemand(key=key, vram_mib=max(g.vram_mib for g in grants), gpu_count=len(grants),
                           tenant=tenant, uid=str(meta.get("uid") or ""))
    elif len(grants) != demand.gpu_count:
        raise InputError(who, f"metadata.annotations[{ANN_ASSIGNMENT}]",
                         f"holds {len(grants)} GPUs but the pod asks for {demand.gpu_count}")
    return Holding(demand, tuple(grants), distrusted=distrusted)


def _plugin_holding(who: str, key: str, meta: Mapping[str, Any], spec: dict[str, Any], names: PluginNames,
                    tenant: str, distrusted: str) -> Holding | None:
    """What the device plugin gave a pod placed without vramfit, one unit per resource unit."""
    resource_names: set[str] = set()
    for section in ("containers", "initContainers"):
        for c in _list(spec.get(section), who, f"spec.{section}"):
            if isinstance(c, dict) and isinstance(c.get("resources"), dict):
                for part in ("requests", "limits"):
                    values = c["resources"].get(part)
                    if isinstance(values, dict):
                        resource_names.update(k for k in values if isinstance(k, str) and names.unit(k))
    whole = 0
    per_profile: dict[str, int] = {}
    for name in sorted(resource_names):  # sorted: the same pod always yields the same holding
        count = _effective(who, spec, name, count_value) or 0
        if count < 0:
            raise InputError(who, f"spec.containers[*].resources[{name}]", f"must be >= 0, got {count}")
        unit = names.unit(name)
        if unit == UNIT_GPU:
            whole += count
        elif unit is not None:
            profile = unit[len(UNIT_MIG_PREFIX):]
            per_profile[profile] = per_profile.get(profile, 0) + count
    units = whole + sum(per_profile.values())
    if not units:
        return None
    if units > MAX_PLUGIN_UNITS:  # checked before one entry per unit is built
        raise InputError(who, "spec.containers[*].resources",
                         f"holds {units} device plugin units, more than any node has")
    profiles = [p for p, n in per_profile.items() for _ in range(n)]
    placeholder = PodDemand(key=key, vram_mib=0, gpu_count=whole + len(profiles), tenant=tenant,
                            uid=str(meta.get("uid") or ""))
    return Holding(placeholder, None, whole_gpus=whole, mig_profiles=tuple(profiles), distrusted=distrusted)


def epoch_seconds(raw: object) -> float | None:
    """An API server time (RFC 3339, e.g. metadata.creationTimestamp) as epoch seconds; None when missing or
    unreadable."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def bound_at(obj: Mapping[str, Any]) -> float | None:
    """When the pod was bound (epoch seconds): `vramfit.io/bound-at`, else its creation; None if neither reads."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    annotations = meta.get("annotations")
    stamp = epoch_seconds(annotations.get(ANN_BOUND_AT)) if isinstance(annotations, dict) else None
    return stamp if stamp is not None else epoch_seconds(meta.get("creationTimestamp"))
