"""MIG re-partition plans: valid layouts, core-checked placements, running pods keep their instance."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import A100, CATALOG, a100, random_cluster, random_pending, t4

from packing.catalog import Placement, validate_layout
from packing.model import Assignment, GpuGrant, Isolation, Mode, Node, PodDemand
from packing.solvers.repartition import plan_repartition
from packing.state import ClusterState

FAST = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_plan(state: ClusterState, pending: list[PodDemand], time_limit: float = 8) -> None:
    before = {h.pod.key: h for h in state.holders()}
    res = plan_repartition(state, pending, CATALOG, time_limit=time_limit)
    assert res.state is not None
    changed = {(e.node, e.gpu) for e in res.plan}
    for e in res.plan:
        assert A100 is not None
        assert validate_layout(A100, e.layout) == []
        gpu = next(g for g in state.node(e.node).gpus if g.index == e.gpu)
        assert gpu.mode is Mode.MIG
        assert sorted((i.profile, i.start) for i in gpu.mig) != sorted((p.profile, p.start) for p in e.layout)
    # Non-MIG GPUs and unchanged GPUs keep their layout.
    for name in state.node_names:
        for old, new in zip(state.node(name).gpus, res.state.node(name).gpus, strict=True):
            if (name, old.index) not in changed:
                assert old == new
    # Pods not drained keep exactly their instance; drained ones are placed again; all passes the core.
    for key, h in before.items():
        if key in res.drained:
            assert res.placements[key] is not None
            assert any(key in e.drain for e in res.plan)
        else:
            after = res.state.holder(key)
            assert after is not None and after.assignment == h.assignment
    replay = ClusterState([res.state.node(n) for n in res.state.node_names], relax_tenancy=state.relax_tenancy)
    for key, h in before.items():
        if key not in res.drained:
            replay.allocate(h.pod, h.assignment)
    pods = {p.key: p for p in pending} | {k: before[k].pod for k in res.drained}
    for key, asg in res.placements.items():
        if asg is not None:
            replay.allocate(pods[key], asg)
    assert res.placed == sum(1 for p in pending if res.placements[p.key] is not None)
    for node, text in res.mig_parted.items():
        doc = yaml.safe_load(text)
        assert doc["version"] == "v1"
        assert node in {e.node for e in res.plan}


@FAST
@given(seed=st.integers(0, 10**6))
def test_random_plans_are_valid(seed: int) -> None:
    state = random_cluster(seed, n_nodes=2, max_gpus=2, n_existing=4)
    check_plan(state, random_pending(seed, 4))


def test_plan_prefers_no_drain_and_fewest_gpus() -> None:
    """A 30 GB pod and a layout of 1g.10gb instances, one in use: re-partition around the running pod."""
    layout = [Placement("1g.10gb", i) for i in range(7)]
    state = ClusterState([Node("n", (a100(0, Mode.MIG, layout=layout), a100(1, Mode.MIG, layout=layout)))])
    running = PodDemand("run/a", 9000)
    state.allocate(running, Assignment("n", (GpuGrant(0, 9000, mig="1g.10gb@0"),)))
    pending = [PodDemand("q/big", 30000, isolation=Isolation.HARDWARE)]
    res = plan_repartition(state, pending, CATALOG, time_limit=10)
    assert res.optimal and res.placed == 1 and res.drained == [] and res.reconfigured == 1
    assert res.state is not None and res.state.holder("run/a").assignment.gpus[0].mig == "1g.10gb@0"  # type: ignore[union-attr]
    check_plan(state, pending)


def test_plan_drains_only_when_it_must_and_re_places_the_drained_pod() -> None:
    """One MIG GPU with a running 1g pod and a 70 GB pending pod: only a 7g.80gb layout fits it, so the
    running pod is drained and moved to the spare time-sliced T4."""
    layout = [Placement("1g.10gb", i) for i in range(7)]
    state = ClusterState([Node("n", (a100(0, Mode.MIG, layout=layout), t4(1, Mode.TIMESLICE, replicas=2)))])
    state.allocate(PodDemand("run/a", 3000), Assignment("n", (GpuGrant(0, 3000, mig="1g.10gb@3"),)))
    res = plan_repartition(state, [PodDemand("q/huge", 70000)], CATALOG, time_limit=10)
    assert res.optimal and res.placed == 1 and res.drained == ["run/a"]
    assert [e.to_json() for e in res.plan] == [
        {"node": "n", "gpu": 0, "layout": [{"profile": "7g.80gb", "start": 0}], "drain": ["run/a"]}]
    assert res.placements["run/a"] is not None and res.placements["run/a"].gpus[0].index == 1
    doc = yaml.safe_load(res.mig_parted["n"])
    assert doc["mig-configs"]["vramfit-n"] == [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]
    check_plan(state, [PodDemand("q/huge", 70000)])


def test_no_plan_when_nothing_helps() -> None:
    state = ClusterState([Node("n", (t4(0, Mode.EXCLUSIVE),))])
    res = plan_repartition(state, [PodDemand("q/x", 90000)], CATALOG, time_limit=5)
    assert res.plan == [] and res.placed == 0 and res.mig_parted == {}


def test_holders_without_vram_ask_and_pooled_gpus() -> None:
    """Pods placed without vramfit may hold a MIG instance with 0 MiB recorded; pools take threshold cuts."""
    layout = [Placement("1g.10gb", i) for i in range(7)]
    state = ClusterState([Node("n", (a100(0, Mode.MIG, layout=layout), a100(1, Mode.TIMESLICE, replicas=4)))])
    state.allocate(PodDemand("run/z", 0), Assignment("n", (GpuGrant(0, 0, mig="1g.10gb@0"),)))
    check_plan(state, [PodDemand("q/a", 30000), PodDemand("q/b", 70000), PodDemand("q/c", 3000)])
