"""Capacity for one pod shape: the closed form agrees with CP-SAT and with filling the cluster pod by pod."""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import CATALOG, a100, options, random_cluster, random_pod, t4

from packing.catalog import Placement
from packing.fit import feasible
from packing.model import InputError, Isolation, Mode, Node, PodDemand
from packing.solvers.capacity import capacity, choose_on_node, pods_on_node, shape
from packing.solvers.optimal import solve_optimal
from packing.solvers.repartition import plan_repartition
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


def _args(**kw: object) -> argparse.Namespace:
    import argparse as _argparse

    from vramfit.whatif_solvers import add_solver_arguments

    p = _argparse.ArgumentParser()
    add_solver_arguments(p)
    ns = p.parse_args([])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize(("flags", "named"), [
    ({"capacity": "lots"}, "--capacity"), ({"capacity": "0"}, "--capacity"),
    ({"capacity": "14Gi", "gpus": "two"}, "--gpus"), ({"capacity": "14Gi", "gpus": "0"}, "--gpus"),
    ({"capacity": "14Gi", "isolation": "strong"}, "--isolation"), ({"optimal": True, "time_limit": "-1"}, "--time-limit"),
    ({"tenant": "a"}, "--tenant"),
])
def test_whatif_solver_flags_are_validated_by_name(flags: dict[str, object], named: str) -> None:
    from vramfit.whatif_solvers import run_solvers

    state = ClusterState([Node("n", (t4(0, Mode.EXCLUSIVE),))])
    with pytest.raises(InputError) as err:
        run_solvers(_args(**flags), state, [PodDemand("a/x", 1000)], {"summary": {"placed": 1}}, CATALOG)
    assert err.value.field_name == named


def test_whatif_solver_keys() -> None:
    from vramfit.whatif_solvers import run_solvers

    layout = [Placement("1g.10gb", i) for i in range(7)]
    state = ClusterState([Node("mig", (a100(0, Mode.MIG, layout=layout),)), Node("t", (t4(0, Mode.TIMESLICE, 4),))])
    pending = [PodDemand("a/big", 30000), PodDemand("a/small", 3000)]
    out = run_solvers(_args(optimal=True, capacity="14336", repartition=True, time_limit="5"), state, pending,
                      {"summary": {"placed": 1, "policy": "vramfit"}}, CATALOG)
    s = out["summary"]
    # The 30 GB pod fits nowhere as the cluster is; only the plan makes room for it.
    assert s["optimal"] is True and s["bound"] == 1 and s["gap"] == 0
    assert s["online_vs_optimal"]["optimal_placed"] == 1 and s["online_vs_optimal"]["extra_pods_placed"] == 0
    assert [p["pod"] for p in out["placements_optimal"]] == ["a/big", "a/small"]
    assert out["capacity"]["total"] == 1 and out["capacity"]["nodes"] == {"mig": 0, "t": 1}
    assert out["capacity"]["after_repartition"]["nodes"]["mig"] >= 4
    assert len(out["plan"]) == 1 and out["plan"][0]["node"] == "mig" and out["plan"][0]["drain"] == []
    assert set(out["mig_parted"]) == {"mig"}
    assert all(p["node"] is not None for p in out["placements_after_plan"])


def test_a_multi_gpu_pod_is_counted_on_one_kind_of_unit_only() -> None:
    # A whole A100 beside a time-sliced T4: one GPU of each kind, so no 2-GPU pod (a process cannot use a
    # whole GPU and a time-slice replica together); two of each: each pair holds its own.
    mixed = ClusterState([Node("mixed", (a100(0, Mode.EXCLUSIVE), t4(1, Mode.TIMESLICE, replicas=4)))])
    probe = shape(3072, gpus=2)  # 4 replicas of a T4 hold 3 GiB each
    assert capacity(mixed, probe).nodes == {"mixed": 0}
    assert choose_on_node(mixed, "mixed", probe) is None
    pairs = ClusterState([Node("pairs", (a100(0, Mode.EXCLUSIVE), a100(1, Mode.EXCLUSIVE),
                                         t4(2, Mode.TIMESLICE, replicas=4), t4(3, Mode.TIMESLICE, replicas=4)))])
    assert capacity(pairs, probe).nodes == {"pairs": 1 + 4}
    placed = 0
    while (asg := choose_on_node(pairs, "pairs", replace(probe, key=f"x/p{placed}"))) is not None:
        assert len({pairs.node("pairs").gpus[g.index].mode for g in asg.gpus}) == 1
        pairs.allocate(replace(probe, key=f"x/p{placed}"), asg)  # re-checks every rule, the kinds included
        placed += 1
    assert placed == 5


@FAST
@given(seed=st.integers(0, 10**6), per_process=st.booleans())
def test_capacity_has_room_exactly_where_the_filter_passes_and_its_choice_is_accepted(seed: int,
                                                                                      per_process: bool) -> None:
    state = random_cluster(seed, n_nodes=3, max_gpus=4, n_existing=3)
    probe = replace(random_pod(random.Random(seed), "x/probe", max_gpus=3), gpu_per_process=per_process)
    cap = capacity(state, probe)
    mask = feasible(state, probe)
    for i, name in enumerate(state.node_names):
        assert (cap.nodes[name] > 0) == bool(mask.now[i]), name
        asg = choose_on_node(state, name, probe)
        assert (asg is not None) == (cap.nodes[name] > 0), name
        if asg is not None:
            state.copy().allocate(probe, asg)
