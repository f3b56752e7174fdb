"""Offline upper bounds on how many pods any placement policy could place.

An online policy sees pods one at a time; an offline optimum sees the whole prefix of a trace at once and
may put every pod anywhere. So "pods the CP-SAT model can place at once" is an upper bound on what any
policy could have placed of that prefix, and the solver's proven bound (its LP/cut bound when it runs out
of time) is still a valid upper bound. Benchmarks report each policy's gap to it.

The model is the same one `packing.solvers.optimal` solves (identical pods grouped into classes, GPUs by residual
state, independent node groups solved apart), with only the first objective: most pods placed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from packing.model import Isolation, PodDemand
from packing.modes import ALLOWED_MODES
from packing.solvers.capacity import capacity, gpu_capacity, shape
from packing.solvers.model import STAGES, solve_stages
from packing.solvers.model import PackingModel as _PackingModel
from packing.solvers.slots import NodeInfo, components, group_pods, node_infos
from packing.state import ClusterState


@dataclass(frozen=True)
class BoundResult:
    bound: int  # no policy can place more of these pods on this state
    best_known: int  # pods the solver actually placed (a lower bound on the optimum)
    exact: bool  # bound == optimum, proven
    wall_s: float


def threshold_bound(state: ClusterState, pods: Sequence[PodDemand]) -> int:
    """A cheap bound from unit counting, often tighter than the LP on crowded clusters.

    For a size v and an isolation level L, every pod of at least v MiB whose isolation allows no more than
    L's modes takes gpu_count units, each of which could also hold a v MiB pod of level L with the least
    CPU and memory per GPU any of them asks (any model). So those pods need at most capacity(v, L) units
    between them - counted for all tenants with
    tenancy ignored, and for each tenant with the units that tenant may use. The most pods placeable under
    all these counting constraints (a tiny integer program) bounds the optimum.
    """

    pods = list(pods)
    if not pods:
        return 0
    infos = node_infos(state)
    classes = group_pods(pods)
    m = cp_model.CpModel()
    placed = {c.cid: m.new_int_var(0, len(c.pods), f"p{c.cid}") for c in classes}
    tenants: list[str | None] = [None] + sorted({p.tenant for p in pods})
    for v in sorted({max(1, p.vram_mib) for p in pods}):
        for level in Isolation:
            allowed = ALLOWED_MODES[level]
            for tenant in tenants:
                # tenant None: every tenant, tenancy ignored; else one tenant's pods and the units it may use.
                members = [c for c in classes if c.vram >= v and ALLOWED_MODES[c.rep.isolation] <= allowed
                           and tenant in (None, c.rep.tenant)]
                if not members:
                    continue
                # Per GPU unit every member needs at least this much node CPU and memory.
                cpu = min(c.rep.cpu_milli // c.k for c in members)
                mem = min(c.rep.memory_mib // c.k for c in members)
                if tenant is None:
                    # Tenancy only removes options: ignoring it keeps the count an upper bound.
                    units = _units_any_tenant(infos, shape(v, isolation=level, cpu_milli=cpu, memory_mib=mem))
                else:
                    units = capacity(state, shape(v, isolation=level, tenant=tenant, cpu_milli=cpu, memory_mib=mem),
                                     infos=infos).total
                m.add(sum(c.k * placed[c.cid] for c in members) <= units)
    m.maximize(sum(placed.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 5.0
    solver.parameters.num_workers = 1
    status = solver.solve(m)
    if status == cp_model.OPTIMAL:
        return int(round(solver.objective_value))
    return int(solver.best_objective_bound) if status == cp_model.FEASIBLE else len(pods)


def _units_any_tenant(infos: list[NodeInfo], probe: PodDemand) -> int:

    total = 0
    for n in infos:
        units = sum(gpu_capacity(s, probe, True) for s in n.slots)
        if n.cpu_free is not None and probe.cpu_milli > 0:
            units = min(units, max(0, n.cpu_free) // probe.cpu_milli)
        if n.mem_free is not None and probe.memory_mib > 0:
            units = min(units, max(0, n.mem_free) // probe.memory_mib)
        total += units
    return total


def placement_upper_bound(state: ClusterState, pods: Sequence[PodDemand], time_limit: float = 10.0,
                          workers: int = 2) -> BoundResult:
    """Upper bound on the pods of `pods` that any policy could place on top of `state`."""
    t0 = time.monotonic()
    pods = list(pods)
    relax = bool(getattr(state, "relax_tenancy", False))
    classes = group_pods(pods)
    groups = components(node_infos(state), classes, relax)
    sizes = [sum(len(n.slots) for n in ns) * max(1, len(cs)) for ns, cs in groups]
    left_size = sum(sizes) or 1
    bound = best = 0
    exact = True
    for (gnodes, gclasses), size in zip(groups, sizes, strict=True):
        budget = max(0.1, (time_limit - (time.monotonic() - t0)) * size / left_size)
        left_size -= size
        pm = _PackingModel(gnodes, gclasses, relax)
        values, stages = solve_stages(pm, STAGES[:1], budget, workers)
        st = stages[0]
        bound += st.bound if values is not None else sum(len(c.pods) for c in gclasses)
        best += st.value if values is not None else 0
        exact = exact and st.proven
    counted = threshold_bound(state, pods)
    if counted < bound:
        bound = counted
        exact = bound == best
    return BoundResult(bound=bound, best_known=best, exact=exact, wall_s=time.monotonic() - t0)
