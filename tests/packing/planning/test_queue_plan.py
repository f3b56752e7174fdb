"""The queue planner (issue 13): as many pods as the proven optimum, priority tiers then age, never worse than the
online policy, never a rule broken (replayed through allocate), the state untouched, warm starts."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import options, planned_node, random_cluster, random_pending

from benchmarks import bench_queue
from packing.model import Assignment, Gpu, Isolation, Mode, Node, PodDemand
from packing.planning.queue_plan import QueuedPod, QueuePlan, plan_queue
from packing.solvers.optimal import greedy_assignments, solve_optimal
from packing.state import ClusterState

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUDGET = 5.0  # generous: the tests check results, never speed


def h100(index: int) -> Gpu:
    return Gpu(index, 81559, Mode.EXCLUSIVE, "NVIDIA-H100-80GB-HBM3", "H100-80GB")


def queued(pods: Sequence[PodDemand]) -> list[QueuedPod]:
    return [QueuedPod(p, float(i)) for i, p in enumerate(pods)]


def multi_tenant() -> tuple[ClusterState, list[PodDemand]]:
    """The benchmark's 10-pod multi-tenant queue (`benchmarks.bench_queue.multi_tenant`: an any-GPU pod takes the
    only T4 before a T4-only pod; two 1-GPU pods take the only 2-GPU node's GPUs before a 2-GPU pod)."""
    nodes, pods = bench_queue.multi_tenant()
    return ClusterState(nodes), pods


def replay(state: ClusterState, plan: QueuePlan, pods: Sequence[PodDemand]) -> ClusterState:
    """Every planned assignment through the core, in plan order (raises on any breach)."""
    by_key = {p.key: p for p in pods}
    sim = state.copy()
    for key, asg in plan.assignments.items():
        sim.allocate(by_key[key], asg)
    return sim


def tiers(placed: Sequence[str], pods: Sequence[PodDemand]) -> tuple[int, ...]:
    by_key = {p.key: p for p in pods}
    levels = sorted({p.priority for p in pods}, reverse=True)
    return tuple(sum(1 for k in placed if by_key[k].priority == t) for t in levels)


def online_order(pods_q: Sequence[QueuedPod]) -> list[PodDemand]:
    return [q.pod for _, q in sorted(enumerate(pods_q), key=lambda t: (-t[1].pod.priority, t[1].created, t[0]))]


def fingerprint(state: ClusterState) -> tuple[object, ...]:
    return (sorted((h.pod.key, h.assignment) for h in state.holders()), state.vram.copy().tobytes(),
            state.pool_free.copy().tobytes(), state.version.copy().tobytes(), state.stranded_mib())


# ------------------------------------------------------------------------------------------- the queue
def test_multi_tenant_queue_places_the_proven_optimum() -> None:
    state, pods = multi_tenant()
    online = greedy_assignments(state, pods)
    online_placed = sum(a is not None for a in online.values())
    assert online["ads/t4-only"] is None and online["vision/two-gpu"] is None  # the two traps
    best = solve_optimal(state, pods, time_limit=BUDGET)
    assert best.optimal
    plan = plan_queue(state, queued(pods), time_limit_s=BUDGET)
    assert plan.placed == best.placed == 9 > online_placed
    assert plan.status == "optimal" and plan.queue_size == 10 and plan.parts >= 1
    assert planned_node(plan, "ads/t4-only") == "t4-0" and planned_node(plan, "vision/two-gpu") == "h100-0"
    assert planned_node(plan, "nobody/else") is None
    replay(state, plan, pods)


def test_state_is_not_mutated() -> None:
    state, pods = multi_tenant()
    state.allocate(PodDemand("run/x", 9000, tenant="speech", isolation=Isolation.PROCESS),
                   next(a for a in options(state, PodDemand("run/x", 9000, tenant="speech",
                                                            isolation=Isolation.PROCESS)) if a.node == "mps-0"))
    before = fingerprint(state)
    plan = plan_queue(state, queued(pods), time_limit_s=BUDGET)
    assert fingerprint(state) == before
    replay(state, plan, pods)


