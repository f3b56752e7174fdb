"""Which nodes the queue planner (`packing.planning.queue_plan`) works on: the candidate nodes of a large cluster
(`candidates`, with a shortlist per pod group for the greedy pass) and the neighbourhood of a part too big to model
(`neighbourhood`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from packing import cycle, fit
from packing.model import Assignment, PodDemand
from packing.planning.working_copy import WorkingCopy, sub_state
from packing.policies import Policy, get_policy
from packing.policies.base import fork_policy
from packing.state import ClusterState

FULL_NODES = 256  # clusters up to this many nodes are planned on every node
MAX_NODES = 128  # most candidate nodes on a larger cluster (the greedy pass and every copy scale with it)
MIN_CANDIDATES = 64  # candidate nodes on a large cluster, at least
CANDIDATES_PER_GPU = 4  # candidate nodes per GPU the queue asks for
RANK_POOL = 128  # nodes of a group's feasible ones (fullest first) the policy ranks: scoring costs per node
SHORTLIST = 16  # candidates (a group's best ranked) the greedy pass scores a pod on while one of them fits

RankKey = tuple[object, ...]


def rank_key(p: PodDemand) -> RankKey:
    """Pods ranked together: the CPU a pod asks changes its fit and its score little (nodes hold far more CPU
    than GPUs need), so pods that differ only in CPU share one ranking of the whole cluster."""
    return (p.vram_mib, p.gpu_count, p.isolation, p.models, p.tenant)


@dataclass(frozen=True)
class Candidates:
    names: list[str]  # candidate node names, in cluster order
    cut: bool  # some node that a pod fits now is left out
    ranked: int  # groups ranked by the policy (the others took the fullest nodes they fit)
    groups: int  # rank groups (`rank_key`) in the queue
    shortlist: Mapping[RankKey, list[str]]  # per group: its best candidates, best first (empty: every node)


# A registry name (a fresh policy for each pass) or a live policy (forked for each pass: its learnt mix, so the
# plan scores as the online policy does, and the live one never learns from a plan's what-ifs).
PlanPolicy = str | Policy


def planning_policy(policy: PlanPolicy) -> Policy:
    return get_policy(policy) if isinstance(policy, str) else fork_policy(policy)


def candidates(state: ClusterState, pods: Sequence[PodDemand], policy: PlanPolicy, previous_nodes: Sequence[str],
               rank_until: float, clock: Callable[[], float]) -> Candidates:
    """The nodes to plan on (see the queue_plan docstring). Groups (`rank_key`, queue order) are ranked by the
    policy over a pool of `RANK_POOL` nodes they fit (`_pool`), the groups with most pods first, until `clock()`
    passes `rank_until`; later groups take such a pool unranked, which costs no scoring. `previous_nodes` (the last plan's) come first."""
    names = state.node_names
    if len(names) <= FULL_NODES:
        return Candidates(names, False, 0, 0, {})
    pol = planning_policy(policy)
    for p in pods:
        pol.observe(p)
    reps: dict[RankKey, PodDemand] = {}
    count: dict[RankKey, int] = defaultdict(int)
    for p in pods:
        reps.setdefault(rank_key(p), p)
        count[rank_key(p)] += 1
    # The groups with most pods are ranked first (stable: queue order among equals).
    reps = dict(sorted(reps.items(), key=lambda kv: -count[kv[0]]))
    target = min(MAX_NODES, max(MIN_CANDIDATES, CANDIDATES_PER_GPU * sum(p.gpu_count for p in pods)))
    seen_now = np.zeros(len(names), dtype=bool)
    ranked: list[list[int]] = []
    by_policy = 0
    free = state.node_free
    for rep in reps.values():
        mask = fit.feasible(state, rep, pol.whole_gpu).now
        seen_now |= mask
        idx = np.flatnonzero(mask)
        idx = idx[np.argsort(free[idx], kind="stable")]  # fullest first
        k = min(idx.size, target)
        if idx.size and clock() < rank_until:
            pool = np.zeros(len(names), dtype=bool)
            pool[_pool(idx, RANK_POOL)] = True
            top = cycle.rank(state, rep, pol, pool)[:k]
            by_policy += 1
        else:
            top = _pool(idx, k)
        ranked.append([int(i) for i in top])
    chosen: dict[int, None] = {}
    for n in previous_nodes:
        if state.has_node(n) and len(chosen) < MAX_NODES // 4:
            chosen[state.index_of(n)] = None
    pos = [0] * len(ranked)
    progress = True
    while progress and len(chosen) < target:
        progress = False
        for j, order in enumerate(ranked):
            if pos[j] < len(order) and len(chosen) < target:
                chosen[order[pos[j]]] = None
                pos[j] += 1
                progress = True
    short = {key: [names[i] for i in order if i in chosen][:SHORTLIST]
             for key, order in zip(reps, ranked, strict=True)}
    cut = int(seen_now.sum()) > sum(1 for i in chosen if seen_now[i])
    return Candidates([names[i] for i in sorted(chosen)], cut, by_policy, len(reps), short)


def _pool(fullest_first: np.ndarray, size: int) -> np.ndarray:
    """`size` of a group's feasible nodes, alternately the fullest (where packing usually goes) and one spread
    evenly over the rest by fullness (the policy often prefers a node that is not among the fullest: planning on
    the fullest alone strands VRAM). The pool the policy ranks, and the candidates of a group it has no time for."""
    if fullest_first.size <= size:
        return fullest_first
    half = size // 2
    rest = fullest_first[half:]
    spread = rest[np.linspace(0, rest.size - 1, size - half).astype(np.int64)]
    out = np.empty(size, dtype=np.int64)
    out[0:2 * half:2] = fullest_first[:half]
    out[1:2 * half:2] = spread[:half]
    out[2 * half:] = spread[half:]
    return out


def neighbourhood(base: ClusterState, inc_sim: ClusterState, names: Sequence[str], pods: Sequence[PodDemand],
                  incumbent: Mapping[str, Assignment], max_pairs: int, whole: bool, done: Set[str] = frozenset()
                  ) -> tuple[WorkingCopy, list[PodDemand], list[str]]:
    """A part too big to model in the budget: re-plan some of it, the rest of the incumbent stays.

    Nodes: first those where the incumbent placed queued pods and some pod it left out would fit without them
    ("blocked"; without pods left out: the nodes where the incumbent opened most GPUs, whose pods could move to
    GPUs in use), up to half the model; then nodes where those pods or the ones left out fit next to the
    incumbent ("destinations", fullest first: where GPUs in use have room). Pods: the incumbent's pods on the
    blocked nodes and the first pods it left out (queue order); incumbent pods on destination nodes stay where
    they are. Returns the neighbourhood (a copy of the incumbent's state on those nodes, the re-planned pods
    released), the pods to re-plan and the blocked nodes it took; blocked nodes in `done` (re-planned already in
    this plan) are passed over."""
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
        idx = np.flatnonzero(mask)
        idx = idx[np.argsort(st.node_free[idx], kind="stable")]
        all_names = st.node_names
        return [all_names[i] for i in idx if all_names[i] in in_part]

    if unplaced:
        blocked = [n for n in fits(base, unplaced) if n in on_node]
        blocked.sort(key=lambda n: -len(on_node[n]))
    else:
        opened = {n: sum(int(not a.grants and bool(b.grants))
                         for a, b in zip(base.usage(n).gpus, inc_sim.usage(n).gpus, strict=True)) for n in on_node}
        blocked = sorted(on_node, key=lambda n: (-opened[n], -len(on_node[n])))
    blocked = [n for n in blocked if n not in done]
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
    return sub, [p for p in pods if p.key in keys], [n for n in chosen if n in on_node and n in blocked]
