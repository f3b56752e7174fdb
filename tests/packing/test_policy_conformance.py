"""The conformance suite every policy of the core registry passes (every name `policy_names()` lists that the
core registered itself, not one added from outside with `register`), built with its default parameters.

Each runs on random clusters of every mode (`tests.core_strategies`) after a random history it placed
itself, against a probe pod of any shape: the scores, the nodes they rank, the units it chooses, and how a
fork (what a planner plans with) and its parent stay apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import cycle, fit
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import Policy, get_policy, policy_names
from packing.policies.base import fork_policy
from packing.policies.registry import _REGISTRY
from packing.state import ClusterState, PlacementError
from tests.core_strategies import nodes, pods

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CORE_POLICIES = [name for name in policy_names() if not _REGISTRY[name].open_params]
by_name = pytest.mark.parametrize("name", CORE_POLICIES)


def placed_history(data: st.DataObject, policy: Policy, most: int = 12) -> ClusterState:
    """A random cluster with pods the policy placed itself (and saw) and some released again."""
    cluster = data.draw(nodes(max_nodes=4, max_gpus=4))
    state = ClusterState(cluster)
    for step in range(data.draw(st.integers(0, most))):
        decision = schedule_one(state, data.draw(pods(step)), policy, explain_failures=False)
        if decision.node is not None and data.draw(st.integers(0, 4)) == 0:
            state.release(decision.pod.key)
    return state


def scored(state: ClusterState, policy: Policy, pod: PodDemand) -> tuple[fit.FeasibleMask, np.ndarray]:
    """The filter's mask and the policy's scores, as a scheduling cycle computes them."""
    policy.observe(pod)
    mask = fit.feasible(state, pod, policy.whole_gpu)
    return mask, np.asarray(policy.score(state, pod, mask.now), dtype=np.float64)


def test_the_suite_runs_every_core_policy() -> None:
    """A policy the registry offers users and this suite skips would ship unchecked."""
    assert CORE_POLICIES and "vramfit" in CORE_POLICIES
    assert all(not _REGISTRY[name].open_params for name in CORE_POLICIES)


@by_name
@given(data=st.data())
@SETTINGS
def test_scores_are_one_finite_number_per_node(name: str, data: st.DataObject) -> None:
    """A score array of the wrong length misaligns nodes and scores; NaN or inf on a feasible node makes
    the ranking arbitrary (NaN compares false with everything)."""
    policy = get_policy(name)
    state = placed_history(data, policy)
    mask, scores = scored(state, policy, data.draw(pods(999)))
    assert scores.shape == (len(state),), scores.shape
    assert np.isfinite(scores[mask.now]).all(), scores[mask.now]


@pytest.mark.parametrize("name", CORE_POLICIES)
def test_scores_survive_gpus_that_offer_no_unit(name: str) -> None:
    """A MIG GPU whose layout is not applied yet offers no unit; a cluster of such GPUs (a fresh MIG node pool)
    must still be scored, not fail every pod's placement."""
    gpu = Gpu(0, 81920, Mode.MIG, product="NVIDIA-A100-SXM4-80GB", model="A100-80GB")
    state = ClusterState([Node("node-0", (gpu,), cpu_milli=16000), Node("node-1", (), cpu_milli=16000)])
    policy = get_policy(name)
    for pod in (PodDemand("ns/seen", 1024, isolation=Isolation.HARDWARE), PodDemand("ns/cpu", 0, gpu_count=0)):
        mask, scores = scored(state, policy, pod)
        assert scores.shape == (len(state),)
        assert np.isfinite(scores[mask.now]).all()


@by_name
@given(data=st.data())
@SETTINGS
def test_an_infeasible_node_is_never_ranked_nor_chosen(name: str, data: st.DataObject) -> None:
    """Feasibility is the filter's alone: a policy that scores an infeasible node highest (or NaN) must not
    get it, scoring leaves the filter's mask as it was, and asking twice gives the same scores. (Scores of
    feasible nodes may depend on which others passed: frag-dual ranks against the best candidate.)"""
    policy = get_policy(name)
    state = placed_history(data, policy)
    pod = data.draw(pods(999))
    mask, scores = scored(state, policy, pod)
    now = mask.now.copy()
    again = np.asarray(policy.score(state, pod, mask.now), dtype=np.float64)
    np.testing.assert_array_equal(mask.now, now, err_msg="score changed the filter's mask")
    np.testing.assert_array_equal(again[now], scores[now], err_msg="asked twice, scored differently")
    ranked = cycle.rank(state, pod, policy, mask.now)
    assert sorted(ranked.tolist()) == np.flatnonzero(mask.now).tolist()
    decision = schedule_one(state, pod, policy, commit=False, explain_failures=False)
    if decision.node is not None:
        assert mask.now[state.index_of(decision.node)], decision


