"""Filter, explain and choose: can a pod go on a node, on which units, and if not, why.

`feasible` is the vectorised filter over the whole cluster (numpy views of the state); `explain` and
`choose_units` look at one node in detail. Both defer the per-unit rules to `ClusterState.grant_problem`,
so the reason an operator reads is the rule that `allocate` enforces. A multi-GPU pod's units are all of one
pod group (`packing.modes.combine`), so both count a node's GPUs per group.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from packing.model import (
    Assignment,
    GpuGrant,
    PodDemand,
)
from packing.modes import MODES, POD_GROUPS, WHOLE_GPU, ModeRules, group_allows, mode_rules
from packing.state import ClusterState
from packing.usage import GpuUsage, NodeUsage, gpu_model_allowed
from packing.views import ALLOWED_CODE, row_count

# The pod group of each code of the state's `mode` array (-1, the padding's code, maps to -1: no group).
_GROUPS = tuple(POD_GROUPS)
GROUP_OF_CODE = np.array([_GROUPS.index(mode_rules(m).pod_group) for m in MODES] + [-1], dtype=np.int8)


def _one_group_count(ok: np.ndarray, mode: np.ndarray, pod: PodDemand) -> np.ndarray:
    """[N] the most GPUs in `ok` ([N, G]) of one pod group the pod may take that many of (a k-GPU pod); `mode`: the
    rows' mode codes."""
    groups = GROUP_OF_CODE[mode]
    best = np.zeros(ok.shape[0], dtype=np.int64)
    for gi, rules in enumerate(POD_GROUPS.values()):
        if group_allows(rules, pod.gpu_count, pod.gpu_per_process):
            best = np.maximum(best, row_count(ok & (groups == gi)))
    return best


@dataclass(frozen=True)
class FeasibleMask:
    now: np.ndarray  # [N] bool: fits right now
    never: np.ndarray  # [N] bool: cannot fit on this node whatever is evicted
    gpu_ok: np.ndarray  # [N, G] bool: this GPU could take one of the pod's GPUs now


def feasible(state: ClusterState, pod: PodDemand, whole_gpu: bool = False) -> FeasibleMask:
    """Vectorised filter for every node at once."""
    return feasible_rows(state, pod, whole_gpu, slice(None))


def feasible_rows(state: ClusterState, pod: PodDemand, whole_gpu: bool, rows: np.ndarray | slice) -> FeasibleMask:
    """`feasible` on some rows (index array or slice): each row's verdict reads that row of the state alone, and
    the state-wide tenant id and model table (`feasible_key`)."""
    cpu_now = (state.cpu_free[rows] >= pod.cpu_milli) & (state.host_mem_free[rows] >= pod.memory_mib)
    cpu_ever = (state.cpu_cap[rows] >= pod.cpu_milli) & (state.host_mem_cap[rows] >= pod.memory_mib)
    present = state.present[rows]
    if pod.gpu_count == 0:
        none = np.zeros(present.shape, dtype=bool)
        return FeasibleMask(now=cpu_now, never=~cpu_ever, gpu_ok=none)
    v = pod.vram_mib
    mode = state.mode[rows]
    # unit_cap is 0 on padding slots, so `unit_cap >= v` (v > 0) also means "a GPU is here".
    if whole_gpu:
        ever = state.vram[rows] >= v
        now = ever & state.idle[rows]
    else:
        ever = (state.unit_cap[rows] >= v) & ALLOWED_CODE[pod.isolation][mode]
        now = ever & (state.unit_max[rows] >= v)
        if not state.relax_tenancy:
            now &= state.open[rows] | (state.tenant[rows] == state.known_tenant_id(pod.tenant))
    if pod.models:
        kinds_ok = state.allowed_kinds(pod.models)[state.kind[rows]]
        ever &= kinds_ok
        now &= kinds_ok
    k = pod.gpu_count
    if k > 1 and not whole_gpu:  # whole GPUs (the baseline) are one group, whatever their mode
        n_now, n_ever = _one_group_count(now, mode, pod), _one_group_count(ever, mode, pod)
    else:
        n_now, n_ever = row_count(now), row_count(ever)
    return FeasibleMask(now=(n_now >= k) & cpu_now, never=(n_ever < k) | ~cpu_ever, gpu_ok=now)


def feasible_key(state: ClusterState, pod: PodDemand) -> tuple[object, ...]:
    """What `feasible_rows` reads beyond the pod and the rows: a row's kept verdict holds while this is equal."""
    return (state.rows_epoch, len(state), state.relax_tenancy, state.known_tenant_id(pod.tenant),
            state.allowed_kinds(pod.models).tobytes() if pod.models else None)


