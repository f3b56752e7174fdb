"""Solving the queue plan's parts (`packing.planning.queue_plan`): the independent parts of the candidate nodes,
the stages each is solved with, the time each may take, and committing a better placement on the incumbent.

Model building is estimated per GPU x pod-class pair (`BUILD_S_PER_PAIR` at first, then what the last solves
measured on this machine, `_build_rate`; plus `STAGE_OVERHEAD_S` per CP-SAT stage) and taken from a part's solve
time; a part whose estimate leaves less than `MIN_SOLVE_S` to solve keeps the incumbent's placement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from packing import fit
from packing.model import Assignment, PodDemand
from packing.planning.queue_nodes import neighbourhood
from packing.planning.working_copy import sub_state
from packing.solvers.model import Objective, PackingModel, Terms
from packing.solvers.optimal import OptimalResult, solve_optimal
from packing.solvers.slots import PodClass, group_pods
from packing.state import ClusterState, PlacementError

BUILD_S_PER_PAIR = 60e-6  # first estimate of model building time per (GPU, pod class) pair
_build_rate = [BUILD_S_PER_PAIR]  # the estimate, learned from the solves (exponential average)
MIN_SOLVE_S = 0.04  # a part is solved only with at least this much time left for CP-SAT
STAGE_SHARES = 0.5  # each stage's share of the time left (the last stage takes what is left)
VERIFY_S = 0.02  # kept back for committing the solver's placements (replayed through allocate)
MIN_PAIRS = 200  # smallest neighbourhood worth a model
STAGE_OVERHEAD_S = 0.02  # fixed cost of one CP-SAT stage (the model is copied and presolved each time)


def independent_parts(state: ClusterState, classes: list[PodClass], whole_gpu: bool
           ) -> list[tuple[list[str], list[PodClass]]]:
    """Independent parts: a pod class and a node are linked when the class fits the node now (`fit.feasible`;
    what does not fit now never fits in a plan, since a plan only adds pods)."""
    names = state.node_names
    parent = list(range(len(names)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first: dict[int, int] = {}
    for c in classes:
        idx = np.flatnonzero(fit.feasible(state, c.rep, whole_gpu).now)
        if idx.size == 0:
            continue
        first[c.cid] = int(idx[0])
        r0 = find(int(idx[0]))
        for i in idx[1:]:
            ri = find(int(i))
            if ri != r0:
                parent[ri] = r0
    groups: dict[int, tuple[list[str], list[PodClass]]] = {}
    for c in classes:
        if c.cid in first:
            groups.setdefault(find(first[c.cid]), ([], []))[1].append(c)
    for i, n in enumerate(names):
        g = groups.get(find(i))
        if g is not None:
            g[0].append(n)
    return list(groups.values())


def _group_one_by_one(pending: Sequence[PodDemand]) -> list[PodClass]:
    """One class per single-GPU pod; multi-GPU pods by (shape, priority), in queue order (oldest first)."""
    out: list[PodClass] = []
    multi: dict[tuple[object, ...], PodClass] = {}
    for p in pending:
        if p.gpu_count > 1:
            key = (p.shape, p.priority)
            if key not in multi:
                multi[key] = PodClass(cid=len(out), pods=[])
                out.append(multi[key])
            multi[key].pods.append(p)
        else:
            out.append(PodClass(cid=len(out), pods=[p]))
    return out


def _stages(tiers: Sequence[int], seniority: Mapping[str, int]) -> list[Objective]:
    def make_tier(t: int) -> Objective:
        def terms(pm: PackingModel) -> Terms:
            return [(pm.placed[c.cid], 1) for c in pm.classes if c.pods and c.rep.priority == t], 0
        return (f"placed[priority={t}]", terms, True)

    def senior(pm: PackingModel) -> Terms:
        out = []
        for c in pm.classes:
            if c.pods:
                w = round(sum(seniority[p.key] for p in c.pods) / len(c.pods))
                out.append((pm.placed[c.cid], w))
        return out, 0

    return [*(make_tier(t) for t in tiers), ("seniority", senior, True),
            ("gpus_opened", PackingModel.opened_terms, False),
            ("stranded_vram_mib", PackingModel.stranded_terms, False)]


def _placed_then_opened(pm: PackingModel) -> Terms:
    """Pods placed, then fewest GPUs opened, in one stage: each pod weighs more than every GPU there is. For a
    part whose incumbent places every pod, where a stage of its own for the count (already at its bound) would
    spend a CP-SAT call to prove it."""
    placed, offset = pm.placed_terms()
    opened, _ = pm.opened_terms()
    big = len(opened) + 1
    return [(v, c * big) for v, c in placed] + [(v, -c) for v, c in opened], offset * big


ALL_PLACED_STAGES: list[Objective] = [("placed_then_gpus_opened", _placed_then_opened, True),
                                      ("stranded_vram_mib", PackingModel.stranded_terms, False)]


def _opened(before: ClusterState, after: ClusterState, names: Sequence[str]) -> int:
    """GPUs of the named nodes idle before and in use after."""
    n = 0
    for name in names:
        for a, b in zip(before.usage(name).gpus, after.usage(name).gpus, strict=True):
            n += int(not a.grants and bool(b.grants))
    return n


def _apply(base: ClusterState, placements: Mapping[str, Assignment | None], pods: Mapping[str, PodDemand]
           ) -> tuple[ClusterState, dict[str, Assignment]]:
    """`placements` in order on a copy of `base`; what `allocate` refuses is dropped."""
    sim = base.copy()
    kept: dict[str, Assignment] = {}
    for key, asg in placements.items():
        if asg is None:
            continue
        try:
            sim.allocate(pods[key], asg)
        except PlacementError:
            continue
        kept[key] = asg
    return sim, kept


def score(base: ClusterState, sim: ClusterState, kept: Mapping[str, Assignment], pods: Mapping[str, PodDemand],
           tiers: Sequence[int], seniority: Mapping[str, int]) -> tuple[int, ...]:
    """The objective, as a tuple to maximise: placed per tier, seniority, -GPUs opened, -stranded VRAM added."""
    per_tier: dict[int, int] = defaultdict(int)
    for key in kept:
        per_tier[pods[key].priority] += 1
    touched = sorted({a.node for a in kept.values()})
    stranded = sum(sim.node_stranded_mib(n) - base.node_stranded_mib(n) for n in touched)
    return (*(per_tier[t] for t in tiers), sum(seniority[k] for k in kept), -_opened(base, sim, touched), -stranded)

# ------------------------------------------------------------------------------------------- the parts
@dataclass
class _Part:
    """One independent part and how the incumbent does there."""

    names: list[str]
    pods: list[PodDemand]
    all_in: bool  # the incumbent places every pod of the part
    opened: int  # GPUs the incumbent opened there


@dataclass
class _PartRun:
    """One part's models so far: neighbourhoods solved, whether the last model was the whole part."""

    done: set[str] = field(default_factory=set)  # blocked nodes of the neighbourhoods solved so far
    ran: bool = False
    whole_part: bool = False
    blocked: list[str] = field(default_factory=list)