def test_empty_and_held_pods() -> None:
    state, pods = multi_tenant()
    plan = plan_queue(state, [], time_limit_s=BUDGET)
    assert plan.status == "empty" and plan.placed == 0 and dict(plan.assignments) == {}
    asg = next(iter(options(state, pods[0])))
    state.allocate(pods[0], asg)
    plan = plan_queue(state, queued(pods[:1]) + queued(pods[:1]), time_limit_s=BUDGET)  # held, and repeated
    assert plan.placed == 0 and plan.status == "empty"


# ------------------------------------------------------------------------------------------- priorities and age
def one_gpu_state() -> ClusterState:
    return ClusterState([Node("n0", (h100(0),))])


def test_higher_priority_wins_even_when_queued_later_and_newer() -> None:
    low = PodDemand("a/low", 20000, priority=0)
    high = PodDemand("b/high", 30000, priority=10)
    plan = plan_queue(one_gpu_state(), [QueuedPod(low, 1.0), QueuedPod(high, 2.0)], time_limit_s=BUDGET)
    assert list(plan.assignments) == ["b/high"]


def test_older_wins_at_equal_priority() -> None:
    newer = PodDemand("a/newer", 20000)
    older = PodDemand("b/older", 30000)  # a different shape: the age stage decides, not the order in a class
    plan = plan_queue(one_gpu_state(), [QueuedPod(newer, 50.0), QueuedPod(older, 10.0)], time_limit_s=BUDGET)
    assert list(plan.assignments) == ["b/older"]
    same = [QueuedPod(PodDemand("c/p1", 20000), 9.0), QueuedPod(PodDemand("c/p0", 20000), 3.0)]
    plan = plan_queue(one_gpu_state(), same, time_limit_s=BUDGET)
    assert list(plan.assignments) == ["c/p0"]


def test_a_priority_tier_comes_before_the_count() -> None:
    """Two low-priority 1-GPU pods or one high-priority 2-GPU pod on a 2-GPU node: the tier wins."""
    state = ClusterState([Node("n0", (h100(0), h100(1)))])
    q = [QueuedPod(PodDemand("a/l1", 9000), 1.0), QueuedPod(PodDemand("a/l2", 9000), 2.0),
         QueuedPod(PodDemand("b/big", 40000, gpu_count=2, priority=5), 3.0)]
    plan = plan_queue(state, q, time_limit_s=BUDGET)
    assert list(plan.assignments) == ["b/big"] and plan.status == "optimal"


# ------------------------------------------------------------------------------------------- warm start
def test_warm_start_from_previous_plan_is_as_good_or_better() -> None:
    state, pods = multi_tenant()
    first = plan_queue(state, queued(pods), time_limit_s=BUDGET)
    again = plan_queue(state, queued(pods), time_limit_s=BUDGET, previous=first, repack=True)
    assert again.placed >= first.placed
    replay(state, again, pods)
    # The cluster changed: the T4 the plan gave ads/t4-only is now held by a running pod; a newcomer queues.
    taken = first.assignments["ads/t4-only"]
    state.allocate(PodDemand("run/t4", 12288, isolation=Isolation.HARDWARE), taken)
    rest = [p for p in pods if p.key != "ads/t4-only"] + [PodDemand("late/x", 9000, tenant="speech",
                                                                     isolation=Isolation.PROCESS)]
    later = plan_queue(state, queued(rest), time_limit_s=BUDGET, previous=first)
    replay(state, later, rest)
    cold = plan_queue(state, queued(rest), time_limit_s=BUDGET)
    assert later.placed >= cold.placed  # same problem, warm or cold: the warm start never hurts
    assert later.placed >= sum(a is not None for a in greedy_assignments(state, rest).values())


def test_stale_previous_plan_is_ignored_where_it_no_longer_holds() -> None:
    state, pods = multi_tenant()
    bogus = QueuePlan({"search/any-10g": Assignment("gone-node", ()), "ads/t4-only": Assignment("t4-0", ())},
                      "feasible", 0.0, 2, 2, 1)
    plan = plan_queue(state, queued(pods), time_limit_s=BUDGET, previous=bogus)
    assert plan.placed == 9
    replay(state, plan, pods)


