"""How many more pods of one shape fit right now, per node and in total (optionally after re-partition).

For a single shape the nodes are independent, and on one node the answer has a closed form, so no search
is needed (the CP-SAT model agrees; tests check both and a brute-force fill):
- per GPU, `cap_g` = grants of this shape the GPU can still take alone: 1 on an idle whole GPU, free MIG
  instances big enough, free MPS/time-slice replicas (limited by free VRAM where the mode pools it), 0 where
  model, isolation, tenancy or size forbid;
- a pod with k GPUs needs k distinct GPUs of one pod group its k may take (`packing.modes.combine`, as
  `fit.feasible` counts), so within a group m pods fit iff sum_g min(cap_g, m) >= k*m (fill round-robin), and
  the node's count is the sum over its allowed groups (they share no GPU);
- node CPU and memory, when tracked, cap the count.

With `repartition=True`, each MIG GPU the catalog knows may take any valid layout that keeps every
instance in use (nobody is drained), and counts the instances that layout offers the shape.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from packing.catalog import Catalog, GpuModel, load_catalog, profile_key
from packing.model import Assignment, GpuGrant, InputError, Isolation, PodDemand
from packing.modes import group_allows
from packing.solvers.mig_space import (
    choice_space,
    current_vector,
    gpu_catalog_model,
    instance_for,
    layout_space,
)
from packing.solvers.slots import GpuSlot, NodeInfo, grant_ok, node_infos
from packing.state import ClusterState
from packing.usage import gpu_model_allowed


@dataclass(frozen=True)
class CapacityResult:
    total: int
    nodes: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "nodes": dict(self.nodes)}


def shape(vram_mib: int, gpus: int = 1, tenant: str = "default", isolation: Isolation | str = Isolation.NONE,
          models: frozenset[str] | None = None, cpu_milli: int = 0, memory_mib: int = 0) -> PodDemand:
    """A pod shape for capacity questions; raises InputError naming the bad field."""
    if vram_mib <= 0:
        raise InputError("capacity", "vram", f"must be a positive amount of MiB, got {vram_mib}")
    if gpus <= 0:
        raise InputError("capacity", "gpus", f"must be a positive integer, got {gpus}")
    try:
        iso = Isolation(isolation)
    except ValueError:
        raise InputError("capacity", "isolation",
                         f"{isolation!r} is not one of {', '.join(i.value for i in Isolation)}") from None
    return PodDemand(key="capacity/probe", vram_mib=vram_mib, gpu_count=gpus, tenant=tenant, isolation=iso,
                     models=models, cpu_milli=cpu_milli, memory_mib=memory_mib)


def gpu_capacity(slot: GpuSlot, pod: PodDemand, relax_tenancy: bool) -> int:
    """Grants of `pod`'s shape this GPU can still take on its own."""
    if not grant_ok(slot, pod, relax_tenancy):
        return 0
    if slot.rules.instanced:
        return sum(len(v) for size, v in slot.buckets.items() if size >= pod.vram_mib)
    n = slot.slots
    if slot.pool is not None:
        n = min(n, slot.pool // pod.vram_mib)
    return max(0, n)


def caps_by_group(slots: Sequence[GpuSlot], caps: Sequence[int], pod: PodDemand) -> list[list[int]]:
    """The GPUs' capacities split by pod group, only the groups a pod of `pod`'s GPU count may take (one list
    for a one-GPU pod: any unit will do)."""
    if pod.gpu_count <= 1:
        return [list(caps)]
    groups: dict[str, list[int]] = {}
    for s, c in zip(slots, caps, strict=True):
        if group_allows(s.rules, pod.gpu_count, pod.gpu_per_process):
            groups.setdefault(s.rules.pod_group, []).append(c)
    return list(groups.values())


def pods_on_node(caps: Sequence[int], k: int) -> int:
    """Most k-GPU pods: the largest m with sum(min(cap, m)) >= k*m."""
    caps = [c for c in caps if c > 0]
    if k == 1:
        return sum(caps)
    if len(caps) < k:
        return 0
    hi = sum(caps) // k
    lo = 0
    while lo < hi:  # the condition is monotone in m
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in caps) >= k * mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


@functools.lru_cache(maxsize=4096)
def _best_layout_count(model: GpuModel, held: frozenset[int], current: frozenset[int], fits: tuple[bool, ...]) -> int:
    """Most instances that fit the shape over every valid layout that keeps the held placements."""
    vectors = choice_space(model, current)  # the layouts a plan may choose (packing.solvers.repartition)
    best = 0
    for v in vectors:
        if any(not v[i] for i in held):
            continue
        best = max(best, sum(1 for i, on in enumerate(v) if on and fits[i] and i not in held))
    return best