@dataclass
class _Model:
    """What one solve is built on: the nodes' copy and the pods, with the build rate and the share then."""

    sub: ClusterState
    pods: list[PodDemand]
    rate: float
    share: float


class PartsSolver:
    """Solves the parts in turn, each with its share of the time left, and commits a better placement of a part
    on the incumbent (`incumbent`, held in `inc_sim`). `plan` follows the commits; `chosen` gains the pods of
    every part a solver weighed; `proven_all`, `improved`, `any_proven` and `solved` make the plan's status."""

    def __init__(self, base: ClusterState, pods: list[PodDemand], incumbent: dict[str, Assignment],
                 inc_sim: ClusterState, seniority: Mapping[str, int], *, whole: bool, repack: bool, workers: int,
                 deadline: float, clock: Callable[[], float], chosen: set[str], proven_all: bool) -> None:
        self.base = base
        self.pods = pods
        self.incumbent = incumbent
        self.inc_sim = inc_sim
        self.seniority = seniority
        self.whole = whole
        self.repack = repack
        self.workers = workers
        self.deadline = deadline
        self.clock = clock
        self.plan: dict[str, Assignment | None] = {p.key: incumbent.get(p.key) for p in pods}
        self.chosen = chosen
        self.solved = 0
        self.proven_all = proven_all
        self.improved = False
        self.any_proven = False

    def grouping(self, ps: Sequence[PodDemand]) -> Callable[[Sequence[PodDemand]], list[PodClass]]:
        """Every pod placed by the incumbent: no count or age left to win, so identical pods count together."""
        return group_pods if all(p.key in self.incumbent for p in ps) else _group_one_by_one

    def solve(self, parts: list[tuple[list[str], list[PodClass]]]) -> None:
        """The parts where the incumbent leaves pods out first, then those where it opened GPUs, the largest first;
        each with a share of the time left in proportion to its size."""
        infos = self._parts_info(parts)
        sizes = [sum(len(self.base.node(nm).gpus) for nm in part.names) * len(self.grouping(part.pods)(part.pods))
                 for part in infos]
        left_size = sum(sizes)
        for part, size in zip(infos, sizes, strict=True):
            if part.all_in and (part.opened == 0 or not self.repack):
                # Every pod placed on GPUs already in use: only stranded VRAM, the last stage, could improve;
                # not worth a model (the incumbent stays; the part is not proven).
                self.proven_all = False
                left_size -= size
                continue
            part_end = self.clock() + (self.deadline - self.clock() - VERIFY_S) * size / max(1, left_size)
            left_size -= size
            run = self._solve_part(part, size, part_end)
            self.solved += int(run.ran)
            if run.ran:  # the solver weighed this part: its pods take the plan's units, improved or confirmed
                self.chosen.update(p.key for p in part.pods)
            self.proven_all = self.proven_all and run.ran and run.whole_part

    def _parts_info(self, parts: list[tuple[list[str], list[PodClass]]]) -> list[_Part]:
        infos = []
        for pnames, pclasses in parts:
            keys = {p.key for c in pclasses for p in c.pods}
            ppods = [p for p in self.pods if p.key in keys]
            all_in = all(p.key in self.incumbent for p in ppods)
            touched = sorted({self.incumbent[p.key].node for p in ppods if p.key in self.incumbent})
            infos.append(_Part(pnames, ppods, all_in, _opened(self.base, self.inc_sim, touched)))
        infos.sort(key=lambda t: (t.all_in, t.opened == 0, -len(t.pods)))
        return infos

    def _solve_part(self, part: _Part, size: int, part_end: float) -> _PartRun:
        """The whole part when it can be built in its share, else its neighbourhoods in turn while the share lasts."""
        n_stages = len(ALL_PLACED_STAGES) if part.all_in else len({p.priority for p in part.pods}) + 3
        run = _PartRun()
        while True:
            model = self._next_model(part, size, part_end, n_stages, run)
            if model is None or not self._solve_model(part, model, n_stages, run):
                break
            if run.whole_part or not run.blocked:
                break
        return run

    def _next_model(self, part: _Part, size: int, part_end: float, n_stages: int, run: _PartRun) -> _Model | None:
        """The next model to build: the whole part, a neighbourhood of it, or None when time or pods ran out."""
        rate = _build_rate[0]
        share = part_end - self.clock()
        # Half the share for building, half for solving; with little time left, what is left past
        # MIN_SOLVE_S for building (a small neighbourhood still moves a few pods).
        free = share - STAGE_OVERHEAD_S * n_stages
        max_pairs = int(min(free / 2, free - MIN_SOLVE_S) / rate)
        if size <= max_pairs and not run.done:
            sub, ppods, run.whole_part = sub_state(self.base, part.names), part.pods, True
        elif max_pairs >= MIN_PAIRS:
            # Too big to build in time: re-plan neighbourhoods of it in turn (see queue_nodes.neighbourhood).
            sub, ppods, run.blocked = neighbourhood(self.base, self.inc_sim, part.names, part.pods, self.incumbent,
                                                    max_pairs, self.whole, run.done)
            run.done.update(run.blocked)
        else:
            return None
        if not ppods:
            return None
        return _Model(sub, ppods, rate, share)

    def _solve_model(self, part: _Part, model: _Model, n_stages: int, run: _PartRun) -> bool:
        """Solve one model and commit its placement if better; False when too little time is left to solve."""
        group = self.grouping(model.pods)
        pairs = sum(len(model.sub.node(nm).gpus) for nm in model.sub.node_names) * len(group(model.pods))
        solve_budget = (min(model.share, self.deadline - self.clock() - VERIFY_S) - model.rate * pairs
                        - STAGE_OVERHEAD_S * n_stages)
        if solve_budget < MIN_SOLVE_S:
            return False
        ptiers = sorted({p.priority for p in model.pods}, reverse=True)
        stages = ALL_PLACED_STAGES if part.all_in else _stages(ptiers, self.seniority)
        hint: dict[str, Assignment | None] = {p.key: self.incumbent.get(p.key) for p in model.pods}
        t_solve = self.clock()
        res = solve_optimal(model.sub, model.pods, time_limit=solve_budget, workers=self.workers, hint=hint,
                            hint_policy=None, decompose=False, stages=stages, large_threshold=None, group=group,
                            shares=[STAGE_SHARES] * len(stages))
        _learn_build_rate(self.clock() - t_solve - sum(st.wall_s for st in res.stages), pairs)
        run.ran = True
        proven = res.optimal and bool(res.stages)
        self.any_proven = self.any_proven or (proven and run.whole_part)
        self.proven_all = self.proven_all and proven and run.whole_part
        self._commit_if_better(model, hint, res, ptiers)
        return True

    def _commit_if_better(self, model: _Model, hint: dict[str, Assignment | None], res: OptimalResult,
                          ptiers: list[int]) -> None:
        """Replace the incumbent's placement of the model's pods by the solver's when it scores better and every
        unit of it is granted on the incumbent's own copy (a refusal anywhere keeps the incumbent: the floor)."""
        pset = {p.key: p for p in model.pods}
        # The incumbent's pods of this part are on `sub`'s nodes: `inc_sim` holds them as placed (by allocate).
        ikept = {k: a for k, a in hint.items() if a is not None}
        if res.state is not None:  # every placement of the solver went through allocate on a copy of `sub`
            nsim, nkept = res.state, {k: a for k, a in res.placements.items() if a is not None}
        else:
            nsim, nkept = _apply(model.sub, res.placements, pset)
        if (score(model.sub, nsim, nkept, pset, ptiers, self.seniority)
                > score(model.sub, self.inc_sim, ikept, pset, ptiers, self.seniority)
                and _swap(self.inc_sim, model.pods, ikept, nkept)):
            self.improved = True
            for p in model.pods:
                self.plan[p.key] = nkept.get(p.key)
                self.incumbent.pop(p.key, None)
            self.incumbent.update(nkept)


def _learn_build_rate(spent: float, pairs: int) -> None:
    """Fold a solve's building time (its wall time less the stages') into the per-pair estimate."""
    if pairs > 0 and spent > 0:
        _build_rate[0] = 0.7 * _build_rate[0] + 0.3 * spent / pairs


def _swap(sim: ClusterState, pods: Sequence[PodDemand], old: Mapping[str, Assignment],
          new: Mapping[str, Assignment]) -> bool:
    """Replace `old` (held in `sim`) by `new` through release and allocate; on any refusal put `old` back."""
    for key in old:
        sim.release(key)
    done: list[str] = []
    by_key = {p.key: p for p in pods}
    try:
        for p in pods:
            if p.key in new:
                sim.allocate(p, new[p.key])
                done.append(p.key)
    except PlacementError:
        for key in done:
            sim.release(key)
        for key, asg in old.items():
            sim.allocate(by_key[key], asg)
        return False
    return True
