"""Offline upper bounds on how many pods any placement policy could place.

An online policy sees pods one at a time; an offline optimum sees the whole prefix of a trace at once and
may put every pod anywhere. So "pods the CP-SAT model can place at once" is an upper bound on what any
policy could have placed of that prefix, and the solver's proven bound (its LP/cut bound when it runs out
of time) is still a valid upper bound. Benchmarks report each policy's gap to it.

The model is the same one `packing.optimal` solves (identical pods grouped into classes, GPUs by residual
state, independent node groups solved apart), with only the first objective: most pods placed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from packing.model import PodDemand
from packing.optimal import STAGES, components, group_pods, node_infos, solve_stages
from packing.optimal import PackingModel as _PackingModel
from packing.state import ClusterState


@dataclass(frozen=True)
class BoundResult:
    bound: int  # no policy can place more of these pods on this state
    best_known: int  # pods the solver actually placed (a lower bound on the optimum)
    exact: bool  # bound == optimum, proven
    wall_s: float


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
    return BoundResult(bound=bound, best_known=best, exact=exact, wall_s=time.monotonic() - t0)


def prefix_bounds(state: ClusterState, trace: Sequence[PodDemand], prefixes: Sequence[int],
                  time_limit: float = 10.0, workers: int = 2) -> dict[int, BoundResult]:
    """Upper bounds for several prefix lengths of an arrival trace (departures ignored: all pods stay)."""
    out: dict[int, BoundResult] = {}
    per = time_limit / max(1, len(prefixes))
    for n in prefixes:
        out[n] = placement_upper_bound(state, trace[:n], per, workers)
    return out
