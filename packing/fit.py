"""Filter, explain and choose: can a pod go on a node, on which units, and if not, why.

`feasible` is the vectorised filter over the whole cluster (numpy views of the state); `explain` and
`choose_units` look at one node in detail. Both defer the per-unit rules to `ClusterState.grant_problem`,
so the reason an operator reads is the rule that `allocate` enforces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packing.model import (
    Assignment,
    GpuGrant,
    PodDemand,
)
from packing.state import ClusterState
from packing.usage import GpuUsage, NodeUsage, gpu_model_allowed
from packing.views import ALLOWED_CODE, row_count


@dataclass(frozen=True)
class FeasibleMask:
    now: np.ndarray  # [N] bool: fits right now
    never: np.ndarray  # [N] bool: cannot fit on this node whatever is evicted
    gpu_ok: np.ndarray  # [N, G] bool: this GPU could take one of the pod's GPUs now


def feasible(state: ClusterState, pod: PodDemand, whole_gpu: bool = False) -> FeasibleMask:
    """Vectorised filter for every node at once."""
    cpu_now = (state.cpu_free >= pod.cpu_milli) & (state.host_mem_free >= pod.memory_mib)
    cpu_ever = (state.cpu_cap >= pod.cpu_milli) & (state.host_mem_cap >= pod.memory_mib)
    present = state.present
    if pod.gpu_count == 0:
        none = np.zeros(present.shape, dtype=bool)
        return FeasibleMask(now=cpu_now, never=~cpu_ever, gpu_ok=none)
    v = pod.vram_mib
    # unit_cap is 0 on padding slots, so `unit_cap >= v` (v > 0) also means "a GPU is here".
    if whole_gpu:
        ever = state.vram >= v
        now = ever & state.idle
    else:
        ever = (state.unit_cap >= v) & ALLOWED_CODE[pod.isolation][state.mode]
        now = ever & (state.unit_max >= v)
        if not state.relax_tenancy:
            now &= state.open | (state.tenant == state.known_tenant_id(pod.tenant))
    if pod.models:
        kinds_ok = state.allowed_kinds(pod.models)[state.kind]
        ever &= kinds_ok
        now &= kinds_ok
    k = pod.gpu_count
    return FeasibleMask(now=(row_count(now) >= k) & cpu_now, never=(row_count(ever) < k) | ~cpu_ever, gpu_ok=now)


@dataclass(frozen=True)
class GpuOption:
    """One GPU that can take one of the pod's GPUs now, with the unit it would get."""

    grant: GpuGrant
    unit_mib: int  # size of the unit the pod would use (instance, share, free pool, whole GPU)
    leftover_mib: int  # unit_mib - pod VRAM: what best fit minimises
    shared_now: bool  # the GPU already has pods (joining it opens no new GPU)


@dataclass(frozen=True)
class FitResult:
    fits: bool
    permanent: bool  # True: never fits on this node (too big, wrong model, isolation impossible, ...)
    reason: str | None
    options: list[GpuOption] = field(default_factory=list)


def _candidate(state: ClusterState, gu: GpuUsage, pod: PodDemand,
               whole_gpu: bool) -> tuple[GpuOption | None, str | None, bool]:
    """Best unit on one GPU for the pod -> (option, reason it can't, reason is permanent)."""
    g = gu.gpu
    v = pod.vram_mib
    if not gpu_model_allowed(g, pod.models):
        return None, f"model {g.product or g.model or 'unknown'} is not in {','.join(sorted(pod.models or ()))}", True
    if whole_gpu:
        if v > g.memory_mib:
            return None, f"has {g.memory_mib} MiB < {v} MiB", True
        grant = GpuGrant(index=g.index, vram_mib=v, whole=True)
        problem = "in use" if gu.grants else None
        if problem:
            return None, "is in use (a whole-GPU pod needs an idle GPU)", False
        return GpuOption(grant, g.memory_mib, g.memory_mib - v, False), None, False
    rules = gu.rules
    if not rules.admits(pod.isolation):
        return None, f"is {rules.words}; isolation {pod.isolation.value} forbids it", True
    if v > gu.unit_cap():
        return None, f"{rules.cap_words} is {gu.unit_cap()} MiB < {v} MiB", True
    offer, unit, why = rules.candidate(gu, pod)
    if offer is None:
        return None, why, False
    problem = state.grant_problem(pod, gu, offer)
    if problem is not None:
        owner = gu.tenant()
        if owner is not None and owner != pod.tenant and not state.relax_tenancy:
            problem = f"is {rules.words} for tenant {owner}"
        return None, problem, False
    return GpuOption(offer, unit, unit - v, bool(gu.grants)), None, False


