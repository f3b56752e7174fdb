"""Proven-optimal placement of a batch of pending pods with OR-Tools CP-SAT.

The model encodes exactly the rules `ClusterState.allocate` enforces (see `state._grant_problem`):
units per mode, MIG instances, tenancy of shared GPUs, isolation, GPU models, multi-GPU pods on
distinct GPUs of one node, node CPU/memory; existing holders stay where they are. Every solution is
replayed through `ClusterState.allocate` before it is returned, so a modelling slip can never leak out
as an invalid placement.

Formulation (chosen so that 1,000 pods x 2,000 GPUs stays small):
- identical pods are grouped into classes (same `PodDemand.shape`); variables count pods, not pods x GPUs;
- classes are merged into units per GPU family (`Unit`): on whole GPUs and MIG neither tenant nor
  isolation matters; flow variables hand each unit's places to its member classes (exact);
- per (unit, GPU) an integer `x` = grants on that GPU; MIG GPUs split `x` by the size of the free
  instance used (`z`), which is an exact matching because "fits" is monotone in instance size; pooled
  GPUs (MPS without replicas, time-slicing) get size-threshold cuts so the LP is not fooled;
- a k-GPU class gets `m` pods per node with sum_g x = k*m and x <= m, which always decomposes into pods
  on k distinct GPUs (fill round-robin);
- identical GPUs of a node and identical nodes are ordered by the VRAM they receive (symmetry breaking);
- independent node groups (no pod class can use both) are solved separately (decomposition);
- the online policy's own placement seeds the search (`add_hint`);
- a node group too big for one model (`LARGE_MODEL`) is solved by a portfolio: insertion where capacity
  says there is room, large-neighbourhood search that re-solves random groups of nodes exactly, the unit-
  counting bound of `packing.solvers.bound` as the proof, and the whole model when it is small enough.

Objective, lexicographic, one CP-SAT solve per stage (each fixes the previous stage's value):
1. most pending pods placed; 2. fewest GPUs opened (idle before, used after); 3. least stranded VRAM,
counted per grant as the unit's memory minus the pod's VRAM (whole GPU, MIG instance, MPS share).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packing.model import (
    Assignment,
    PodDemand,
)
from packing.place import schedule_one
from packing.policies import get_policy
from packing.solvers.extract import extract, hint_from
from packing.solvers.large import Placements, StepSolve, opened_gpus, solve_large
from packing.solvers.model import STAGES, Objective, PackingModel, StageResult, solve_stages
from packing.solvers.slots import PodClass, components, group_pods, node_infos
from packing.state import ClusterState, PlacementError

LARGE_MODEL = 40_000  # GPUs x pod classes in one node group beyond which one model is not attempted
LNS_GROUP = 12  # nodes re-optimised together in one large-neighbourhood step


@dataclass
class OptimalResult:
    """Placements of the pending pods (pod key -> Assignment, None = unplaced) and the proof status."""

    placements: dict[str, Assignment | None]
    placed: int
    unplaced: int
    gpus_opened: int
    stranded_vram_mib: int  # the core's ClusterState.stranded_mib() after placing
    optimal: bool  # every stage proven optimal
    bound: int  # upper bound on pods placed (== placed when proven)
    gap: float  # (bound - placed) / bound on pods placed
    wall_s: float
    stages: list[StageResult] = field(default_factory=list)
    components: int = 1
    state: ClusterState | None = None  # the state after placing (a copy; the input is not touched)

    def summary(self) -> dict[str, object]:
        return {
            "placed": self.placed,
            "unplaced": self.unplaced,
            "gpus_opened": self.gpus_opened,
            "stranded_vram_mib": self.stranded_vram_mib,
            "optimal": self.optimal,
            "bound": self.bound,
            "gap": round(self.gap, 6),
            "wall_s": round(self.wall_s, 3),
            "components": self.components,
        }


# ------------------------------------------------------------------------------------------- hints
def greedy_assignments(state: ClusterState, pending: Sequence[PodDemand], policy: str = "vramfit"
                       ) -> dict[str, Assignment | None]:
    """The online policy's placement of `pending`, in order, on a copy of the state."""

    sim = state.copy()
    pol = get_policy(policy)
    out: dict[str, Assignment | None] = {}
    for pod in pending:
        d = schedule_one(sim, pod, pol, explain_failures=False)
        out[pod.key] = d.assignment if d.node is not None else None
    return out