# ------------------------------------------------------------------------------------------- invariants
def brute_tiers(state: ClusterState, pods: Sequence[PodDemand]) -> tuple[int, ...]:
    """Best placed-per-tier vector (highest tier first) over every combination of options (tiny only)."""
    work = state.copy()
    best: tuple[int, ...] = ()
    placed: list[str] = []

    def rec(i: int) -> None:
        nonlocal best
        if i == len(pods):
            best = max(best, tiers(placed, pods))
            return
        for asg in list(options(work, pods[i])):
            work.allocate(pods[i], asg)
            placed.append(pods[i].key)
            rec(i + 1)
            placed.pop()
            work.release(pods[i].key)
        rec(i + 1)

    rec(0)
    return best


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5), repack=st.booleans())
def test_plan_is_valid_never_worse_than_online_and_optimal_when_proven(seed: int, n: int, repack: bool) -> None:
    state = random_cluster(seed, n_nodes=2, max_gpus=3, n_existing=2)
    rng = random.Random(seed)
    pods = [replace(p, priority=rng.choice([0, 0, 5])) for p in random_pending(seed, n, max_gpus=2)]
    q = [QueuedPod(p, float(rng.randint(0, 3))) for p in pods]
    before = fingerprint(state)
    plan = plan_queue(state, q, time_limit_s=BUDGET, repack=repack)
    assert fingerprint(state) == before
    replay(state, plan, pods)  # no unit over-committed, tenancy and isolation held
    # What the plan places: its planned units, and (without repack) the pods it leaves to the online policy.
    placed = [*plan.assignments, *plan.online]
    assert set(placed) <= {p.key for p in pods} and plan.placed == len(placed) == len(set(placed))
    assert not (repack and plan.online)
    order = online_order(q)
    greedy = [k for k, a in greedy_assignments(state, order).items() if a is not None]
    assert tiers(placed, pods) >= tiers(greedy, pods)
    if len({p.priority for p in pods}) == 1:
        assert plan.placed >= len(greedy)
    if plan.status == "optimal" and n <= 4:
        assert tiers(placed, pods) == brute_tiers(state, order)


def test_planned_units_never_double_booked_across_pods() -> None:
    state, pods = multi_tenant()
    plan = plan_queue(state, queued(pods * 1), time_limit_s=BUDGET)
    units = [(a.node, g.index, g.mig) for a in plan.assignments.values() for g in a.gpus
             if state.node(a.node).gpus[g.index].mode is Mode.EXCLUSIVE]
    assert len(units) == len(set(units))
    assert np.all(replay(state, plan, pods).pool_free >= 0)


@FAST
@given(seed=st.integers(0, 10**6))
def test_working_copy_has_the_same_books_and_views(seed: int) -> None:
    """The planner's restricted copy (`working_copy.sub_state`) equals the state on its nodes and is independent of it."""
    from packing.planning.working_copy import sub_state

    state = random_cluster(seed, n_nodes=3, max_gpus=3, n_existing=4)
    names = [n for i, n in enumerate(state.node_names) if i != 1]
    sub = sub_state(state, names)
    rows = [state.index_of(n) for n in names]
    for view in ("present", "vram", "unit_max", "pool_free", "slots_free", "tenant", "idle", "mig_free", "cpu_free"):
        assert np.array_equal(getattr(sub, view), getattr(state, view)[rows]), view
    assert sorted(h.pod.key for h in sub.holders()) == sorted(h.pod.key for n in names for h in state.holders_on(n))
    before = fingerprint(state)
    copy_ = sub.copy()
    for pod in random_pending(seed, 3):
        for asg in options(copy_, pod):
            copy_.allocate(pod, asg)
            break
    assert fingerprint(state) == before
    assert sorted(h.pod.key for h in sub.holders()) == sorted(h.pod.key for n in names for h in state.holders_on(n))


# ------------------------------------------------------------------------------------------- budget and parts
def timeslice_state(running: bool) -> ClusterState:
    gpu = Gpu(0, 81920, Mode.TIMESLICE, "NVIDIA-A100-SXM4-80GB", "A100-80GB", replicas=4)
    state = ClusterState([Node("ts-0", (gpu,))])
    if running:
        pod = PodDemand("run/r", 9000)
        state.allocate(pod, next(iter(options(state, pod))))
    return state


