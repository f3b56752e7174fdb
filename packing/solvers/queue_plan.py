"""Plan the whole pending queue with CP-SAT, outside the request path (issue 13).

`plan_queue(state, queue)` places every queued pod it can on top of what `state` holds, with the model of
`packing.solvers.optimal` (same rules as `ClusterState.allocate`; every planned assignment is replayed through
`allocate` before it is returned, and one that fails is dropped). Objective, lexicographic:
1. pods placed per priority tier, highest priority first (all of the highest tier that can be placed, then the
   next tier, ...);
2. older before newer at equal priority: with the counts per tier fixed, the sum of the placed pods' seniority
   (queue size minus rank in the queue order: priority desc, then `created` asc) is maximised. Single-GPU pods
   are weighed one by one; multi-GPU pods of one shape and priority are counted together, oldest placed first,
   weighed by their mean seniority;
3. fewest GPUs opened (idle before, in use after); 4. least stranded VRAM (as `solve_optimal`).

How (all on copies; `state` is never touched):
- the queue is ordered as the scheduler's queue (priority desc, created asc); pods already holding units in
  `state` and repeated keys are left out;
- candidate nodes: every node when the cluster has at most `FULL_NODES` nodes; else, per pod shape, the best
  nodes by the online policy's ranking, taken in turn from each shape's ranking until `CANDIDATES_PER_GPU` nodes per
  GPU the queue asks for (at least `MIN_CANDIDATES`) are in, plus the
  nodes of the previous plan, at most `MAX_NODES` in all. The planner copies only those nodes (a deep copy of a
  5,000-node state alone costs seconds);
- incumbent: the online policy's placement of the queue in order on the candidates (`greedy`), and, with
  `previous`, the previous plan's assignments that are still valid (pods still queued, units still free) completed
  by the online policy; the better of the two is the CP-SAT hint and the floor;
- parts: the candidates are cut into independent groups (no pod shape fits two of them now, `fit.feasible`; what
  does not fit now never fits in a plan, which only adds pods); each part is solved by `solve_optimal` (no second
  model) with the stages above, parts where the incumbent leaves pods out first, each with a share of the time left
  in proportion to its size; a part's result replaces the incumbent's placement there only when it is better on the
  objective. A part too big to build in its share is re-planned on a neighbourhood (`_neighbourhood`: the nodes
  where the incumbent's pods block pods it left out, and nodes those pods could move to; the rest of the incumbent
  stays).

Time budget (`time_limit_s`, default 0.5 s): it covers everything (copying, the greedy pass, model building,
solving, verifying). Model building is estimated (per GPU x pod-class pair: `BUILD_S_PER_PAIR` at first, then
what the last solves measured on this machine, `_build_rate`; plus
`STAGE_OVERHEAD_S` per CP-SAT stage) and taken from a part's solve time; a part whose estimate leaves less than
`MIN_SOLVE_S` to solve, and every part once the budget is spent, keeps the incumbent (greedy) placement. Past the
budget: the greedy pass is always completed, since it is the floor, so on a huge queue (thousands of pods) the plan
is simply the online placement and `solve_s` says by how much the budget was exceeded; an estimate that is low
(models vary) makes a solve overrun by the difference (benchmarks/results/queue.md measures it).

Statuses: "optimal" - every part was solved and every stage proven optimal over every node (no candidate cut);
"feasible" - the solver's placement was kept for at least one part, or some part was proven optimal, but not
everything was proven; "greedy" - the solver improved nothing in the budget: the plan is the incumbent (the online
policy's placement, or the previous plan completed by it); "empty" - the queue held no pod to plan.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from packing import cycle, fit
from packing.model import Assignment, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy
from packing.solvers.model import Objective, PackingModel, Terms
from packing.solvers.optimal import solve_optimal
from packing.solvers.slots import PodClass, group_pods
from packing.solvers.working_copy import WorkingCopy, sub_state
from packing.state import ClusterState, PlacementError

FULL_NODES = 256  # clusters up to this many nodes are planned on every node
MAX_NODES = 256  # most candidate nodes on a larger cluster
MIN_CANDIDATES = 64  # candidate nodes on a large cluster, at least
CANDIDATES_PER_GPU = 4  # candidate nodes per GPU the queue asks for
BUILD_S_PER_PAIR = 60e-6  # first estimate of model building time per (GPU, pod class) pair
_build_rate = [BUILD_S_PER_PAIR]  # the estimate, learned from the solves (exponential average)
MIN_SOLVE_S = 0.06  # a part is solved only with at least this much time left for CP-SAT
STAGE_SHARES = 0.5  # each stage's share of the time left (the last stage takes what is left)
VERIFY_S = 0.02  # kept back for the final replay through allocate
MIN_PAIRS = 400  # smallest neighbourhood worth a model
STAGE_OVERHEAD_S = 0.02  # fixed cost of one CP-SAT stage (the model is copied and presolved each time)
RANK_SHARE = 0.2  # share of the budget the policy may spend ranking candidate nodes on a large cluster


@dataclass(frozen=True)
class QueuedPod:
    """A pending pod as the queue holds it."""

    pod: PodDemand  # pod.priority counts (higher first)
    created: float  # creation time, epoch seconds: older first among equal priority


@dataclass(frozen=True)
class QueuePlan:
    """Planned units for the pods the plan places (pod key -> Assignment, in plan order: priority, then age).

    status: "optimal" | "feasible" | "greedy" | "empty" (see the module docstring); solve_s: wall time of
    `plan_queue`; queue_size: pods in the queue; placed: pods the plan places; parts: independent parts solved.
    """

    assignments: Mapping[str, Assignment]
    status: str
    solve_s: float
    queue_size: int
    placed: int
    parts: int

    def node_of(self, key: str) -> str | None:
        asg = self.assignments.get(key)
        return asg.node if asg is not None else None


def _parts(state: ClusterState, classes: list[PodClass], whole_gpu: bool
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


def _opened(before: ClusterState, after: ClusterState, names: Sequence[str]) -> int:
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


def _score(base: ClusterState, sim: ClusterState, kept: Mapping[str, Assignment], pods: Mapping[str, PodDemand],
           tiers: Sequence[int], seniority: Mapping[str, int]) -> tuple[int, ...]:
    """The objective, as a tuple to maximise: placed per tier, seniority, -GPUs opened, -stranded VRAM added."""
    per_tier: dict[int, int] = defaultdict(int)
    for key in kept:
        per_tier[pods[key].priority] += 1
    touched = sorted({a.node for a in kept.values()})
    stranded = sum(sim.node_stranded_mib(n) - base.node_stranded_mib(n) for n in touched)
    return (*(per_tier[t] for t in tiers), sum(seniority[k] for k in kept), -_opened(base, sim, touched), -stranded)


def _online(sim: ClusterState, pods: Sequence[PodDemand], policy: str,
            fixed: Mapping[str, Assignment] | None = None) -> dict[str, Assignment]:
    """`fixed` assignments first (those `allocate` refuses are dropped), then the online policy for the rest,
    in queue order, on `sim` (mutated). Returns what got placed."""
    pol = get_policy(policy)
    by_key = {p.key: p for p in pods}
    out: dict[str, Assignment] = {}
    for key, asg in (fixed or {}).items():
        try:
            sim.allocate(by_key[key], asg)
            out[key] = asg
        except PlacementError:
            pass
    for p in pods:
        if p.key in out:
            pol.observe(p)
            continue
        d = schedule_one(sim, p, pol, explain_failures=False)
        if d.assignment is not None:
            out[p.key] = d.assignment
    return out


def _neighbourhood(base: ClusterState, inc_sim: ClusterState, names: Sequence[str], pods: Sequence[PodDemand],
                   incumbent: Mapping[str, Assignment], max_pairs: int, whole: bool
                   ) -> tuple[WorkingCopy, list[PodDemand]]:
    """A part too big to model in the budget: re-plan some of it, the rest of the incumbent stays.

    Nodes: first those where the incumbent placed queued pods and some pod it left out would fit without them
    ("blocked"; without pods left out: the nodes holding most queued pods), up to half the model; then nodes
    where those pods or the ones left out fit next to the incumbent ("destinations"). Pods: the incumbent's pods
    on the blocked nodes and the first pods it left out (queue order); incumbent pods on destination nodes stay
    where they are. Returns the neighbourhood (a copy of the incumbent's state on those nodes, the re-planned
    pods released) and the pods to re-plan."""
    in_part = set(names)
    on_node: dict[str, list[PodDemand]] = defaultdict(list)
    for p in pods:
        asg = incumbent.get(p.key)
        if asg is not None:
            on_node[asg.node].append(p)
    unplaced = [p for p in pods if p.key not in incumbent][: max(4, max_pairs // 200)]

    def fits(st: ClusterState, some: Sequence[PodDemand]) -> list[str]:
        mask = np.zeros(len(st), dtype=bool)
        for rep in {p.shape: p for p in some}.values():
            mask |= fit.feasible(st, rep, whole).now
        all_names = st.node_names
        return [all_names[i] for i in np.flatnonzero(mask) if all_names[i] in in_part]

    if unplaced:
        blocked = [n for n in fits(base, unplaced) if n in on_node]
    else:
        blocked = list(on_node)
    blocked.sort(key=lambda n: -len(on_node[n]))
    chosen: list[str] = []
    replan: list[PodDemand] = list(unplaced)
    gpus = 0
    for n in blocked:
        g = len(base.node(n).gpus)
        if chosen and (gpus + g) * max(1, len(replan) + len(on_node[n])) > max_pairs // 2:
            break
        chosen.append(n)
        replan += on_node[n]
        gpus += g
    taken = set(chosen)
    for n in fits(inc_sim, replan):
        if n in taken:
            continue
        g = len(base.node(n).gpus)
        if (gpus + g) * max(1, len(replan)) > max_pairs:
            break
        chosen.append(n)
        taken.add(n)
        gpus += g
    sub = sub_state(inc_sim, chosen)
    keys = {p.key for p in replan}
    for key in keys:
        sub.release(key)
    return sub, [p for p in pods if p.key in keys]


def _candidates(state: ClusterState, pods: Sequence[PodDemand], policy: str,
                previous: QueuePlan | None, rank_until: float) -> tuple[list[str], bool]:
    """Candidate node names and whether nodes were cut (not every node that some pod fits now is in).

    Shapes are ranked by the policy (queue order) until `rank_until`; later shapes take the fullest nodes
    they fit (least free VRAM first), which costs no scoring."""
    names = state.node_names
    if len(names) <= FULL_NODES:
        return names, False
    pol = get_policy(policy)
    for p in pods:
        pol.observe(p)
    ranked: list[list[int]] = []
    seen_now = np.zeros(len(names), dtype=bool)
    target = min(MAX_NODES, max(MIN_CANDIDATES, CANDIDATES_PER_GPU * sum(p.gpu_count for p in pods)))
    for c in group_pods(pods):
        rep = c.rep
        mask = fit.feasible(state, rep, pol.whole_gpu).now
        seen_now |= mask
        k = min(int(mask.sum()), target)
        if time.monotonic() < rank_until:
            order = [int(i) for i in cycle.rank(state, rep, pol, mask)[:k]]
        else:
            idx = np.flatnonzero(mask)
            order = [int(i) for i in idx[np.argsort(state.node_free[idx], kind="stable")[:k]]]
        ranked.append(order)
    chosen: dict[int, None] = {}
    if previous is not None:
        for asg in previous.assignments.values():
            if state.has_node(asg.node) and len(chosen) < MAX_NODES // 4:
                chosen[state.index_of(asg.node)] = None
    pos = [0] * len(ranked)
    progress = True
    while progress and len(chosen) < target:
        progress = False
        for j, order in enumerate(ranked):
            if pos[j] < len(order) and len(chosen) < target:
                chosen[order[pos[j]]] = None
                pos[j] += 1
                progress = True
    cut = int(seen_now.sum()) > sum(1 for i in chosen if seen_now[i])
    return [names[i] for i in sorted(chosen)], cut


# ------------------------------------------------------------------------------------------- entry point
def plan_queue(state: ClusterState, queue: Sequence[QueuedPod], *, time_limit_s: float = 0.5,
               previous: QueuePlan | None = None, policy: str = "vramfit") -> QueuePlan:
    """Plan the pending `queue` on top of `state` (not modified) within `time_limit_s` (see the module docstring).

    `previous`: the last plan; its assignments for pods still queued whose units are still free warm-start the
    search. `policy`: the online policy whose placement is the floor and the hint.
    """
    t0 = time.monotonic()
    deadline = t0 + time_limit_s
    seen: set[str] = set()
    items: list[tuple[int, QueuedPod]] = []
    for i, q in enumerate(queue):
        if q.pod.key in seen or state.holder(q.pod.key) is not None:
            continue
        seen.add(q.pod.key)
        items.append((i, q))
    items.sort(key=lambda t: (-t[1].pod.priority, t[1].created, t[0]))
    pods = [q.pod for _, q in items]
    n = len(pods)
    if n == 0:
        return QueuePlan(MappingProxyType({}), "empty", time.monotonic() - t0, len(queue), 0, 0)
    by_key = {p.key: p for p in pods}
    seniority = {p.key: n - r for r, p in enumerate(pods)}
    tiers = sorted({p.priority for p in pods}, reverse=True)

    names, cut = _candidates(state, pods, policy, previous, t0 + RANK_SHARE * time_limit_s)
    base = sub_state(state, names)
    name_set = set(names)

    # Incumbent: the online policy's placement, or the previous plan's surviving part completed by it.
    sim = base.copy()
    greedy = _online(sim, pods, policy)
    incumbent, inc_sim = greedy, sim
    best_q = _score(base, sim, greedy, by_key, tiers, seniority)
    if previous is not None:
        fixed = {k: a for k, a in previous.assignments.items() if k in by_key and a.node in name_set}
        if fixed:
            wsim = base.copy()
            warm = _online(wsim, pods, policy, fixed)
            wq = _score(base, wsim, warm, by_key, tiers, seniority)
            if wq > best_q:
                incumbent, inc_sim, best_q = warm, wsim, wq

    # Parts, the ones where the incumbent leaves pods out first, then the largest.
    whole = get_policy(policy).whole_gpu
    parts = _parts(base, group_pods(pods), whole)
    plan: dict[str, Assignment | None] = {p.key: incumbent.get(p.key) for p in pods}

    def part_key(part: tuple[list[str], list[PodClass]]) -> tuple[int, int]:
        ps = [p for c in part[1] for p in c.pods]
        return (-int(any(p.key not in incumbent for p in ps)), -len(ps))

    parts.sort(key=part_key)
    sizes = [sum(len(base.node(nm).gpus) for nm in ns) * len(_group_one_by_one([p for c in cs for p in c.pods]))
             for ns, cs in parts]
    left_size = sum(sizes)
    solved, proven_all, improved, any_proven = 0, not cut, False, False
    for (pnames, pclasses), size in zip(parts, sizes, strict=True):
        remaining = deadline - time.monotonic() - VERIFY_S
        share = remaining * size / max(1, left_size)
        left_size -= size
        keys = {p.key for c in pclasses for p in c.pods}
        ppods = [p for p in pods if p.key in keys]
        # Half the share for building, half for solving.
        rate = _build_rate[0]
        max_pairs = int((share - STAGE_OVERHEAD_S * (len(tiers) + 3)) / 2 / rate)
        if size <= max_pairs:
            sub = sub_state(base, pnames)
            whole_part = True
        elif max_pairs >= MIN_PAIRS:
            # Too big to build in time: re-plan a neighbourhood of it (see _neighbourhood).
            sub, ppods = _neighbourhood(base, inc_sim, pnames, ppods, incumbent, max_pairs, whole)
            whole_part = False
        else:
            proven_all = False
            continue
        if not ppods:
            continue
        size = sum(len(sub.node(nm).gpus) for nm in sub.node_names) * len(_group_one_by_one(ppods))
        solve_budget = deadline - time.monotonic() - VERIFY_S
        solve_budget = (solve_budget * min(1.0, share / max(1e-9, solve_budget)) - rate * size
                        - STAGE_OVERHEAD_S * (len({p.priority for p in ppods}) + 3))
        if solve_budget < MIN_SOLVE_S:
            proven_all = False
            continue
        pset = {p.key: p for p in ppods}
        ptiers = sorted({p.priority for p in ppods}, reverse=True)
        hint: dict[str, Assignment | None] = {p.key: incumbent.get(p.key) for p in ppods}
        t_solve = time.monotonic()
        res = solve_optimal(sub, ppods, time_limit=solve_budget, hint=hint, hint_policy=None, decompose=False,
                            stages=_stages(ptiers, seniority), large_threshold=None, group=_group_one_by_one,
                            shares=[STAGE_SHARES] * (len(ptiers) + 3))
        spent = time.monotonic() - t_solve - sum(st.wall_s for st in res.stages)
        if size > 0 and spent > 0:
            _build_rate[0] = 0.7 * _build_rate[0] + 0.3 * spent / size
        solved += 1
        proven = res.optimal and bool(res.stages)
        any_proven = any_proven or (proven and whole_part)
        proven_all = proven_all and proven and whole_part
        isim, ikept = _apply(sub, hint, pset)
        nsim, nkept = _apply(sub, res.placements, pset)
        if _score(sub, nsim, nkept, pset, ptiers, seniority) > _score(sub, isim, ikept, pset, ptiers, seniority):
            improved = True
            for p in ppods:
                plan[p.key] = nkept.get(p.key)
    proven_all = proven_all and solved == len(parts)

    # Verify in plan order on a copy; drop whatever the core refuses.
    _, out = _apply(base, plan, by_key)
    status = "optimal" if proven_all else "feasible" if improved or any_proven else "greedy"
    return QueuePlan(MappingProxyType(out), status, time.monotonic() - t0, len(queue), len(out), solved)
