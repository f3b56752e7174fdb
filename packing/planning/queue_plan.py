"""Plan the whole pending queue with CP-SAT, outside the request path.

`plan_queue(state, queue)` places every queued pod it can on top of what `state` holds, with the model of
`packing.solvers.optimal` (same rules as `ClusterState.allocate`; every planned assignment has gone through
`allocate` before it is returned: the greedy pass places through it, the solver's placements are replayed through
it, and a part where one fails keeps the incumbent's placement). Objective, lexicographic:
1. pods placed per priority tier, highest priority first (all of the highest tier that can be placed, then the
   next tier, ...);
2. older before newer at equal priority: with the counts per tier fixed, the sum of the placed pods' seniority
   (queue size minus rank in the queue order: priority desc, then `created` asc) is maximised. Single-GPU pods
   are weighed one by one; multi-GPU pods of one shape and priority are counted together, oldest placed first,
   weighed by their mean seniority;
3. fewest GPUs opened (idle before, in use after); 4. least stranded VRAM (as `solve_optimal`). Stages 3-4 are
   solved in parts where the online placement leaves pods out, and (with `repack`) in the others too.

Without `repack` a part no solver weighed gets no planned units: its pods are in `QueuePlan.online`, left to the
online policy itself at their turn. The greedy pass below only stands in for that policy (on a large cluster it
sees the candidate nodes and scores on shortlists), and committing its placement made the burst trace worse than
placing online (4.30 against 4.08 % over 10 seeds; an earlier round of the queue study, in git history).

How (all on copies; `state` is never touched):
- the queue is ordered as the scheduler's queue (priority desc, created asc); pods already holding units in
  `state` and repeated keys are left out;
- candidate nodes (`queue_nodes.candidates`): every node when the cluster has at most `FULL_NODES` nodes; else,
  per group of pods that differ at most in CPU (`rank_key`), the best nodes by the online policy's ranking of a
  pool of `RANK_POOL` nodes the group fits (half the fullest, half spread over the rest), groups with most pods
  first, while `RANK_SHARE` of the budget lasts (later groups take their pool unranked); taken in turn from each
  group's list until `CANDIDATES_PER_GPU` nodes per GPU the queue asks for (at least `MIN_CANDIDATES`) are in, the
  previous plan's nodes first, at most `MAX_NODES` in all. The planner copies only those nodes (a deep copy of a
  5,000-node state alone costs seconds);
- incumbent: the online policy's placement of the queue in order on the candidates (`greedy`; a pod is scored on
  its group's `SHORTLIST` best candidates while one of them fits it, on every candidate after), and, with
  `previous`, the previous plan's assignments that are still valid (pods still queued, units still free) completed
  by the online policy; the better of the two is the CP-SAT hint and the floor. When the warm start places every
  pod the greedy pass is skipped (it could place no more; it may open fewer GPUs, which the solver looks for);
- parts: the candidates are cut into independent groups (no pod shape fits two of them now, `fit.feasible`; what
  does not fit now never fits in a plan, which only adds pods). A part whose incumbent places every pod on GPUs
  already in use is not solved (only stranded VRAM, the last stage, could improve). The others are solved by
  `solve_optimal` (no second model) with the stages above (a part whose incumbent places every pod: pods of a
  shape counted together, and the count and the GPUs opened in one stage, `ALL_PLACED_STAGES`: no count or age
  is left to win, and a stage costs a CP-SAT call), parts where the
  incumbent leaves pods out first, then those where it opened GPUs, each with a share of the time left in
  proportion to its size; a part's result replaces the incumbent's placement there only when it is better on the
  objective. A part too big to build in its share is re-planned on neighbourhoods, one after the other while its
  share lasts (`queue_nodes.neighbourhood`: the nodes where the incumbent's pods block pods it left out, or where
  it opened most GPUs, and nodes those pods could move to; the rest of the incumbent stays).

Time budget (`time_limit_s`, default 0.5 s): it covers everything, measured on `clock` from the call (ranking,
copying, the greedy pass, model building, solving, committing). The parts are solved by `queue_parts.PartsSolver`,
which holds the constants named here. Model building is estimated (per GPU x pod-class
pair: `BUILD_S_PER_PAIR` at first, then what the last solves measured on this machine, `_build_rate`; plus
`STAGE_OVERHEAD_S` per CP-SAT stage) and taken from a part's solve time; a part whose estimate leaves less than
`MIN_SOLVE_S` to solve, and every part once the budget is spent, keeps the incumbent (greedy) placement. The
solver's placements are replayed through `allocate` on a copy of the part and committed through it on the
incumbent's copy (a refusal keeps the incumbent's part). Past the budget: the greedy pass is always completed,
since it is the floor (it costs about 1 ms a pod at 128 candidates on a 5,000-node cluster, benchmarks/results/
queue.md part (c)), so a queue of more than a few hundred pods plans past the budget as the online placement
(status "greedy", and `solve_s` says by how much); an estimate that is low (models vary) makes a solve overrun by
the difference (queue.md measures it).

Statuses: "optimal" - every part was solved and every stage proven optimal over every node (no candidate cut);
"feasible" - the solver's placement was kept for at least one part, or some part was proven optimal, but not
everything was proven; "greedy" - the solver improved nothing in the budget (or no part needed it: `parts` counts
the parts solved): the plan is the incumbent (the online policy's placement, or the previous plan completed by
it); "roomy" - without repack and with no unit of the previous plan still standing, every pod fits now on more
nodes than there are pods ahead of it in the queue (`room`), so the online policy places them all and the plan
leaves them all to it, having built nothing (the greedy pass's plan would say the same; this costs one vectorised
filter per pod shape); "empty" - the queue held no pod to plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from packing import cycle, fit
from packing.model import Assignment, PodDemand
from packing.planning.queue_nodes import (
    PlanPolicy,
    RankKey,
    candidates,
    planning_policy,
    rank_key,
)
from packing.planning.queue_parts import PartsSolver, independent_parts, score
from packing.planning.queue_room import Shape, room
from packing.planning.working_copy import sub_state
from packing.solvers.slots import group_pods
from packing.state import ClusterState, PlacementError

RANK_SHARE = 0.2  # share of the budget the policy may spend ranking candidate nodes on a large cluster


@dataclass(frozen=True)
class QueuedPod:
    """A pending pod as the queue holds it."""

    pod: PodDemand  # pod.priority counts (higher first)
    created: float  # creation time, epoch seconds: older first among equal priority


@dataclass(frozen=True)
class QueuePlan:
    """Planned units for the pods the plan places (pod key -> Assignment, in plan order: priority, then age).

    status: "optimal" | "feasible" | "greedy" | "roomy" | "empty" (see the module docstring); solve_s: wall time of
    `plan_queue`; queue_size: pods in the queue; placed: pods the plan places, with `online`; parts: independent
    parts solved; online: pods the plan leaves to the online policy (without `repack`: the ones only its greedy
    pass placed, since the online policy itself, on every node at the pod's turn, is that floor; they have no
    `assignments` entry).
    """

    assignments: Mapping[str, Assignment]
    status: str
    solve_s: float
    queue_size: int
    placed: int
    parts: int
    online: frozenset[str] = frozenset()
    room: Mapping[Shape, int] | None = None  # status "roomy": the nodes each pod shape fit (`still_roomy`)


def queue_order(state: ClusterState, queue: Sequence[QueuedPod]) -> list[QueuedPod]:
    """The queue as the plan takes it: in the scheduler's order (priority desc, created asc), without repeated
    keys and pods already holding units in `state`."""
    seen: set[str] = set()
    items: list[tuple[int, QueuedPod]] = []
    for i, q in enumerate(queue):
        if q.pod.key in seen or state.holder(q.pod.key) is not None:
            continue
        seen.add(q.pod.key)
        items.append((i, q))
    items.sort(key=lambda t: (-t[1].pod.priority, t[1].created, t[0]))
    return [q for _, q in items]


def _online(sim: ClusterState, pods: Sequence[PodDemand], policy: PlanPolicy,
            fixed: Mapping[str, Assignment] | None = None,
            shortlist: Mapping[RankKey, Sequence[str]] | None = None) -> dict[str, Assignment]:
    """`fixed` assignments first (those `allocate` refuses are dropped), then the online policy for the rest,
    in queue order, on `sim` (mutated). A pod whose group has a `shortlist` is scored on the shortlisted nodes
    it fits, and on every node only when it fits none of them (scoring costs per node). Returns what got placed."""
    pol = planning_policy(policy)
    by_key = {p.key: p for p in pods}
    out: dict[str, Assignment] = {}
    for key, asg in (fixed or {}).items():
        try:
            sim.allocate(by_key[key], asg)
            out[key] = asg
        except PlacementError:
            pass
    rows: dict[RankKey, np.ndarray] = {}
    for group, names in (shortlist or {}).items():
        if names:
            mask = np.zeros(len(sim), dtype=bool)
            mask[[sim.index_of(n) for n in names]] = True
            rows[group] = mask
    for p in pods:
        pol.observe(p)
        if p.key in out:
            continue
        now = fit.feasible(sim, p, pol.whole_gpu).now
        short = rows.get(rank_key(p))
        if short is not None and (now & short).any():
            now = now & short
        got = cycle.place(sim, p, pol, now)
        if got is not None:
            out[p.key] = got
    return out


# ------------------------------------------------------------------------------------------- entry point
def plan_queue(state: ClusterState, queue: Sequence[QueuedPod], *, time_limit_s: float = 0.5,
               previous: QueuePlan | None = None, policy: PlanPolicy = "vramfit",
               clock: Callable[[], float] = time.monotonic, workers: int = 1,
               repack: bool = False) -> QueuePlan:
    """Plan the pending `queue` on top of `state` (not modified) within `time_limit_s` (see the module docstring).

    `previous`: the last plan; its assignments for pods still queued whose units are still free warm-start the
    search. `policy`: the online policy whose placement is the floor and the hint, by registry name or as the live
    object (each pass plans with a fork of it: `queue_nodes.planning_policy`). `clock`: what every step of
    the budget is measured with (tests inject one). `workers`: CP-SAT's search threads; one by default, since
    the live planner shares the extender's CPUs with the verbs it must not slow down (extender_plan_inline40.md).
    `repack`: also solve parts whose incumbent places every pod, for fewer GPUs opened and less stranded VRAM
    (objectives 3 and 4). Off by default: such a part is left to the online policy (`QueuePlan.online`), whose
    measure weighs the pods still to come; re-solving it for GPUs opened stranded more VRAM on the benchmark's
    bursts and did not lower the burst trace's unallocated GPU (benchmarks/results/queue.md, "no repack" columns).
    """
    t0 = clock()
    deadline = t0 + time_limit_s
    pods = [q.pod for q in queue_order(state, queue)]
    n = len(pods)
    if n == 0:
        return QueuePlan(MappingProxyType({}), "empty", clock() - t0, len(queue), 0, 0)
    by_key = {p.key: p for p in pods}
    seniority = {p.key: n - r for r, p in enumerate(pods)}
    tiers = sorted({p.priority for p in pods}, reverse=True)

    # A queue the cluster has room for (`room`): the online policy places every pod, so the count and the ages
    # are already won and, without repack, the plan would leave every pod to it. Said without a greedy pass or a
    # solve, which on a 5,000-node cluster cost the worker ~0.3 s of CPU a round (an earlier round, in git history). Not with
    # surviving units of the previous plan, which are kept as they are (they are checked below).
    whole = planning_policy(policy).whole_gpu
    kept_prev = previous is not None and any(k in by_key for k in previous.assignments)
    counts = None if repack or kept_prev else room(state, pods, whole)
    if counts is not None:
        return QueuePlan(MappingProxyType({}), "roomy", clock() - t0, len(queue), n, 0, frozenset(by_key), counts)

    prev_nodes = [a.node for a in previous.assignments.values()] if previous is not None else []
    cand = candidates(state, pods, policy, prev_nodes, t0 + RANK_SHARE * time_limit_s, clock)
    base = sub_state(state, cand.names)
    incumbent, inc_sim, fixed = _incumbent(base, pods, policy, previous, set(cand.names), cand.shortlist,
                                           tiers, seniority)
    # Pods whose units the plan chose (in a part the solver weighed, or kept from the previous plan): the rest
    # only the greedy pass placed.
    chosen = {k for k in incumbent if k in fixed}
    solver = PartsSolver(base, pods, incumbent, inc_sim, seniority, whole=whole, repack=repack, workers=workers,
                         deadline=deadline, clock=clock, chosen=chosen, proven_all=not cand.cut)
    solver.solve(independent_parts(base, group_pods(pods), whole))
    return _plan_of(solver, pods, repack, len(queue), t0, clock)


def _incumbent(base: ClusterState, pods: list[PodDemand], policy: PlanPolicy, previous: QueuePlan | None,
               name_set: set[str], shortlist: Mapping[RankKey, Sequence[str]], tiers: Sequence[int],
               seniority: Mapping[str, int]) -> tuple[dict[str, Assignment], ClusterState, dict[str, Assignment]]:
    """The online policy's placement, or the previous plan's surviving part completed by it: the incumbent, the
    copy of `base` that holds it, and the previous plan's assignments it kept.

    A warm start that places every pod skips the greedy pass (the costliest step: the policy scores every pod),
    which could place no more; it might open fewer GPUs, which the solver's stages look for."""
    by_key = {p.key: p for p in pods}
    incumbent: dict[str, Assignment] | None = None
    inc_sim: ClusterState = base
    fixed = {k: a for k, a in previous.assignments.items() if k in by_key and a.node in name_set} if previous else {}
    if fixed:
        inc_sim = base.copy()
        incumbent = _online(inc_sim, pods, policy, fixed, shortlist)
    if incumbent is None or len(incumbent) < len(pods):
        sim = base.copy()
        greedy = _online(sim, pods, policy, shortlist=shortlist)
        if incumbent is None or (score(base, sim, greedy, by_key, tiers, seniority)
                                 >= score(base, inc_sim, incumbent, by_key, tiers, seniority)):
            incumbent, inc_sim, fixed = greedy, sim, {}
    assert incumbent is not None
    return incumbent, inc_sim, fixed


def _plan_of(solver: PartsSolver, pods: list[PodDemand], repack: bool, queue_size: int, t0: float,
             clock: Callable[[], float]) -> QueuePlan:
    """The plan the parts left: planned units, the pods left to the online policy, and the status."""
    placed = {p.key: a for p in pods if (a := solver.plan[p.key]) is not None}
    # Without repack, in a part no solver weighed the greedy pass only stood in for the online policy (on the
    # candidates, shortlisted): its pods are left to the online policy itself, which on a large cluster chooses
    # better than the stand-in could (burst trace, queue_homes.md).
    online = frozenset() if repack else frozenset(k for k in placed if k not in solver.chosen)
    out = {k: a for k, a in placed.items() if k not in online}
    status = ("optimal" if solver.proven_all else "feasible" if solver.improved or solver.any_proven
              else "greedy")
    return QueuePlan(MappingProxyType(out), status, clock() - t0, queue_size, len(placed), solver.solved, online)