def test_a_part_the_incumbent_already_places_on_gpus_in_use_is_not_solved() -> None:
    """Every pod placed and no GPU opened: only stranded VRAM could improve, not worth a model."""
    q = queued([PodDemand("a/p0", 9000), PodDemand("a/p1", 9000)])
    plan = plan_queue(timeslice_state(running=True), q, time_limit_s=BUDGET)
    assert plan.placed == 2 and plan.parts == 0 and plan.status == "greedy"
    plan = plan_queue(timeslice_state(running=False), q, time_limit_s=BUDGET, repack=True)  # it opens a GPU
    assert plan.placed == 2 and plan.parts == 1 and plan.status == "optimal"


def test_without_repack_a_part_the_incumbent_places_whole_keeps_its_placement() -> None:
    """repack=False: the online placement stands where it places every pod, even where it opened a GPU; parts
    that leave pods out are still solved."""
    q = queued([PodDemand("a/p0", 9000), PodDemand("a/p1", 9000)])
    state = timeslice_state(running=False)
    kept = plan_queue(state, q, time_limit_s=BUDGET, repack=False)
    assert kept.placed == 2 and kept.parts == 0 and kept.status == "greedy"
    cluster, pods = multi_tenant()  # online leaves pods out here: the count is still won
    online = sum(1 for a in greedy_assignments(cluster, pods, policy="vramfit").values() if a is not None)
    plan = plan_queue(cluster, queued(pods), time_limit_s=BUDGET, repack=False)
    assert plan.placed == 9 > online and plan.parts >= 1