# ------------------------------------------------------------------------------------------- entry point
def solve_optimal(state: ClusterState, pending: Sequence[PodDemand], time_limit: float = 10.0,
                  workers: int = 2, hint: dict[str, Assignment | None] | None = None,
                  hint_policy: str | None = "vramfit", symmetry: bool = True, decompose: bool = True,
                  stages: Sequence[Objective] = STAGES, whole_gpu: bool = False,
                  large_threshold: int | None = LARGE_MODEL, seed: int = 0,
                  group: Callable[[Sequence[PodDemand]], list[PodClass]] = group_pods,
                  shares: Sequence[float] | None = None) -> OptimalResult:
    """Place `pending` optimally on top of what `state` already holds. `state` is not modified.

    `hint`: a known placement (e.g. the online policy's) to start from; when None and `hint_policy` is
    set, the online policy is run on a copy of the state to produce one.
    `whole_gpu`: solve under the whole-GPU baseline's rules instead (each idle GPU goes whole to one pod).
    `large_threshold`: a node group whose GPUs x pod classes exceeds it is improved by large-neighbourhood
    search over groups of nodes (each group solved exactly) and bounded by the whole model's relaxation,
    instead of one model that could not even be presolved in time. None = always one model.
    `group`: how pending pods are counted together (default `group_pods`: one class per shape); the queue
    planner (`packing.planning.queue_plan`) counts pods one by one so that priorities and ages can be weighed.
    `shares`: each stage's share of the time left (passed to `solve_stages`; None = its default).
    """
    t_start = time.monotonic()
    pending = list(pending)
    if len({p.key for p in pending}) != len(pending):
        raise ValueError("pending pods must have distinct keys")
    relax = bool(getattr(state, "relax_tenancy", False))
    classes = group(pending)
    class_of = {p.key: c.cid for c in classes for p in c.pods}
    pods = {p.key: p for p in pending}
    nodes = node_infos(state, whole_gpu=whole_gpu)
    if whole_gpu and hint_policy is not None:
        hint_policy = "whole-gpu"
    if hint is None and hint_policy is not None and pending:
        try:
            hint = greedy_assignments(state, pending, hint_policy)
        except ImportError:
            hint = None
    groups = components(nodes, classes, relax) if decompose else [(nodes, classes)]
    sizes = [sum(len(n.slots) for n in ns) * max(1, len(cs)) for ns, cs in groups]
    total_size = sum(sizes) or 1
    placements: dict[str, Assignment | None] = {p.key: None for p in pending}
    all_stages: list[list[StageResult]] = []
    bound = 0
    result_state = state.copy()
    for (gnodes, gclasses), size in zip(groups, sizes, strict=True):
        elapsed = time.monotonic() - t_start
        budget = max(0.1, (time_limit - elapsed) * size / max(1, total_size))
        total_size -= size
        if decompose and large_threshold is not None and size > large_threshold and len(gnodes) > 2 * LNS_GROUP:
            # Too big to prove in one model: improve by node groups, bound with the whole model.
            comp_pods = [p for c in gclasses for p in c.pods]
            comp_hint = {p.key: (hint or {}).get(p.key) for p in comp_pods}
            got, stage_results = solve_large(state, gnodes, gclasses, comp_pods, comp_hint, budget, workers,
                                             relax, symmetry, seed, LNS_GROUP, _exact_step(workers, symmetry))
            all_stages.append(stage_results)
            bound += stage_results[0].bound
            for key, asg in got.items():
                if asg is not None:
                    result_state.allocate(pods[key], asg)
                    placements[key] = asg
            continue
        pm = PackingModel(gnodes, gclasses, relax, symmetry=symmetry)
        h = hint_from(pm, hint, pods, class_of) if hint else None
        values, stage_results = solve_stages(pm, stages, budget, workers, h, shares=shares)
        all_stages.append(stage_results)
        first = stage_results[0] if stage_results else None
        bound += first.bound if first is not None else sum(len(c.pods) for c in gclasses)
        if values is None:
            continue
        for key, (node, grants) in extract(pm, values).items():
            asg = Assignment(node, tuple(grants))
            result_state.allocate(pods[key], asg)  # re-checks every rule
            placements[key] = asg
    placed = sum(1 for a in placements.values() if a is not None)
    optimal = all(s.proven for st in all_stages for s in st)
    opened = opened_gpus(state, result_state)
    bound = max(bound, placed)
    merged = _merge_stages(all_stages)
    return OptimalResult(
        placements=placements, placed=placed, unplaced=len(pending) - placed, gpus_opened=opened,
        stranded_vram_mib=result_state.stranded_mib(), optimal=optimal, bound=bound,
        gap=(bound - placed) / bound if bound else 0.0, wall_s=time.monotonic() - t_start,
        stages=merged, components=len(groups), state=result_state)


def _exact_step(workers: int, symmetry: bool) -> StepSolve:
    """The large search's step: re-solve one node group exactly, seeded with its current placement."""

    def step(sub: ClusterState, pods: list[PodDemand], time_limit: float, hint: Placements
             ) -> tuple[Placements, int, ClusterState]:
        res = solve_optimal(sub, pods, time_limit=time_limit, workers=workers, hint=hint, hint_policy=None,
                            symmetry=symmetry, large_threshold=None)
        assert res.state is not None
        return res.placements, res.placed, res.state

    return step


def _merge_stages(per_group: list[list[StageResult]]) -> list[StageResult]:
    if not per_group:
        return []
    out = []
    for i in range(max(len(s) for s in per_group)):
        rows = [s[i] for s in per_group if i < len(s)]
        status = "OPTIMAL" if all(r.proven for r in rows) else ",".join(sorted({r.status for r in rows}))
        out.append(StageResult(rows[0].name, sum(r.value for r in rows), sum(r.bound for r in rows), status,
                               sum(r.wall_s for r in rows)))
    return out


def verify(state: ClusterState, pending: Sequence[PodDemand], placements: dict[str, Assignment | None]
           ) -> ClusterState:
    """Replay placements through ClusterState.allocate on a copy; raises PlacementError on any breach."""
    sim = state.copy()
    by_key = {p.key: p for p in pending}
    for key, asg in placements.items():
        if asg is not None:
            try:
                sim.allocate(by_key[key], asg)
            except PlacementError as e:
                raise PlacementError(f"optimal placement of {key} rejected by the core: {e}") from e
    return sim