@by_name
@given(data=st.data())
@SETTINGS
def test_choose_gives_units_allocate_accepts_on_every_feasible_node(name: str, data: st.DataObject) -> None:
    """On a node the filter passed, the policy's own units are ones `allocate` books: a choice it refuses
    falls back to plain best fit (the policy's judgement lost) or leaves the pod unplaced."""
    policy = get_policy(name)
    state = placed_history(data, policy)
    pod = data.draw(pods(999))
    mask, _ = scored(state, policy, pod)
    for i in np.flatnonzero(mask.now):
        node = state.node_at(int(i)).name
        assignment = policy.choose(state, int(i), pod)
        assert assignment is not None, f"{name} chose nothing on feasible node {node}"
        assert assignment.node == node and len(assignment.gpus) == pod.gpu_count, assignment
        try:
            state.check(pod, assignment)
        except PlacementError as err:
            pytest.fail(f"{name} chose units allocate refuses on {node}: {err}")


def probe_scores(policy: Policy, state: ClusterState, probes: list[PodDemand]) -> list[np.ndarray]:
    """What the policy would do with each probe, without learning from it."""
    out = []
    for pod in probes:
        mask = fit.feasible(state, pod, policy.whole_gpu)
        out.append(np.asarray(policy.score(state, pod, mask.now), dtype=np.float64)[mask.now])
    return out


def assert_same_scores(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=what)


@by_name
@given(data=st.data())
@SETTINGS
def test_a_fork_and_its_parent_learn_apart(name: str, data: st.DataObject) -> None:
    """A planner plans with a fork: pods it only imagined must not teach the live policy, and what the live
    policy learns later must not shift a plan under way. A fork starts with everything its parent learnt."""
    cluster = data.draw(nodes(max_nodes=3, max_gpus=3))
    seen = [data.draw(pods(i)) for i in range(data.draw(st.integers(0, 6)))]
    imagined = [data.draw(pods(100 + i)) for i in range(data.draw(st.integers(1, 8)))]
    later = [data.draw(pods(200 + i)) for i in range(8)]  # past the next refresh of a learnt mix
    probes = [data.draw(pods(300 + i)) for i in range(3)]

    def trained() -> tuple[Policy, ClusterState]:
        policy, state = get_policy(name), ClusterState(cluster)
        for pod in seen:
            schedule_one(state, pod, policy, explain_failures=False)
        return policy, state

    # Parent and twin are asked the same things in the same order throughout: a policy may solve or cache on
    # first use (vramfit's LP), so a score call on one alone would part them without any fork.
    parent, state = trained()
    twin, _ = trained()
    fork = fork_policy(parent)
    learnt = probe_scores(twin, state, probes)
    assert_same_scores(probe_scores(parent, state, probes), learnt, "a parent and its twin")
    assert_same_scores(probe_scores(fork, state, probes), learnt, "a fresh fork")
    plan = state.copy()
    for pod in imagined:
        schedule_one(plan, pod, fork, explain_failures=False)
    for policy in (parent, twin):
        for pod in later:
            policy.observe(pod)
    assert_same_scores(probe_scores(parent, state, probes), probe_scores(twin, state, probes),
                       "the parent after its fork planned")

    parent, state = trained()
    twin, _ = trained()
    fork = fork_policy(parent)
    live = state.copy()
    for pod in imagined:
        schedule_one(live, pod, parent, explain_failures=False)
    for policy in (fork, twin):
        for pod in later:
            policy.observe(pod)
    assert_same_scores(probe_scores(fork, state, probes), probe_scores(twin, state, probes),
                       "the fork after its parent went on")