class FakeClock:
    """Time that moves only when the test moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_budget_counts_ranking_and_the_greedy_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a large cluster the candidate ranking and the greedy pass (both policy rankings) are taken from the
    budget: once they spend it no part is solved, the plan is the greedy floor and solve_s says what was spent."""
    from packing import cycle
    from packing.planning import queue_nodes

    state = ClusterState([Node(f"n{i:03d}", (h100(0),)) for i in range(queue_nodes.FULL_NODES + 44)])
    pods = [PodDemand(f"a/p{i}", 20000) for i in range(3)]
    greedy = [k for k, a in greedy_assignments(state, pods).items() if a is not None]
    real_rank = cycle.rank
    for cost, solved in ((0.0, True), (2.0, False)):
        clock = FakeClock()

        def rank(*args: object, clock: FakeClock = clock, cost: float = cost) -> np.ndarray:
            clock.t += cost
            return real_rank(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(cycle, "rank", rank)
        plan = plan_queue(state, queued(pods), time_limit_s=BUDGET, clock=clock, repack=True)
        assert plan.placed == len(greedy) == 3
        replay(state, plan, pods)
        if solved:
            assert plan.parts == 1 and plan.solve_s == 0.0
        else:  # one group ranked (2 s: past the ranking's share), three pods placed (6 s): 8 s > 5 s
            assert plan.parts == 0 and plan.status == "greedy" and plan.solve_s == 8.0


def test_candidates_rank_by_policy_only_within_their_share() -> None:
    from packing.planning import queue_nodes

    state = ClusterState([Node(f"n{i:03d}", (h100(0), h100(1))) for i in range(queue_nodes.FULL_NODES + 1)])
    pods = [PodDemand(f"a/p{i}", 9000 * (1 + i % 3), cpu_milli=1000 * (1 + i)) for i in range(6)]
    now = [0.0]
    cand = queue_nodes.candidates(state, pods, "vramfit", [], 1.0, lambda: now[0])
    assert cand.groups == 3 and cand.ranked == 3 and cand.cut  # CPU alone makes no group of its own
    assert len(cand.names) == queue_nodes.MIN_CANDIDATES and all(len(s) <= queue_nodes.SHORTLIST
                                                                  for s in cand.shortlist.values())
    now[0] = 2.0  # past the share: the fullest nodes, no scoring
    late = queue_nodes.candidates(state, pods, "vramfit", [], 1.0, lambda: now[0])
    assert late.ranked == 0 and len(late.names) == queue_nodes.MIN_CANDIDATES


def test_a_warm_start_that_places_every_pod_skips_the_greedy_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from packing.planning import queue_plan

    state = ClusterState([Node(f"n{i}", (h100(0), h100(1))) for i in range(3)])
    pods = [PodDemand(f"a/p{i}", 20000) for i in range(4)]
    # With repack every placed pod has planned units (without it this uncontended queue is left to the online
    # policy whole, and there is nothing to warm-start from).
    first = plan_queue(state, queued(pods), time_limit_s=BUDGET, repack=True)
    assert first.placed == 4
    passes: list[bool] = []
    real = queue_plan._online

    def online(*args: object, **kw: object) -> dict[str, Assignment]:
        passes.append(len(args) > 3 and bool(args[3]))  # fixed assignments given: the warm start's pass
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(queue_plan, "_online", online)
    again = plan_queue(state, queued(pods), time_limit_s=BUDGET, previous=first)
    assert passes == [True] and again.placed == 4
    replay(state, again, pods)
    passes.clear()
    plan_queue(state, queued([*pods, PodDemand("a/big", 20000, gpu_count=3)]), time_limit_s=BUDGET,
               previous=first, repack=True)  # the warm start leaves a pod out (it fits no node): the greedy pass runs too
    assert passes == [True, False]


def test_without_repack_a_part_no_solver_weighed_is_left_to_the_online_policy() -> None:
    """The greedy pass only stands in for the online policy (on a large cluster: on candidate nodes, scored on
    shortlists); where every pod of a part fits, its pods are left to the online policy itself. A part where the
    greedy pass leaves a pod out is solved, and its pods take the plan's units."""
    state = ClusterState([Node(f"n{i}", (h100(0), h100(1))) for i in range(3)])
    easy = [PodDemand(f"a/p{i}", 20000) for i in range(4)]
    plan = plan_queue(state, queued(easy), time_limit_s=BUDGET)
    assert plan.assignments == {} and plan.online == {p.key for p in easy} and plan.placed == 4
    assert plan.status == "greedy"
    repacked = plan_queue(state, queued(easy), time_limit_s=BUDGET, repack=True)
    assert set(repacked.assignments) == {p.key for p in easy} and repacked.online == frozenset()

    mt_state, pods = multi_tenant()
    contended = plan_queue(mt_state, queued(pods), time_limit_s=BUDGET)
    assert contended.parts >= 1 and contended.assignments
    assert contended.placed == len(contended.assignments) + len(contended.online)
    assert not set(contended.assignments) & contended.online


# ------------------------------------------------------------------------------------------- a roomy queue
@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), policy=st.sampled_from(["first-fit", "best-fit", "vramfit"]))
def test_a_roomy_queue_is_placed_whole_by_the_online_policy(seed: int, n: int, policy: str) -> None:
    """`room`'s promise: every pod of the queue, in order, finds a node, whichever policy chooses."""
    from packing.planning.queue_room import room
    from packing.policies.registry import get_policy

    state = random_cluster(seed, n_nodes=8, max_gpus=3, n_existing=3)
    pods = random_pending(seed, n, max_gpus=2)
    if room(state, pods, get_policy(policy).whole_gpu) is not None:
        assert all(a is not None for a in greedy_assignments(state, pods, policy=policy).values())


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 4))
def test_the_roomy_shortcut_says_what_the_full_pass_says(seed: int, n: int) -> None:
    """Where the shortcut answers, the greedy pass and the parts (the shortcut turned off) leave the same pods to
    the online policy and plan no units."""
    from packing.planning import queue_plan

    state = random_cluster(seed, n_nodes=8, max_gpus=3, n_existing=2)
    q = queued(random_pending(seed, n, max_gpus=2))
    plan = plan_queue(state, q, time_limit_s=BUDGET)
    if plan.status != "roomy":
        return
    assert plan.assignments == {} and plan.online == {x.pod.key for x in q} and plan.placed == n and plan.parts == 0
    real = queue_plan.room
    queue_plan.room = lambda *a: None  # type: ignore[assignment]
    try:
        full = plan_queue(state, q, time_limit_s=BUDGET)
    finally:
        queue_plan.room = real
    assert full.status == "greedy" and dict(full.assignments) == {} and full.online == plan.online


