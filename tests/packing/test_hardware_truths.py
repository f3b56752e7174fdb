"""Hardware truths: the core never gives one pod units a single CUDA process cannot use together.

A pod's units are all whole GPUs, or all MPS shares of one daemon (the node agent runs one per GPU, so one
GPU), or all time-slice replicas; several MIG instances only when the pod says each process picks its own
(`vramfit.io/gpu-per-process`), and MIG never beside another kind. The checks below classify units from the
modes' own facts (`instanced`, `client_limited`, `shared`, `takes_whole`), independently of the rule's code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.k8s.demand import ANN_GPU_PER_PROCESS, pod_demand
from packing.k8s.pod_keys import POD_ANNOTATIONS
from packing.model import (
    Assignment,
    Gpu,
    GpuGrant,
    Holder,
    InputError,
    Isolation,
    MigInstance,
    Mode,
    Node,
    PodDemand,
)
from packing.modes import mode_rules
from packing.place import schedule_one
from packing.policies import get_policy
from packing.solvers.optimal import solve_optimal
from packing.state import ClusterState, PlacementError
from tests.core_strategies import nodes, pods

POLICIES = ["whole-gpu", "first-fit", "best-fit", "spread", "vramfit"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def kind(gpu: Gpu, grant: GpuGrant) -> str:
    """What the unit is to a CUDA process, from the mode's facts."""
    rules = mode_rules(gpu.mode)
    if grant.whole or rules.takes_whole:
        return "whole GPU"
    if rules.instanced:
        return "MIG instance"
    if rules.client_limited:
        return "MPS share"
    assert rules.shared
    return "time-slice replica"


def truth_broken(state: ClusterState, pod: PodDemand, assignment: Assignment) -> str | None:
    """Why these units could not serve one pod's processes; None when they can."""
    node = state.node(assignment.node)
    by_index = {g.index: g for g in node.gpus}
    kinds = [kind(by_index[g.index], g) for g in assignment.gpus]
    if len(set(kinds)) > 1:
        return f"mixes {sorted(set(kinds))}"
    if kinds.count("MIG instance") > 1 and not pod.gpu_per_process:
        return "several MIG instances without gpu-per-process"
    if kinds.count("MPS share") > 1:
        return "MPS shares of two daemons (one per GPU)"
    return None


def assert_truths(state: ClusterState) -> None:
    for h in state.holders():
        assert truth_broken(state, h.pod, h.assignment) is None, (h.pod, h.assignment)


@st.composite
def multi_pods(draw: st.DrawFn, index: int) -> PodDemand:
    pod = draw(pods(index))
    return replace(pod, gpu_count=draw(st.sampled_from([1, 2, 2, 3])), gpu_per_process=draw(st.booleans()))


@given(cluster=nodes(max_gpus=4), data=st.data())
@SETTINGS
def test_no_policy_ever_places_a_pod_on_units_of_two_kinds(cluster: list[Node], data: st.DataObject) -> None:
    state = ClusterState(cluster)
    for step in range(data.draw(st.integers(1, 20))):
        pod = data.draw(multi_pods(step))
        policy = get_policy(data.draw(st.sampled_from(POLICIES)))
        schedule_one(state, pod, policy, explain_failures=False)
        assert_truths(state)


@given(cluster=nodes(max_nodes=1, max_gpus=4), data=st.data())
@SETTINGS
def test_allocate_refuses_exactly_the_combinations_a_process_cannot_use(cluster: list[Node],
                                                                        data: st.DataObject) -> None:
    """Any pick of the units each GPU offers now: the rule (`units_problem`) names exactly the picks that break
    the truths, and allocate refuses every such pick."""
    state = ClusterState(cluster)
    node = cluster[0]
    for step in range(data.draw(st.integers(1, 8))):
        pod = data.draw(multi_pods(step))
        usage = state.usage(node.name)
        offers = [gu.rules.candidate(gu, pod)[0] for gu in usage.gpus]
        offers = [o for o in offers if o is not None]
        if len(offers) < pod.gpu_count:
            continue
        picked = data.draw(st.permutations(offers))[: pod.gpu_count]
        assignment = Assignment(node.name, tuple(sorted(picked, key=lambda g: g.index)))
        broken = truth_broken(state, pod, assignment)
        if broken is not None:
            # Refused (another rule may speak first), and the rule itself names the combination.
            assert state.units_problem(pod, assignment) is not None
            with pytest.raises(PlacementError):
                state.allocate(pod, assignment)
        else:
            assert state.units_problem(pod, assignment) is None
            try:
                state.allocate(pod, assignment)
            except PlacementError as err:
                assert "kind" not in str(err) and "in one pod" not in str(err), err
        assert_truths(state)