class FeasibleRows:
    """`feasible` per pod shape kept row by row: a placement moves one row, so a shape asked again is re-judged on
    the rows whose version moved since (the state's row versions), not on every node."""

    def __init__(self, max_shapes: int = 256) -> None:
        self.max_shapes = max_shapes
        self._kept: OrderedDict[tuple[object, ...], tuple[tuple[object, ...], np.ndarray, FeasibleMask]] = \
            OrderedDict()

    def mask(self, state: ClusterState, pod: PodDemand, whole_gpu: bool) -> FeasibleMask:
        """`feasible(state, pod, whole_gpu)`, as new arrays the caller may keep."""
        key, ident = (pod.shape, whole_gpu), feasible_key(state, pod)
        hit = self._kept.get(key)
        version = state.version
        if hit is None or hit[0] != ident or hit[2].now.shape[0] != version.shape[0]:
            mask = feasible(state, pod, whole_gpu)
        else:
            mask = hit[2]
            stale = np.flatnonzero(hit[1] != version)
            if stale.size:
                part = feasible_rows(state, pod, whole_gpu, stale)
                mask.now[stale], mask.never[stale], mask.gpu_ok[stale] = part.now, part.never, part.gpu_ok
        self._kept[key] = (ident, version.copy(), mask)
        self._kept.move_to_end(key)
        if len(self._kept) > self.max_shapes:
            self._kept.popitem(last=False)
        return FeasibleMask(mask.now.copy(), mask.never.copy(), mask.gpu_ok.copy())


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
    could_ever, room, kind = len(options) + len(now_reasons), len(options), ""
    if k > 1 and not whole_gpu:
        options, could_ever, room, barred = _one_group(nu, pod, options, now_reasons)
        never_reasons = barred + never_reasons
        kind = " of one kind"
    if could_ever < k:
        head = (f"needs {k} GPUs{kind} with {pod.vram_mib} MiB, only {could_ever} could ever hold it: "
                if k > 1 else "")
        return FitResult(False, True, head + _join(never_reasons))
    if room < k:
        head = f"needs {k} GPUs{kind} with {pod.vram_mib} MiB, {room} has room: " if k > 1 else ""
        return FitResult(False, False, head + _join(now_reasons), options)
    if host_short:
        return FitResult(False, False, "GPUs fit but not enough free CPU or memory now", options)
    return FitResult(True, False, None, options)


def _one_group(nu: NodeUsage, pod: PodDemand, options: list[GpuOption], now_reasons: list[tuple[int, str]]
               ) -> tuple[list[GpuOption], int, int, list[tuple[int, str]]]:
    """A k-GPU pod's units are of one pod group (`packing.modes.combine`): (the options of the groups with k
    GPUs free now, the most GPUs of one allowed group that could ever hold it, the most with room now, why the
    GPUs of groups the pod may not take k of are barred)."""
    rules_at = {gu.gpu.index: gu.rules for gu in nu.gpus}
    ever: dict[str, int] = {}
    now: dict[str, list[GpuOption]] = {}
    barred: list[tuple[int, str]] = []
    for idx in [o.grant.index for o in options] + [i for i, _ in now_reasons]:
        rules = rules_at[idx]
        if group_allows(rules, pod.gpu_count, pod.gpu_per_process):
            ever[rules.pod_group] = ever.get(rules.pod_group, 0) + 1
        else:
            barred.append((idx, f"is {rules.words}: {pod.gpu_count} GPUs of {rules.group_words} in one pod are "
                                f"not allowed ({rules.multi_gpu_why})"))
    for o in options:
        rules = rules_at[o.grant.index]
        if rules.pod_group in ever:
            now.setdefault(rules.pod_group, []).append(o)
    k = pod.gpu_count
    kept = [o for group in now.values() if len(group) >= k for o in group]
    return kept, max(ever.values(), default=0), max(map(len, now.values()), default=0), barred


def _unit_rules(gu: GpuUsage, whole_gpu: bool) -> ModeRules:
    return WHOLE_GPU if whole_gpu else gu.rules


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
    # The first pod group to gather k options in rank order: the pod's units are all of one group.
    usage = state.usage(node_name)
    rules_at = {gu.gpu.index: _unit_rules(gu, whole_gpu) for gu in usage.gpus}
    picked: dict[str, list[GpuOption]] = {}
    chosen: list[GpuOption] = []
    for o in rank_options(result.options, order):
        group = picked.setdefault(rules_at[o.grant.index].pod_group, [])
        group.append(o)
        if len(group) == pod.gpu_count:
            chosen = group
            break
    return Assignment(node=node_name, gpus=tuple(sorted((o.grant for o in chosen), key=lambda g: g.index)))