def test_a_queue_is_roomy_only_while_each_pod_fits_more_nodes_than_pods_ahead_of_it() -> None:
    state = ClusterState([Node(f"n{i}", (h100(0), h100(1))) for i in range(3)])
    three = [PodDemand(f"a/p{i}", 20000) for i in range(3)]
    plan = plan_queue(state, queued(three), time_limit_s=BUDGET)
    assert plan.status == "roomy" and plan.placed == 3 and plan.online == {p.key for p in three}
    # A 4th pod has 3 pods ahead of it and 3 nodes: it may find none of them left, so the full pass runs.
    four = [*three, PodDemand("a/p3", 20000)]
    assert plan_queue(state, queued(four), time_limit_s=BUDGET).status == "greedy"
    # A 2-GPU pod fits the 3 nodes now; ahead of it, 1-GPU pods could each break a node's pair.
    pair = [PodDemand("a/x", 20000), PodDemand("a/y", 20000), PodDemand("a/two", 20000, gpu_count=2)]
    assert plan_queue(state, queued(pair), time_limit_s=BUDGET).status == "roomy"
    # With repack the plan chooses units for every pod, so it is built; so is one whose previous units stand.
    assert plan_queue(state, queued(three), time_limit_s=BUDGET, repack=True).status != "roomy"
    first = plan_queue(state, queued(three), time_limit_s=BUDGET, repack=True)
    warm = plan_queue(state, queued(three), time_limit_s=BUDGET, previous=first)
    assert warm.status != "roomy" and dict(warm.assignments) == dict(first.assignments)


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 4), k=st.integers(0, 4))
def test_a_queue_still_roomy_by_its_old_counts_is_roomy(seed: int, n: int, k: int) -> None:
    """`still_roomy`'s promise: counts taken `moved` row changes ago, and a queue that has changed since (its
    first pod gone, newcomers behind), never say roomy where `room` on today's state would not."""
    from packing.planning.queue_room import extend_room, room, still_roomy

    state = random_cluster(seed, n_nodes=8, max_gpus=3, n_existing=2)
    pods = random_pending(seed, n, max_gpus=2)
    counts = room(state, pods, False)
    if counts is None:
        return
    versions = state.version.copy()
    for o in random_pending(seed + 1, k, max_gpus=2):  # pods outside the queue take units meanwhile
        o = replace(o, key=f"other/{o.key}")
        got = next(iter(options(state, o)), None)
        if got is not None:
            state.allocate(o, got)
    moved = int(np.count_nonzero(state.version != versions))
    assert moved <= k
    # Newcomers of the shapes counted (another shape is unknown to the counts: never roomy by them).
    later = pods[1:] + [replace(p, key=f"new/{p.key}") for p in pods[:2]]
    assert not still_roomy(counts, [*later, replace(pods[0], key="new/odd", vram_mib=pods[0].vram_mib + 1)], 0)
    if still_roomy(counts, later, moved):
        assert room(state, later, False) is not None
        assert all(a is not None for a in greedy_assignments(state, later, policy="first-fit").values())
    assert still_roomy(counts, pods, 0)  # nothing moved, the same queue
    # Newcomers of new shapes, counted now by extend_room: the same promise.
    fresh = [replace(p, key=f"fresh/{p.key}") for p in random_pending(seed + 3, 2, max_gpus=2)]
    wider = extend_room(state, counts, [*later, *fresh], moved, False)
    assert all(wider[k] == v for k, v in counts.items())
    if still_roomy(wider, [*later, *fresh], moved):
        assert room(state, [*later, *fresh], False) is not None


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5), k=st.integers(0, 3), extra=st.integers(0, 3))
def test_roomy_by_the_queue_length_is_roomy_in_every_order(seed: int, n: int, k: int, extra: int) -> None:
    """`roomy_in_any_order` (shapes and a length only) never says roomy where `still_roomy`, in some order of a
    queue of at most that length, would not; and it says roomy on a queue whose every shape has room for it."""
    import random

    from packing import fit
    from packing.planning.queue_room import roomy_in_any_order, still_roomy

    state = random_cluster(seed, n_nodes=10, max_gpus=3, n_existing=2)
    pods = random_pending(seed, n, max_gpus=2)
    counts = {p.shape: int(np.count_nonzero(fit.feasible(state, p, False).now)) for p in pods}
    shapes = {p.shape for p in pods}
    length = n + extra  # the book counts holders too: the length it gives may be larger than the queue read
    if roomy_in_any_order(counts, shapes, length, k):
        order = list(pods)
        random.Random(seed).shuffle(order)
        assert still_roomy(counts, order, k) and still_roomy(counts, pods, k)
    # One pod, nothing moved: roomy exactly when it fits somewhere.
    assert roomy_in_any_order(counts, {pods[0].shape}, 1, 0) == (counts[pods[0].shape] > 0)
    assert not roomy_in_any_order({}, shapes, length, 0)  # a shape never counted is unknown