@given(cluster=nodes(max_nodes=2, max_gpus=3), data=st.data())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_optimal_solver_keeps_a_pods_units_of_one_kind(cluster: list[Node], data: st.DataObject) -> None:
    state = ClusterState(cluster)
    queue = [data.draw(multi_pods(i)) for i in range(data.draw(st.integers(1, 5)))]
    res = solve_optimal(state, queue, time_limit=5)
    by_key = {p.key: p for p in queue}
    for key, assignment in res.placements.items():
        if assignment is not None:
            assert truth_broken(state, by_key[key], assignment) is None, (key, assignment)


def a100(index: int, mode: Mode, **kw: object) -> Gpu:
    return Gpu(index=index, memory_mib=81920, mode=mode, product="NVIDIA-A100-SXM4-80GB", model="a100-80gb",
               **kw)  # type: ignore[arg-type]


MIG_A100 = (MigInstance("3g.40gb", 0, 4, 3, 40192), MigInstance("3g.40gb", 4, 4, 3, 40192))


def test_a_two_gpu_pod_on_two_mig_gpus_needs_the_annotation_and_the_filter_says_so() -> None:
    state = ClusterState([Node("n", (a100(0, Mode.MIG, mig=MIG_A100), a100(1, Mode.MIG, mig=MIG_A100)))])
    ddp = PodDemand("a/ddp", 18432, gpu_count=2, isolation=Isolation.HARDWARE)
    assert not fit.feasible(state, ddp).now[0] and fit.feasible(state, ddp).never[0]
    reason = fit.explain(state, "n", ddp).reason or ""
    assert "gpu-per-process" in reason and "MIG" in reason
    per_process = replace(ddp, gpu_per_process=True)
    assert fit.feasible(state, per_process).now[0]
    chosen = fit.choose_units(state, "n", per_process)
    assert chosen is not None and all(g.mig for g in chosen.gpus)
    with pytest.raises(PlacementError, match="gpu-per-process"):
        state.allocate(ddp, chosen)
    state.allocate(per_process, chosen)


def test_a_two_gpu_pod_takes_two_gpus_of_one_kind_beside_other_kinds() -> None:
    """MIG, MPS, exclusive and time-sliced GPUs on one node: the pod gets the two time-sliced ones."""
    gpus = (a100(0, Mode.MIG, mig=MIG_A100), a100(1, Mode.MPS), a100(2, Mode.TIMESLICE, replicas=4),
            a100(3, Mode.EXCLUSIVE), a100(4, Mode.TIMESLICE, replicas=4))
    state = ClusterState([Node("n", gpus)])
    pod = PodDemand("a/two", 8000, gpu_count=2)
    for policy in POLICIES[1:]:
        sim = state.copy()
        decision = schedule_one(sim, pod, get_policy(policy), explain_failures=False)
        assert decision.node == "n"
        holder = sim.holder(pod.key)
        assert isinstance(holder, Holder) and {g.index for g in holder.assignment.gpus} == {2, 4}, policy


def test_mps_shares_of_two_gpus_are_two_daemons() -> None:
    state = ClusterState([Node("n", (a100(0, Mode.MPS), a100(1, Mode.MPS)))])
    pod = PodDemand("a/two", 8000, gpu_count=2, isolation=Isolation.PROCESS, gpu_per_process=True)
    mask = fit.feasible(state, pod)
    assert not mask.now[0] and mask.never[0]
    assert "MPS" in (fit.explain(state, "n", pod).reason or "")
    with pytest.raises(PlacementError, match="MPS"):
        state.allocate(pod, Assignment("n", (GpuGrant(0, 8000), GpuGrant(1, 8000))))


def test_a_running_pod_is_recorded_whatever_it_holds() -> None:
    """Forced records are reality: a pod already running on mixed units is booked, not judged."""
    state = ClusterState([Node("n", (a100(0, Mode.MIG, mig=MIG_A100), a100(1, Mode.MPS)))])
    pod = PodDemand("a/old", 8000, gpu_count=2)
    state.allocate(pod, Assignment("n", (GpuGrant(0, 8000, mig="3g.40gb@0"), GpuGrant(1, 8000))), force=True)
    assert state.holder("a/old") is not None


def k8s_pod(annotations: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "a", "annotations": {"vramfit.io/gpus": "2", **annotations}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"vramfit.io/vram": "8Gi"}}}]}}


def test_the_annotation_is_read_into_the_demand() -> None:
    assert ANN_GPU_PER_PROCESS in POD_ANNOTATIONS
    assert pod_demand(k8s_pod({})).gpu_per_process is False  # type: ignore[union-attr]
    assert pod_demand(k8s_pod({ANN_GPU_PER_PROCESS: "true"})).gpu_per_process is True  # type: ignore[union-attr]
    assert pod_demand(k8s_pod({ANN_GPU_PER_PROCESS: "False"})).gpu_per_process is False  # type: ignore[union-attr]
    with pytest.raises(InputError, match="gpu-per-process"):
        pod_demand(k8s_pod({ANN_GPU_PER_PROCESS: "yes"}))
    with pytest.raises(InputError, match="did you mean"):
        pod_demand(k8s_pod({"vramfit.io/gpu-per-proces": "true"}))