def repartitioned_gpu_capacity(slot: GpuSlot, pod: PodDemand, catalog: Catalog) -> int | None:
    """Capacity of a MIG GPU under its best layout that drains nobody; None when it cannot be re-partitioned."""
    gu = slot.usage
    g = gu.gpu
    if not gu.rules.instanced or gu.whole_holder is not None:
        return None
    model = gpu_catalog_model(catalog, g)
    if model is None or model.mig is None or current_vector(model, g) is None:
        return None
    if not gpu_model_allowed(g, pod.models) or not gu.rules.admits(pod.isolation):
        return 0
    placements, _ = layout_space(model)
    pos = {(profile_key(p.profile), p.start): i for i, p in enumerate(placements)}
    held = frozenset(pos[profile_key(inst.profile), inst.start] for inst in g.mig if inst.ref in gu.mig_holder)
    current = frozenset(pos[profile_key(inst.profile), inst.start] for inst in g.mig)
    fits = tuple(instance_for(catalog, model, g, p).memory_mib >= pod.vram_mib for p in placements)
    return _best_layout_count(model, held, current, fits)


def capacity(state: ClusterState, pod: PodDemand, repartition: bool = False,
             catalog: Catalog | None = None, infos: list[NodeInfo] | None = None) -> CapacityResult:
    """How many more pods shaped like `pod` fit now (each node on its own; the total is their sum).

    `infos`: node_infos(state), when the caller asks many shapes of one unchanged state.
    """
    relax = bool(getattr(state, "relax_tenancy", False))
    if repartition and catalog is None:
        catalog = load_catalog()
    nodes: dict[str, int] = {}
    for info in infos if infos is not None else node_infos(state):
        caps = []
        for s in info.slots:
            c = repartitioned_gpu_capacity(s, pod, catalog) if repartition and catalog is not None else None
            caps.append(gpu_capacity(s, pod, relax) if c is None else c)
        n = sum(pods_on_node(group, pod.gpu_count) for group in caps_by_group(info.slots, caps, pod))
        if info.cpu_free is not None and pod.cpu_milli > 0:
            n = min(n, max(0, info.cpu_free) // pod.cpu_milli)
        if info.mem_free is not None and pod.memory_mib > 0:
            n = min(n, max(0, info.mem_free) // pod.memory_mib)
        nodes[info.name] = n
    return CapacityResult(total=sum(nodes.values()), nodes=nodes)


def choose_on_node(state: ClusterState, node: str, pod: PodDemand) -> Assignment | None:
    """Units for `pod` on `node` by best fit (smallest unit that fits, distinct GPUs, all of one pod group the
    pod's GPU count may take: the group whose k best units are smallest), or None.

    Used to insert pods where capacity says there is room; the caller allocates, which re-checks.
    """
    relax = bool(getattr(state, "relax_tenancy", False))
    info = node_infos(state, [node])[0]
    if info.cpu_free is not None and pod.cpu_milli > info.cpu_free:
        return None
    if info.mem_free is not None and pod.memory_mib > info.mem_free:
        return None
    k = pod.gpu_count
    by_group: dict[str, list[tuple[int, int, str | None]]] = {}
    for s in info.slots:
        if gpu_capacity(s, pod, relax) <= 0 or not group_allows(s.rules, k, pod.gpu_per_process):
            continue
        group = by_group.setdefault(s.rules.pod_group if k > 1 else "", [])
        group.append(_best_unit(s, pod))
    # Per group its k smallest units; of those, the smallest (sorted, compared in order): with one group this
    # is the plain best fit over every GPU.
    picks = [sorted(c)[:k] for c in by_group.values() if len(c) >= k]
    if not picks:
        return None
    grants = sorted((GpuGrant(index=i, vram_mib=pod.vram_mib, mig=ref) for _, i, ref in min(picks)),
                    key=lambda g: g.index)
    return Assignment(node, tuple(grants))


def _best_unit(s: GpuSlot, pod: PodDemand) -> tuple[int, int, str | None]:
    """(unit MiB, GPU index, MIG ref) of the smallest unit of the GPU that takes one of the pod's GPUs."""
    if s.rules.instanced:
        inst = min((i for v in s.buckets.values() for i in v if i.memory_mib >= pod.vram_mib),
                   key=lambda i: (i.memory_mib, i.start))
        return inst.memory_mib, s.index, inst.ref
    unit = s.stranded_unit if s.stranded_unit is not None else (s.pool or s.usage.gpu.memory_mib)
    return unit, s.index, None
