"""Property tests of the placement core: no over-commit, trust and isolation always hold, exact release,
and the vectorised filter, the per-node explanation and the chosen units always agree."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.model import MPS_MAX_CLIENTS, Gpu, GpuGrant, Holder, Mode
from packing.modes import ALLOWED_MODES, ModeRules, mode_rules
from packing.modes.mig_dynamic import MEDIA_SUFFIX
from packing.place import schedule_one
from packing.policies import get_policy
from packing.state import ClusterState
from tests.core_strategies import CATALOG, nodes, pods

POLICIES = ["whole-gpu", "first-fit", "best-fit", "spread", "vramfit"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_invariants(state: ClusterState) -> None:
    """Recompute every rule from the holders alone (independent of the state's own bookkeeping); the mode's
    facts (`packing.modes.mode_rules`) say which rules apply, never its `Mode` member."""
    for node in state.nodes():
        holders = state.holders_on(node.name)
        cpu = sum(h.pod.cpu_milli for h in holders)
        if node.cpu_milli is not None:
            assert cpu <= node.cpu_milli
        for gpu in node.gpus:
            on = [(h, g) for h in holders for g in h.assignment.gpus if g.index == gpu.index]
            whole = [h for h, g in on if g.whole]
            if whole:
                assert len(on) == 1, "a whole-GPU holder shares its GPU"
                assert whole[0].pod.vram_mib <= gpu.memory_mib
                continue
            for h, g in on:
                assert gpu.mode in ALLOWED_MODES[h.pod.isolation], "isolation broken"
                assert g.vram_mib >= h.pod.vram_mib
                if h.pod.models:
                    assert {(gpu.model or "").lower(), gpu.product.lower()} & h.pod.models
            rules = mode_rules(gpu.mode)
            if rules.instanced:
                assert_instances_hold(gpu, rules, [g for _, g in on])
            elif rules.shared:
                assert_shared_holds(gpu, on)
            else:
                assert rules.takes_whole
                assert len(on) <= 1 and sum(g.vram_mib for _, g in on) <= gpu.memory_mib


def assert_instances_hold(gpu: Gpu, rules: ModeRules, grants: list[GpuGrant]) -> None:
    """Each grant names its own listed instance and fits in it; the held instances could exist at once: no
    memory slice in two (dynamic MIG lists overlapping placements), their compute within the GPU's (the
    catalog geometry's); where the mode creates the instances (`layout_for`), at most one owns the media
    engines (a static layout is the hardware's own, whatever it holds)."""
    refs = [g.mig for g in grants]
    assert len(refs) == len(set(refs)), "a MIG instance is booked twice"
    held = []
    for g in grants:
        inst = gpu.instance(g.mig or "")
        assert inst is not None and g.vram_mib <= inst.memory_mib
        held.append(inst)
    slices = [s for inst in held for s in range(inst.start, inst.start + inst.memory_slices)]
    assert len(slices) == len(set(slices)), f"held MIG instances overlap: {[i.ref for i in held]}"
    model = CATALOG.get(gpu.model or "")
    assert model is not None and model.mig is not None
    assert sum(i.compute_slices for i in held) <= model.mig.compute_slices, "MIG compute over-committed"
    assert max(slices, default=0) < model.mig.memory_slices
    if rules.layout_for(model) is not None:
        assert sum(i.profile.endswith(MEDIA_SUFFIX) for i in held) <= 1, "two placements hold the media engines"


def assert_shared_holds(gpu: Gpu, on: list[tuple[Holder, GpuGrant]]) -> None:
    """One tenant per failure domain; at most the replicas (and the daemon's client limit) join; the VRAM
    granted stays within the GPU's, and fixed daemon shares (MPS with replicas) within one share each."""
    rules = mode_rules(gpu.mode)
    tenants = {h.pod.tenant for h, _ in on}
    assert len(tenants) <= 1, f"{rules.words} GPU shared by tenants {tenants}"
    vram = [g.vram_mib for _, g in on]
    assert sum(vram) <= gpu.memory_mib, f"{rules.words} GPU over-committed"
    if rules.replica_use == "required":
        assert gpu.replicas is not None
    if gpu.replicas:
        assert len(on) <= gpu.replicas
    if rules.client_limited:
        assert len(on) <= MPS_MAX_CLIENTS
        if gpu.replicas:
            assert all(v <= gpu.memory_mib // gpu.replicas for v in vram)


def snapshot_arrays(state: ClusterState) -> dict[str, np.ndarray]:
    return {k: getattr(state, k).copy() for k in ("unit_max", "pool_free", "slots_free", "tenant", "idle",
                                                    "cpu_free", "mig_free")}


@given(cluster=nodes(), data=st.data())
@SETTINGS
def test_random_allocate_release_keeps_every_rule(cluster, data) -> None:
    state = ClusterState(cluster)
    empty = snapshot_arrays(state)
    placed: list[str] = []
    for step in range(data.draw(st.integers(1, 25))):
        if placed and data.draw(st.booleans()) and data.draw(st.booleans()):
            key = placed.pop(data.draw(st.integers(0, len(placed) - 1)))
            assert state.release(key) is not None
        else:
            pod = data.draw(pods(step))
            policy = get_policy(data.draw(st.sampled_from(POLICIES)))
            decision = schedule_one(state, pod, policy)
            if decision.node is not None:
                placed.append(pod.key)
            else:
                assert decision.reason
        assert_invariants(state)
    for key in placed:
        state.release(key)
    after = snapshot_arrays(state)
    for name, arr in empty.items():
        np.testing.assert_array_equal(arr, after[name], err_msg=f"release did not restore {name}")
    assert state.stranded_mib() == 0


@given(cluster=nodes(), data=st.data())
@SETTINGS
def test_filter_explanation_and_choice_agree(cluster, data) -> None:
    state = ClusterState(cluster)
    for step in range(data.draw(st.integers(0, 12))):
        schedule_one(state, data.draw(pods(step)), get_policy("first-fit"), explain_failures=False)
    probe = data.draw(pods(999))
    for whole in (False, True):
        mask = fit.feasible(state, probe, whole_gpu=whole)
        for i, name in enumerate(state.node_names):
            result = fit.explain(state, name, probe, whole_gpu=whole)
            assert bool(mask.now[i]) == result.fits, (name, result.reason)
            assert bool(mask.never[i]) == (not result.fits and result.permanent), (name, result.reason)
            if not result.fits:
                assert result.reason
                continue
            chosen = fit.choose_units(state, name, probe, whole_gpu=whole)
            assert chosen is not None and len(chosen.gpus) == probe.gpu_count
            offered = {o.grant for o in result.options}
            assert set(chosen.gpus) <= offered
            trial = state.copy()
            trial.allocate(probe, chosen)  # the core's own check accepts what fit chose
            assert_invariants(trial)


@given(cluster=nodes(max_nodes=2, max_gpus=3), data=st.data())
@SETTINGS
def test_relaxed_tenancy_only_lifts_the_tenant_rule(cluster, data) -> None:
    state = ClusterState(cluster, relax_tenancy=True)
    for step in range(data.draw(st.integers(1, 15))):
        schedule_one(state, data.draw(pods(step)), get_policy("best-fit"), explain_failures=False)
    # Every other rule still holds: check them with the tenant rule switched off.
    for h in state.holders():
        node = state.node(h.assignment.node)
        for g in h.assignment.gpus:
            gpu = next(x for x in node.gpus if x.index == g.index)
            assert g.whole or gpu.mode in ALLOWED_MODES[h.pod.isolation]


def test_growing_the_state_keeps_every_array_of_earlier_nodes() -> None:
    """Regression: arrays added to the state must survive growth (they once lost `open`/`shared`)."""
    from packing.model import Gpu, Node

    def node(i: int) -> Node:
        mode = [Mode.TIMESLICE, Mode.MPS, Mode.EXCLUSIVE][i % 3]
        return Node(f"n{i:03d}", tuple(Gpu(j, 16384, mode, replicas=4 if mode is not Mode.EXCLUSIVE else None)
                                       for j in range(2 + i % 7)), cpu_milli=8000)

    grown = ClusterState([node(i) for i in range(70)])  # several growths, rows and GPU columns
    for i in range(70):
        fresh = ClusterState([node(i)])
        row = grown.index_of(f"n{i:03d}")
        g = fresh.present.shape[1]
        for name in ClusterState._ARRAYS:
            ours, theirs = getattr(grown, name)[row], getattr(fresh, name)[0]
            if name == "version":
                continue
            if ours.ndim >= 1:
                np.testing.assert_array_equal(ours[:g], theirs, err_msg=name)
            else:
                assert ours == theirs, name
        assert bool(fit.feasible(grown, pods_for_growth_test(), False).now[row])


def pods_for_growth_test():
    from packing.model import PodDemand

    return PodDemand("ns/probe", 1024, tenant="fresh-tenant")
