"""CP-SAT placement: never worse than any online policy, equal to brute force, always valid for the core."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import a100, brute_force, opened, random_cluster, random_pending, t4

from packing.catalog import Placement
from packing.model import Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy, policy_names
from packing.solvers.optimal import solve_optimal, verify
from packing.state import ClusterState

FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def online_placed(state: ClusterState, pending: list[PodDemand], policy: str) -> int:
    sim = state.copy()
    pol = get_policy(policy)
    return sum(1 for p in pending if schedule_one(sim, p, pol, explain_failures=False).node is not None)


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 8))
def test_optimal_never_places_fewer_than_any_policy(seed: int, n: int) -> None:
    state = random_cluster(seed, n_nodes=3, max_gpus=3, n_existing=3)
    pending = random_pending(seed, n, max_gpus=3)
    res = solve_optimal(state, pending, time_limit=5)
    whole = solve_optimal(state, pending, time_limit=5, whole_gpu=True)
    assert res.optimal and whole.optimal
    for name in policy_names():
        got = online_placed(state, pending, name)
        # The whole-GPU baseline follows other rules (an idle GPU of any mode goes whole to one pod).
        best = whole if get_policy(name).whole_gpu else res
        assert best.placed >= got, (name, got, best.placed)


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5))
def test_optimal_equals_brute_force_on_tiny_instances(seed: int, n: int) -> None:
    state = random_cluster(seed, n_nodes=2, max_gpus=2, n_existing=2)
    pending = random_pending(seed, n)
    res = solve_optimal(state, pending, time_limit=5)
    assert res.optimal
    assert res.gap == 0.0 and res.bound == res.placed
    assert (res.placed, -res.gpus_opened) == brute_force(state, pending)


@FAST
@given(seed=st.integers(0, 10**6), relax=st.booleans())
def test_placements_pass_the_core_and_leave_state_untouched(seed: int, relax: bool) -> None:
    state = random_cluster(seed, n_nodes=3, max_gpus=3, n_existing=4)
    state.relax_tenancy = relax
    before = {h.pod.key: h.assignment for h in state.holders()}
    pending = random_pending(seed, 7, max_gpus=3)
    res = solve_optimal(state, pending, time_limit=5)
    after = verify(state, pending, res.placements)  # raises if any placement breaks a rule
    assert {h.pod.key: h.assignment for h in state.holders()} == before
    assert res.placed == sum(1 for a in res.placements.values() if a is not None)
    assert res.gpus_opened == opened(state, after)
    assert res.stranded_vram_mib == after.stranded_mib()


def test_the_14gb_story_optimal_packs_mig_and_mps() -> None:
    """Eight 14 GB pods: 3g.40gb instances take one each, an MPS GPU with 4 replicas takes four."""
    layout = [Placement("3g.40gb", 0), Placement("3g.40gb", 4)]
    nodes = [Node("mig", (a100(0, Mode.MIG, layout=layout), a100(1, Mode.MIG, layout=layout))),
             Node("mps", (a100(0, Mode.MPS, replicas=4),))]
    state = ClusterState(nodes)
    pods = [PodDemand(f"t/p{i}", 14336, tenant="t") for i in range(9)]
    res = solve_optimal(state, pods, time_limit=5)
    assert res.optimal and res.placed == 8 and res.unplaced == 1
    assert res.gpus_opened == 3


def test_fewest_gpus_then_least_stranded() -> None:
    """Two 9 GB pods of one tenant: both on one time-sliced GPU rather than two whole GPUs."""
    nodes = [Node("n", (a100(0, Mode.EXCLUSIVE), a100(1, Mode.EXCLUSIVE), t4(2, Mode.TIMESLICE, replicas=4),
                        t4(3, Mode.TIMESLICE, replicas=4)))]
    state = ClusterState(nodes)
    pods = [PodDemand(f"a/p{i}", 6000, tenant="a") for i in range(2)]
    res = solve_optimal(state, pods, time_limit=5)
    assert res.optimal and res.placed == 2 and res.gpus_opened == 1
    used = {g.index for a in res.placements.values() if a for g in a.gpus}
    assert len(used) == 1 and used <= {2, 3}  # a T4 strands less than an 80 GB GPU


def test_tenants_do_not_share_a_time_sliced_gpu_unless_relaxed() -> None:
    nodes = [Node("n", (t4(0, Mode.TIMESLICE, replicas=4),))]
    pods = [PodDemand("a/x", 3000, tenant="a"), PodDemand("b/y", 3000, tenant="b")]
    strict = solve_optimal(ClusterState(nodes), pods, time_limit=5)
    relaxed = solve_optimal(ClusterState(nodes, relax_tenancy=True), pods, time_limit=5)
    assert strict.placed == 1 and relaxed.placed == 2


def test_hardware_isolation_skips_shared_gpus_and_multi_gpu_uses_distinct_gpus() -> None:
    nodes = [Node("n", (a100(0, Mode.MPS, replicas=2), a100(1, Mode.EXCLUSIVE), a100(2, Mode.EXCLUSIVE),
                        a100(3, Mode.EXCLUSIVE)))]
    state = ClusterState(nodes)
    hw = PodDemand("a/hw", 30000, isolation=Isolation.HARDWARE)
    two = PodDemand("a/two", 30000, gpu_count=2, isolation=Isolation.PROCESS)
    res = solve_optimal(state, [hw, two], time_limit=5)
    assert res.optimal and res.placed == 2
    assert res.placements["a/hw"] is not None and {g.index for g in res.placements["a/hw"].gpus} <= {1, 2, 3}
    grants = res.placements["a/two"].gpus  # type: ignore[union-attr]
    # Two distinct GPUs of one kind: an MPS share beside a whole GPU is no pair a process can use.
    assert len({g.index for g in grants}) == 2 and 0 not in {g.index for g in grants}


def test_a_two_gpu_pod_never_mixes_an_mps_share_with_a_whole_gpu() -> None:
    nodes = [Node("n", (a100(0, Mode.MPS, replicas=2), a100(1, Mode.EXCLUSIVE)))]
    two = PodDemand("a/two", 30000, gpu_count=2, isolation=Isolation.PROCESS)
    res = solve_optimal(ClusterState(nodes), [two], time_limit=5)
    assert res.optimal and res.placed == 0


def test_duplicate_keys_rejected() -> None:
    pod = PodDemand("a/x", 1000)
    with pytest.raises(ValueError):
        solve_optimal(ClusterState([]), [pod, replace(pod)], time_limit=1)


def test_empty_inputs() -> None:
    res = solve_optimal(ClusterState([]), [PodDemand("a/x", 1000)], time_limit=1)
    assert res.placed == 0 and res.placements == {"a/x": None}
    res = solve_optimal(ClusterState([Node("n", (t4(0, Mode.EXCLUSIVE),))]), [], time_limit=1)
    assert res.placed == 0 and res.optimal


@pytest.fixture
def small_lns_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    import packing.solvers.optimal as optimal

    monkeypatch.setattr(optimal, "LNS_GROUP", 2)


@pytest.mark.usefixtures("small_lns_groups")
@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6))
def test_large_instance_path_is_valid_and_bounded(seed: int) -> None:
    """The LNS / unit-counting path for big node groups: valid placements, a true bound."""
    state = random_cluster(seed, n_nodes=6, max_gpus=3, n_existing=5)
    pending = random_pending(seed, 10, max_gpus=2)
    exact = solve_optimal(state, pending, time_limit=4, large_threshold=None)
    big = solve_optimal(state, pending, time_limit=3, large_threshold=0, seed=seed)
    verify(state, pending, big.placements)
    assert big.placed <= exact.placed <= big.bound
    if exact.optimal:
        assert exact.placed <= big.bound


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(1, 10))
def test_offline_bounds_are_upper_bounds(seed: int, n: int) -> None:
    from packing.solvers.bound import placement_upper_bound, threshold_bound

    state = random_cluster(seed, n_nodes=3, max_gpus=3, n_existing=4)
    pending = random_pending(seed, n, max_gpus=3)
    exact = solve_optimal(state, pending, time_limit=5, large_threshold=None)
    assert exact.optimal
    assert threshold_bound(state, pending) >= exact.placed
    ub = placement_upper_bound(state, pending, time_limit=2)
    assert ub.bound >= exact.placed
    if ub.exact:
        assert ub.bound == exact.placed
