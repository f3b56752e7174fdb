"""Capacity for one pod shape: the closed form agrees with CP-SAT and with filling the cluster pod by pod."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import CATALOG, a100, options, random_cluster, random_pod, t4

from packing.capacity import capacity, pods_on_node, shape
from packing.catalog import Placement
from packing.model import InputError, Isolation, Mode, Node, PodDemand
from packing.optimal import solve_optimal
from packing.repartition import plan_repartition
from packing.state import ClusterState

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fill(state: ClusterState, probe: PodDemand) -> int:
    """Brute force for single-GPU shapes: keep allocating copies while any option is left."""
    sim = state.copy()
    n = 0
    while True:
        pod = replace(probe, key=f"fill/p{n}")
        asg = next(options(sim, pod), None)
        if asg is None:
            return n
        sim.allocate(pod, asg)
        n += 1


@FAST
@given(seed=st.integers(0, 10**6))
def test_capacity_matches_brute_force_fill_for_single_gpu_shapes(seed: int) -> None:
    state = random_cluster(seed, n_nodes=3, max_gpus=3, n_existing=4)
    probe = replace(random_pod(random.Random(seed), "x/probe"), gpu_count=1)
    cap = capacity(state, probe)
    assert cap.total == fill(state, probe) == sum(cap.nodes.values())
    for name, n in cap.nodes.items():
        only = ClusterState([state.node(name)])
        for h in state.holders_on(name):
            only.allocate(h.pod, h.assignment)
        assert fill(only, probe) == n


@FAST
@given(seed=st.integers(0, 10**6))
def test_capacity_matches_cp_sat_for_any_shape(seed: int) -> None:
    state = random_cluster(seed, n_nodes=2, max_gpus=3, n_existing=3)
    probe = random_pod(random.Random(seed), "x/probe", max_gpus=3)
    cap = capacity(state, probe)
    copies = [replace(probe, key=f"x/p{i}") for i in range(cap.total + 2)]
    res = solve_optimal(state, copies, time_limit=5)
    assert res.optimal and res.placed == cap.total


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6))
def test_capacity_after_repartition_matches_a_no_drain_plan(seed: int) -> None:
    state = random_cluster(seed, n_nodes=2, max_gpus=2, n_existing=3)
    probe = replace(random_pod(random.Random(seed), "x/probe"), gpu_count=1)
    now = capacity(state, probe)
    after = capacity(state, probe, repartition=True, catalog=CATALOG)
    assert after.total >= now.total
    copies = [replace(probe, key=f"x/p{i}") for i in range(after.total + 2)]
    plan = plan_repartition(state, copies, CATALOG, time_limit=8, order=("drained", "placed"))
    assert plan.optimal and not plan.drained
    assert plan.placed == after.total


def test_pods_on_node_round_robin() -> None:
    assert pods_on_node([2, 1, 1], 2) == 2
    assert pods_on_node([4, 0, 0], 2) == 0
    assert pods_on_node([3, 3, 3], 3) == 3
    assert pods_on_node([5, 1], 1) == 6


def test_14gb_capacity_per_mode_and_after_repartition() -> None:
    one_g = [Placement("1g.10gb", i) for i in range(7)]
    nodes = [Node("mig", (a100(0, Mode.MIG, layout=one_g),)), Node("mps", (a100(0, Mode.MPS, replicas=4),)),
             Node("ts", (t4(0, Mode.TIMESLICE, replicas=4),)), Node("x", (a100(0, Mode.EXCLUSIVE),))]
    state = ClusterState(nodes)
    probe = shape(14336)
    cap = capacity(state, probe)
    assert cap.to_json() == {"total": 6, "nodes": {"mig": 0, "mps": 4, "ts": 1, "x": 1}}
    after = capacity(state, probe, repartition=True, catalog=CATALOG)
    assert after.nodes["mig"] == 4  # 1g.20gb x4 (or 2g.20gb x3 + ...) holds four 14 GB pods
    hw = capacity(state, shape(14336, isolation=Isolation.HARDWARE))
    assert hw.nodes == {"mig": 0, "mps": 0, "ts": 0, "x": 1}


def test_shape_validation_names_the_field() -> None:
    with pytest.raises(InputError, match="vram"):
        shape(0)
    with pytest.raises(InputError, match="gpus"):
        shape(100, gpus=0)
    with pytest.raises(InputError, match="isolation"):
        shape(100, isolation="strong")