def _join(per_gpu: list[tuple[int, str]]) -> str:
    """'GPU 1 is time-sliced for tenant b; GPUs 2,3: no free MIG instance ...' with identical reasons merged."""
    groups: dict[str, list[int]] = {}
    for idx, text in per_gpu:
        groups.setdefault(text, []).append(idx)
    parts = []
    for text, idxs in groups.items():
        plural = len(idxs) > 1
        label = "GPUs " + ",".join(map(str, idxs)) if plural else f"GPU {idxs[0]}"
        if text.startswith("is "):
            parts.append(f"{label} {'are' if plural else 'is'} {text[3:]}")
        elif text.startswith("has "):
            parts.append(f"{label} {'have' if plural else 'has'} {text[4:]}")
        else:
            parts.append(f"{label}: {text}")
    return "; ".join(parts)


def explain(state: ClusterState, node_name: str, pod: PodDemand, whole_gpu: bool = False) -> FitResult:
    """Every GPU option for the pod on this node, or the reason it can't go there."""
    if not state.has_node(node_name):
        return FitResult(False, True, f"node {node_name} is not known to vramfit")
    nu = state.usage(node_name)
    never_host = _host_never(nu, pod)
    if never_host is not None:
        return FitResult(False, True, never_host)
    host_short = _host_short(nu, pod)
    if pod.gpu_count == 0:
        if host_short:
            return FitResult(False, False, "not enough free CPU or memory now")
        return FitResult(True, False, None)
    if not nu.node.gpus:
        return FitResult(False, True, "node has no GPUs vramfit knows of")
    options, now_reasons, never_reasons = _gpu_options(state, nu, pod, whole_gpu)
    k = pod.gpu_count
    could_ever = len(options) + len(now_reasons)
    if could_ever < k:
        head = (f"needs {k} GPUs with {pod.vram_mib} MiB, only {could_ever} could ever hold it: "
                if k > 1 else "")
        return FitResult(False, True, head + _join(never_reasons))
    if len(options) < k:
        head = f"needs {k} GPUs with {pod.vram_mib} MiB, {len(options)} has room: " if k > 1 else ""
        return FitResult(False, False, head + _join(now_reasons), options)
    if host_short:
        return FitResult(False, False, "GPUs fit but not enough free CPU or memory now", options)
    return FitResult(True, False, None, options)


def _host_never(nu: NodeUsage, pod: PodDemand) -> str | None:
    """Why the node's allocatable CPU or memory could never hold the pod; None when it could."""
    cap_cpu, cap_mem = nu.node.cpu_milli, nu.node.memory_mib
    if cap_cpu is not None and pod.cpu_milli > cap_cpu:
        return f"needs {pod.cpu_milli}m CPU, node has {cap_cpu}m allocatable"
    if cap_mem is not None and pod.memory_mib > cap_mem:
        return f"needs {pod.memory_mib} MiB memory, node has {cap_mem} MiB allocatable"
    return None


def _host_short(nu: NodeUsage, pod: PodDemand) -> bool:
    """The node lacks the free CPU or memory for the pod now."""
    cap_cpu, cap_mem = nu.node.cpu_milli, nu.node.memory_mib
    cpu_short = cap_cpu is not None and nu.cpu_used + pod.cpu_milli > cap_cpu
    mem_short = cap_mem is not None and nu.mem_used + pod.memory_mib > cap_mem
    return cpu_short or mem_short


def _gpu_options(state: ClusterState, nu: NodeUsage, pod: PodDemand, whole_gpu: bool
                 ) -> tuple[list[GpuOption], list[tuple[int, str]], list[tuple[int, str]]]:
    """The node's GPUs that could take one of the pod's GPUs now, and why each other one cannot: now, never."""
    options: list[GpuOption] = []
    now_reasons: list[tuple[int, str]] = []
    never_reasons: list[tuple[int, str]] = []
    for gu in nu.gpus:
        opt, why, permanent = _candidate(state, gu, pod, whole_gpu)
        if opt is not None:
            options.append(opt)
        elif permanent:
            never_reasons.append((gu.gpu.index, why or "unusable"))
        else:
            now_reasons.append((gu.gpu.index, why or "busy"))
    return options, now_reasons, never_reasons


ORDERINGS = ("best", "first", "spread")


def rank_options(options: list[GpuOption], order: str = "best") -> list[GpuOption]:
    """Order GPU options. best: tightest unit, already-shared GPUs first; spread: roomiest; first: index."""
    if order == "first":
        return sorted(options, key=lambda o: o.grant.index)
    if order == "spread":
        return sorted(options, key=lambda o: (-o.leftover_mib, o.grant.index))
    return sorted(options, key=lambda o: (o.leftover_mib, not o.shared_now, o.grant.index))


def choose_units(state: ClusterState, node_name: str, pod: PodDemand, whole_gpu: bool = False,
                 order: str = "best") -> Assignment | None:
    """The units the pod gets on this node (None when it does not fit now)."""
    result = explain(state, node_name, pod, whole_gpu)
    if not result.fits:
        return None
    chosen = rank_options(result.options, order)[: pod.gpu_count]
    return Assignment(node=node_name, gpus=tuple(sorted((o.grant for o in chosen), key=lambda g: g.index)))
