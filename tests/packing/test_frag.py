"""vramfit's fragmentation-aware policy (packing/policies/): the measure, the choices it makes, its invariants."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_fixtures import gpu_usage

from benchmarks import research_policies
from benchmarks.peers.workload_frag import TargetWorkload
from packing import fit
from packing.model import Gpu, Isolation, MigInstance, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import frag_tables, get_policy
from packing.policies.frag_aware import FragAware
from packing.policies.frag_measure import Evaluation, Rows, evaluate, fragment
from packing.policies.frag_tables import Interner
from packing.policies.mix import (
    FGD_SHARE_HI,
    FGD_SHARE_LO,
    PRESSURE_HI,
    PRESSURE_LO,
    MixArrays,
    PodShape,
    cpu_pressure,
    fgd_share_at,
    top_mix,
)
from packing.state import ClusterState

GIB = 1024
A100 = 80 * GIB


def mig(profile: str, start: int, slices: int, mib: int) -> MigInstance:
    return MigInstance(profile=profile, start=start, memory_slices=slices, compute_slices=slices, memory_mib=mib)


# A valid A100-80GB layout: 3g.40gb + 2g.20gb + 2 x 1g.10gb.
MIG_LAYOUT = (mig("3g.40gb", 0, 4, 40 * GIB), mig("2g.20gb", 4, 2, 20 * GIB), mig("1g.10gb", 6, 1, 10 * GIB),
              mig("1g.10gb", 7, 1, 10 * GIB))


def gpu(index: int, mode: Mode, replicas: int | None = None, mig_layout: tuple[MigInstance, ...] = (),
        model: str = "A100-80GB", memory: int = A100) -> Gpu:
    return Gpu(index=index, memory_mib=memory, mode=mode, product=model, model=model, replicas=replicas,
               mig=mig_layout)


def pod(key: str, vram: int, count: int = 1, tenant: str = "a", iso: Isolation = Isolation.NONE,
        cpu: int = 0, models: frozenset[str] | None = None) -> PodDemand:
    return PodDemand(key=key, vram_mib=vram, gpu_count=count, tenant=tenant, isolation=iso, cpu_milli=cpu,
                     models=models)


def frag_of(state: ClusterState, shape: PodShape, node: int = 0) -> float:
    """Free VRAM of one node that `shape` cannot use."""
    mix = MixArrays.build([(shape, 1.0)], state)
    return float(fragment(Rows.of(state, np.array([node])), mix)[0, 0])


def place(state: ClusterState, p: PodDemand, node: str) -> None:
    a = fit.choose_units(state, node, p)
    assert a is not None, fit.explain(state, node, p).reason
    state.allocate(p, a)


# --------------------------------------------------------------------------------------------- measure
def test_a_shape_limited_to_scarce_models_weighs_more_per_gpu_it_may_use() -> None:
    # Four GPUs, one of them a T4: a T4-only shape can use a quarter of the cluster, so its weight is x4.
    t4 = gpu(0, Mode.TIMESLICE, replicas=4, model="T4", memory=16 * GIB)
    state = ClusterState([Node(f"a100-{i}", (gpu(0, Mode.TIMESLICE, replicas=4),)) for i in range(3)]
                         + [Node("t4", (t4,))])
    flex, t4_only = PodShape(8 * GIB, tenant=None), PodShape(8 * GIB, tenant=None, models=frozenset({"t4"}))
    mix = MixArrays.build([(flex, 0.5), (t4_only, 0.5)], state)
    assert mix.weight.tolist() == pytest.approx([0.2, 0.8])
    assert mix.weight.sum() == pytest.approx(1.0)


def test_a_mix_without_model_constraints_keeps_its_weights_exactly() -> None:
    state = ClusterState([Node("a", (gpu(0, Mode.TIMESLICE, replicas=4),)),
                          Node("t4", (gpu(0, Mode.TIMESLICE, replicas=4, model="T4", memory=16 * GIB),))])
    weights = [0.1, 0.3, 0.6]
    mix = MixArrays.build([(PodShape(v * GIB, tenant=None), w) for v, w in zip((1, 2, 3), weights, strict=True)],
                          state)
    assert mix.weight.tolist() == weights  # bit for bit: decisions on such mixes cannot move


def test_a_shape_weighs_by_the_gpus_on_nodes_it_could_ever_fit() -> None:
    # Issue 14: a 4-GPU pod asking 100 CPUs fits only the one 4-GPU node with 128 CPUs (4 of 12 GPUs): x3.
    # A 1-GPU pod asking 8 CPUs fits all 12 GPUs: x1. Before the weights are renormalised: 3 : 1.
    def n(name: str, k: int, cpu: int) -> Node:
        return Node(name, tuple(gpu(i, Mode.EXCLUSIVE) for i in range(k)), cpu_milli=cpu)

    state = ClusterState([n("big-cpu", 4, 128_000), n("small-cpu", 4, 64_000), n("two", 2, 128_000),
                          n("two-b", 2, 128_000)])
    wide = PodShape(A100, gpu_count=4, tenant=None, cpu_milli=100_000)
    single = PodShape(A100, tenant=None, cpu_milli=8_000)
    mix = MixArrays.build([(wide, 0.5), (single, 0.5)], state)
    assert mix.weight.tolist() == pytest.approx([0.75, 0.25])
    # The ablations: by GPU model alone (every GPU here is an A100: no change), or not at all.
    for by in ("models", "none"):
        assert MixArrays.build([(wide, 0.5), (single, 0.5)], state, scarcity=by).weight.tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="scarcity"):
        FragAware(scarcity="cpu")
    # A shape no node can hold keeps its factor at 1 (it loses nothing anywhere; no division by zero).
    huge = PodShape(A100, gpu_count=8, tenant=None)
    assert MixArrays.build([(huge, 0.5), (single, 0.5)], state).weight.tolist() == pytest.approx([0.5, 0.5])


def test_the_measures_share_follows_the_workloads_cpu_pressure() -> None:
    # Two 1-GPU nodes with 16 CPUs each: 16 CPUs per GPU.
    state = ClusterState([Node(f"n{i}", (gpu(0, Mode.EXCLUSIVE),), cpu_milli=16_000) for i in range(2)])
    half = PodShape(A100 // 2, tenant=None, cpu_milli=8_000)  # half a GPU, 8 CPUs: 16 CPUs per GPU asked
    cpu_only = PodShape(0, gpu_count=0, tenant=None, cpu_milli=4_000)
    assert cpu_pressure({half: 3.0}, state) == pytest.approx(1.0)
    assert cpu_pressure({half: 2.0, cpu_only: 2.0}, state) == pytest.approx(1.5)  # CPU-only pods count
    assert cpu_pressure({}, state) == 0.0
    assert cpu_pressure({half: 1.0}, ClusterState([Node("untracked", (gpu(0, Mode.EXCLUSIVE),))])) == 0.0
    assert fgd_share_at(0.0) == FGD_SHARE_HI and fgd_share_at(PRESSURE_LO) == FGD_SHARE_HI
    assert fgd_share_at(PRESSURE_HI) == pytest.approx(FGD_SHARE_LO) and fgd_share_at(5.0) == FGD_SHARE_LO
    assert FGD_SHARE_LO < fgd_share_at((PRESSURE_LO + PRESSURE_HI) / 2) < FGD_SHARE_HI
    # The split lands in the arrays: each shape twice, FGD's part first.
    mix = MixArrays.build([(half, 1.0)], state, "both", share=0.75)
    assert mix.weight.tolist() == pytest.approx([0.75, 0.25]) and mix.units.tolist() == [False, True]
    with pytest.raises(ValueError, match="within"):
        MixArrays.build([(half, 1.0)], state, "both", share=1.5)


def test_the_policy_takes_its_share_from_the_pods_it_learnt() -> None:
    state = ClusterState([Node(f"n{i}", (gpu(0, Mode.EXCLUSIVE),), cpu_milli=16_000) for i in range(2)])
    light, heavy = FragAware(), FragAware()
    for i in range(64):
        light.observe(pod(f"l/{i}", A100 // 2, cpu=2_000))  # 4 CPUs per GPU asked: pressure 0.25
        heavy.observe(pod(f"h/{i}", A100 // 2, cpu=16_000))  # 32 CPUs per GPU asked: pressure 2
    assert light.measure_share(state) == FGD_SHARE_HI
    assert heavy.measure_share(state) == FGD_SHARE_LO
    assert FragAware(fgd_share=0.3).measure_share(state) == 0.3
    with pytest.raises(ValueError, match="fgd_share"):
        FragAware(fgd_share=-0.1)


def test_mig_leftovers_too_small_for_the_shape_are_fragment() -> None:
    state = ClusterState([Node("n", (gpu(0, Mode.MIG, mig_layout=MIG_LAYOUT),))])
    place(state, pod("p/x", 35 * GIB), "n")  # takes the 3g.40gb instance
    # Left: 2g.20gb + 2 x 1g.10gb = 40 GiB free.
    assert frag_of(state, PodShape(30 * GIB, tenant="a")) == 40 * GIB  # nothing >= 30 GiB is left
    assert frag_of(state, PodShape(15 * GIB, tenant="a")) == 20 * GIB  # the two 1g.10gb are too small
    assert frag_of(state, PodShape(8 * GIB, tenant="a")) == 0


def test_mps_shares_too_small_are_fragment() -> None:
    state = ClusterState([Node("n", (gpu(0, Mode.MPS, replicas=4),))])  # 4 x 20 GiB shares
    assert frag_of(state, PodShape(30 * GIB)) == A100
    assert frag_of(state, PodShape(20 * GIB)) == 0
    place(state, pod("p/x", 5 * GIB, tenant="default"), "n")
    assert frag_of(state, PodShape(20 * GIB)) == 0  # three shares left, all usable


def test_shared_gpu_of_another_tenant_is_fragment() -> None:
    state = ClusterState([Node("n", (gpu(0, Mode.TIMESLICE, replicas=8),))])
    place(state, pod("a/x", 20 * GIB, tenant="a"), "n")
    assert frag_of(state, PodShape(10 * GIB, tenant="a")) == 0
    assert frag_of(state, PodShape(10 * GIB, tenant="b")) == 60 * GIB  # the GPU is tenant a's failure domain
    assert frag_of(state, PodShape(10 * GIB, tenant=None)) == 0  # a single-tenant mix (trace) ignores tenancy


def test_isolation_model_and_cpu_make_fragment() -> None:
    node = Node("n", (gpu(0, Mode.TIMESLICE, replicas=8), gpu(1, Mode.EXCLUSIVE)), cpu_milli=4000)
    state = ClusterState([node])
    # Hardware isolation may not use the time-sliced GPU: its 80 GiB are fragment, the exclusive one is not.
    assert frag_of(state, PodShape(10 * GIB, isolation=Isolation.HARDWARE)) == A100
    assert frag_of(state, PodShape(10 * GIB, models=frozenset({"h100-80gb"}))) == 2 * A100
    assert frag_of(state, PodShape(10 * GIB, cpu_milli=8000)) == 2 * A100  # the node lacks CPU for it
    assert frag_of(state, PodShape(10 * GIB, gpu_count=3)) == 2 * A100  # needs more GPUs than the node has
    assert frag_of(state, PodShape(10 * GIB, gpu_count=2)) == 0


def test_top_mix_keeps_the_popular_shapes_and_normalises() -> None:
    from collections import Counter

    counts = Counter({PodShape(100): 90, PodShape(200): 9, PodShape(300): 1, PodShape(0, gpu_count=0): 50})
    mix = top_mix(counts, coverage=0.95)
    assert [s.vram_mib for s, _ in mix] == [100, 200]  # CPU-only shapes never count; 300 is past 95 %
    assert abs(sum(w for _, w in mix) - 1.0) < 1e-12


# --------------------------------------------------------------------------------------------- choices
def test_keeps_a_whole_gpu_for_the_big_shapes_of_the_mix() -> None:
    nodes = [Node("idle", (gpu(0, Mode.TIMESLICE, replicas=8),)),
             Node("used", (gpu(0, Mode.TIMESLICE, replicas=8),))]
    state = ClusterState(nodes)
    place(state, pod("a/old", 60 * GIB), "used")  # 20 GiB left there
    policy = FragAware(mix=[(PodShape(10 * GIB, tenant="a"), 5.0), (PodShape(75 * GIB, tenant="a"), 5.0)])
    d = schedule_one(state, pod("a/new", 10 * GIB), policy)
    assert d.node == "used"  # the idle 80 GiB stays whole for a 75 GiB pod


def test_keeps_an_idle_node_whole_for_multi_gpu_shapes() -> None:
    two = (gpu(0, Mode.TIMESLICE, replicas=8), gpu(1, Mode.TIMESLICE, replicas=8))
    state = ClusterState([Node("a-idle", two), Node("b-used", two)])
    place(state, pod("a/old", 10 * GIB), "b-used")
    policy = FragAware(mix=[(PodShape(10 * GIB, tenant="a"), 10.0), (PodShape(A100, gpu_count=2, tenant="a"), 1.0)])
    d = schedule_one(state, pod("a/new", 10 * GIB), policy)
    assert d.node == "b-used" and d.assignment is not None
    assert d.assignment.gpus[0].index == 0  # joins the GPU already in use, keeps GPU 1 whole


def test_mig_choice_takes_the_smallest_fitting_instance() -> None:
    state = ClusterState([Node("n", (gpu(0, Mode.MIG, mig_layout=MIG_LAYOUT),))])
    policy = FragAware(mix=[(PodShape(30 * GIB, tenant="a"), 1.0), (PodShape(8 * GIB, tenant="a"), 1.0)])
    d = schedule_one(state, pod("a/x", 8 * GIB), policy)
    assert d.assignment is not None and d.assignment.gpus[0].mig in ("1g.10gb@6", "1g.10gb@7")


def test_does_not_open_a_foreign_tenants_gpu_needlessly() -> None:
    # Tenant b's pod could take the idle shared GPU or the exclusive one; putting it on the shared GPU
    # would make that GPU tenant b's, useless to tenant a's popular small pods.
    state = ClusterState([Node("n", (gpu(0, Mode.TIMESLICE, replicas=8), gpu(1, Mode.EXCLUSIVE)))])
    policy = FragAware(mix=[(PodShape(10 * GIB, tenant="a"), 10.0), (PodShape(60 * GIB, tenant="b"), 1.0)])
    d = schedule_one(state, pod("b/x", 60 * GIB, tenant="b"), policy)
    assert d.assignment is not None and d.assignment.gpus[0].index == 1


def test_cpu_only_pods_go_where_they_strand_no_gpu() -> None:
    nodes = [Node("free-gpus", (gpu(0, Mode.TIMESLICE, replicas=8),), cpu_milli=8000),
             Node("full-gpus", (gpu(0, Mode.TIMESLICE, replicas=8),), cpu_milli=8000)]
    state = ClusterState(nodes)
    place(state, pod("a/big", A100, cpu=1000), "full-gpus")
    policy = FragAware(mix=[(PodShape(10 * GIB, tenant="a", cpu_milli=2000), 1.0)])
    d = schedule_one(state, pod("a/cpu", 0, count=0, cpu=5000), policy)
    assert d.node == "full-gpus"


def test_learns_the_mix_online() -> None:
    policy = FragAware()
    for i in range(40):
        policy.observe(pod(f"a/{i}", 10 * GIB if i % 4 else 40 * GIB))
    shapes = {s.vram_mib: w for s, w in policy.current_mix()}
    assert set(shapes) == {10 * GIB, 40 * GIB} and shapes[10 * GIB] > shapes[40 * GIB]



def test_a_fresh_learning_policy_scores_its_first_pods_against_what_it_has_seen() -> None:
    # With no mix every loss is 0 and the first GPU in cluster order wins: a 3 GiB pod would take a
    # whole 7g.80gb instance. The mix is snapshotted from the first observed pod on.
    whole = (mig("7g.80gb", 0, 8, A100),)
    state = ClusterState([Node("big", (gpu(0, Mode.MIG, mig_layout=whole),)),
                          Node("small", (gpu(0, Mode.MIG, mig_layout=MIG_LAYOUT),))])
    policy = FragAware()
    d = schedule_one(state, pod("a/embed", 3 * GIB), policy)
    assert policy.current_mix() and d.node == "small"
    assert d.assignment is not None and d.assignment.gpus[0].mig in ("1g.10gb@6", "1g.10gb@7")


def test_the_default_builds_on_the_measure() -> None:
    assert isinstance(get_policy("vramfit"), FragAware)


def test_the_default_learns_its_mix_and_takes_no_workload() -> None:
    ours = get_policy("vramfit")
    assert ours.learn is True and ours.current_mix() == []
    ours.observe(pod("a/x", 10 * GIB))
    assert [s.vram_mib for s, _ in ours.current_mix()] == [10 * GIB]
    with pytest.raises(TypeError, match="workload"):  # the benchmark's target workload is a research input
        get_policy("vramfit", workload=None)


def test_frag_aware_scores_against_the_target_workload_and_vramfit_measure_learns() -> None:
    # A trace benchmark offers FGD's target workload: frag-aware scores against it, vramfit-measure learns.
    research_policies.register()
    wl = TargetWorkload(cpu=np.array([0]), milli=np.array([40 * GIB]), count=np.array([1]),
                        models=(frozenset(),), weight=np.array([5]), kept=5, total=5)
    ours, given = get_policy("vramfit-measure", workload=wl), get_policy("frag-aware", workload=wl)
    assert isinstance(ours, FragAware) and isinstance(given, FragAware)
    assert given.learn is False and [s.vram_mib for s, _ in given.current_mix()] == [40 * GIB]
    assert ours.learn is True and ours.current_mix() == []
    explicit = get_policy("vramfit-measure", workload=wl, use_workload=True)  # explicit params win
    assert isinstance(explicit, FragAware) and explicit.learn is False


# ------------------------------------------------------------------------------------------- invariants
MODES = st.sampled_from(["excl", "mig", "mps4", "mps-pinned", "ts4"])


def _gpu(kind: str, index: int) -> Gpu:
    if kind == "excl":
        return gpu(index, Mode.EXCLUSIVE)
    if kind == "mig":
        return gpu(index, Mode.MIG, mig_layout=MIG_LAYOUT)
    if kind == "mps4":
        return gpu(index, Mode.MPS, replicas=4)
    if kind == "mps-pinned":
        return gpu(index, Mode.MPS)
    return gpu(index, Mode.TIMESLICE, replicas=4)


clusters = st.lists(st.lists(MODES, min_size=1, max_size=4), min_size=1, max_size=5)
pods = st.lists(st.tuples(st.sampled_from([3, 8, 14, 20, 35, 40, 70, 80]), st.integers(1, 2),
                          st.sampled_from(["a", "b", "c"]), st.sampled_from(list(Isolation)),
                          st.integers(0, 3)), min_size=1, max_size=30)


def check_invariants(state: ClusterState) -> None:
    """Every rule, re-derived from the holders alone."""
    per_gpu: dict[tuple[str, int], list[tuple[PodDemand, int, str | None]]] = {}
    for h in state.holders():
        for g in h.assignment.gpus:
            per_gpu.setdefault((h.assignment.node, g.index), []).append((h.pod, g.vram_mib, g.mig))
    for (node, index), held in per_gpu.items():
        g = gpu_usage(state, node, index).gpu
        for p, vram, _ in held:
            assert vram >= p.vram_mib
            allowed = {Isolation.HARDWARE: {Mode.EXCLUSIVE, Mode.MIG},
                       Isolation.PROCESS: {Mode.EXCLUSIVE, Mode.MIG, Mode.MPS}}.get(p.isolation, set(Mode))
            assert g.mode in allowed, (p, g.mode)
        if g.mode is Mode.EXCLUSIVE:
            assert len(held) == 1 and held[0][1] <= g.memory_mib
        elif g.mode is Mode.MIG:
            refs = [m for _, _, m in held]
            assert len(refs) == len(set(refs))  # one pod per instance
            for _p, vram, ref in held:
                inst = g.instance(ref or "")
                assert inst is not None and vram <= inst.memory_mib
        else:
            assert len({p.tenant for p, _, _ in held}) == 1  # one tenant per shared failure domain
            if g.mode is Mode.MPS and g.replicas:
                assert len(held) <= g.replicas
                assert all(v <= g.memory_mib // g.replicas for _, v, _ in held)
            else:
                assert sum(v for _, v, _ in held) <= g.memory_mib
                if g.replicas:
                    assert len(held) <= g.replicas


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters, pods)
def test_vramfit_never_overcommits_nor_breaks_trust(layout: list[list[str]],
                                                    demands: list[tuple[int, int, str, Isolation, int]]) -> None:
    nodes = [Node(f"n{i}", tuple(_gpu(k, j) for j, k in enumerate(kinds)), cpu_milli=16000)
             for i, kinds in enumerate(layout)]
    state = ClusterState(nodes)
    policy = get_policy("vramfit")
    for i, (gib, count, tenant, iso, cpu) in enumerate(demands):
        p = pod(f"{tenant}/p{i}", gib * GIB, count, tenant, iso, cpu * 2000)
        mask = fit.feasible(state, p)
        if mask.now.any():
            scores = np.asarray(policy.score(state, p, mask.now))
            assert np.isfinite(scores[mask.now]).all()
        d = schedule_one(state, p, policy, explain_failures=False)
        assert (d.node is None) == (not mask.now.any())  # places whenever the filter says it fits
        check_invariants(state)


# ------------------------------------------------------------------------------ interned, cached scoring
def _reference(policy: FragAware, state: ClusterState, p: PodDemand) -> Evaluation:
    """`evaluate` over every row, from scratch: what the policy's caches must agree with."""
    mix = policy._mix_arrays(state)
    return evaluate(Rows.of(state, np.arange(len(state))), mix, policy._pod_view(state, p, mix))


def assert_same_scores(policy: FragAware, state: ClusterState, p: PodDemand, ref: Evaluation) -> None:
    e = policy._entry(state, p, None)
    # Losses are rounded to 1e-6 on both sides; the dot products may differ in the last bit before that.
    np.testing.assert_allclose(e.loss, ref.loss, rtol=0, atol=2e-6)
    np.testing.assert_allclose(e.loss_g, ref.loss_g, rtol=0, atol=2e-6)
    assert np.array_equal(e.select, ref.select)
    assert np.array_equal(e.pack, ref.pack)


PROBES = [pod("a/probe1", 10 * GIB), pod("b/probe2", 35 * GIB, iso=Isolation.HARDWARE, cpu=2000),
          pod("c/probe3", 20 * GIB, count=2, iso=Isolation.PROCESS), pod("a/probe0", 0, count=0, cpu=4000)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters, pods, st.sampled_from(["both", "fgd", "units"]))
def test_cached_scores_equal_a_fresh_evaluation(layout: list[list[str]],
                                                demands: list[tuple[int, int, str, Isolation, int]],
                                                measure: str) -> None:
    """Placements, releases and mix refreshes (learned online) only ever re-score what they changed."""
    nodes = [Node(f"n{i}", tuple(_gpu(k, j) for j, k in enumerate(kinds)), cpu_milli=16000)
             for i, kinds in enumerate(layout)]
    state = ClusterState(nodes)
    policy = FragAware(measure=measure, refresh=8)
    placed: list[str] = []
    for i, (gib, count, tenant, iso, cpu) in enumerate(demands * 2):
        d = schedule_one(state, pod(f"{tenant}/p{i}", gib * GIB, count, tenant, iso, cpu * 2000), policy,
                         explain_failures=False)
        if d.node is not None:
            placed.append(d.pod.key)
        if i % 3 == 2 and placed:
            state.release(placed.pop(0))
        for probe in PROBES:
            assert_same_scores(policy, state, probe, _reference(policy, state, probe))


def test_scores_after_a_mix_refresh_equal_a_fresh_policy_with_that_mix() -> None:
    rng = np.random.default_rng(5)
    layout = [["mig", "mps4", "ts4", "excl"], ["ts4", "ts4"], ["mig", "mig"], ["mps-pinned", "excl", "mps4"]] * 3
    state = ClusterState([Node(f"n{i}", tuple(_gpu(k, j) for j, k in enumerate(kinds)), cpu_milli=16000)
                          for i, kinds in enumerate(layout)])
    scored = FragAware()  # scores between refreshes: its tables are carried from one mix to the next
    stream: list[PodDemand] = []
    for i in range(200):
        p = pod(f"{'abc'[i % 3]}/p{i}", int(rng.choice([3, 8, 14, 20, 35])) * GIB, int(rng.integers(1, 3)),
                "abc"[i % 3], list(Isolation)[int(rng.integers(0, 3))], int(rng.integers(0, 3)) * 2000)
        stream.append(p)
        schedule_one(state, p, scored, explain_failures=False)
        if i in (20, 40, 70, 130, 199):  # after refreshes at 16, 32, 64, 128
            fresh = FragAware()
            for q in stream:
                fresh.observe(q)
            assert fresh.current_mix() == scored.current_mix()
            for probe in PROBES:
                assert_same_scores(scored, state, probe, fresh._entry(state, probe, None))  # type: ignore[arg-type]


def test_a_mix_refresh_keeps_the_tables() -> None:
    state = ClusterState([Node(f"n{i}", (gpu(0, Mode.TIMESLICE), gpu(1, Mode.MIG, mig_layout=MIG_LAYOUT)))
                          for i in range(4)])
    policy = FragAware(refresh=4)
    for i in range(17):  # the mix is first taken at 16 pods
        schedule_one(state, pod(f"a/p{i}", 3 * GIB), policy, explain_failures=False)
    table = policy._table
    for i in range(17, 40):  # the same single shape: every refresh finds the same mix
        schedule_one(state, pod(f"a/p{i}", 3 * GIB), policy, explain_failures=False)
    assert policy._table is table
    policy.observe(pod("a/x", 8 * GIB))
    for i in range(4):  # a new shape enters the mix at the next refresh: the table takes it in
        policy.observe(pod(f"a/y{i}", 8 * GIB))
    assert len(policy.current_mix()) == 2
    assert_same_scores(policy, state, PROBES[0], _reference(policy, state, PROBES[0]))
    assert policy._table is table


def test_interner_is_exact_when_every_hash_collides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frag_tables, "_HASH_MUL", np.zeros(64, dtype=np.int64))  # every row hashes to 0
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 3, size=(200, 4))
    interner = Interner()
    ids, new = interner.intern(keys)
    distinct = {tuple(k) for k in keys.tolist()}
    assert len(interner) == len(distinct) == len(new)
    for a in range(0, 200, 7):
        for b in range(0, 200, 11):
            assert (ids[a] == ids[b]) == bool((keys[a] == keys[b]).all())
    assert np.array_equal(ids[new], np.arange(len(distinct)))  # new rows come in id order
    again, none = interner.intern(keys[::-1].copy())
    assert np.array_equal(again, ids[::-1]) and none.size == 0  # ids are stable across calls


def test_a_pickled_policy_scores_the_same() -> None:
    state = ClusterState([Node(f"n{i}", (_gpu("mig", 0), _gpu("ts4", 1)), cpu_milli=16000) for i in range(3)])
    policy = FragAware(mix=[(PodShape(8 * GIB, tenant="a"), 3.0), (PodShape(20 * GIB, tenant="a"), 1.0)])
    schedule_one(state, pod("a/x", 8 * GIB), policy, explain_failures=False)
    twin = pickle.loads(pickle.dumps(policy))
    for probe in PROBES:
        assert_same_scores(twin, state, probe, policy._entry(state, probe, None))  # type: ignore[arg-type]


def test_node_churn_rescores_like_a_fresh_evaluation() -> None:
    """Nodes added, replaced (a new GPU kind, more GPUs than before) and removed under a cached policy."""
    state = ClusterState([])
    policy = FragAware(mix=[(PodShape(8 * GIB, tenant="a"), 3.0), (PodShape(35 * GIB, tenant="b"), 1.0)])
    assert policy.score(state, PROBES[0], np.zeros(0, dtype=bool)).shape == (0,)
    for i in range(4):
        state.upsert_node(Node(f"n{i}", (_gpu("mig", 0), _gpu("mps4", 1)), cpu_milli=16000))
    schedule_one(state, pod("a/x", 8 * GIB), policy, explain_failures=False)
    state.upsert_node(Node("n1", tuple(gpu(j, Mode.TIMESLICE, replicas=4, model="H100-80GB") for j in range(10)),
                           cpu_milli=16000))
    schedule_one(state, pod("a/y", 8 * GIB), policy, explain_failures=False)
    state.remove_node("n0")
    schedule_one(state, pod("b/z", 35 * GIB, iso=Isolation.HARDWARE), policy, explain_failures=False)
    for probe in PROBES:
        assert_same_scores(policy, state, probe, _reference(policy, state, probe))


def test_a_fork_learns_on_its_own_and_scores_as_its_origin() -> None:
    # The queue planner plans with a fork of the live policy: the same mix and scores, never shared state.
    state = ClusterState([Node(f"n{i}", (gpu(0, Mode.TIMESLICE, replicas=4),), cpu_milli=64_000) for i in range(3)])
    live = FragAware()
    for i in range(20):
        live.observe(pod(f"a/{i}", (8 + i % 3 * 8) * GIB, cpu=4_000))
    probe = pod("a/probe", 16 * GIB, cpu=4_000)
    ok = np.ones(len(state), dtype=bool)
    before = live.score(state, probe, ok).copy()
    twin = live.fork()
    assert twin.current_mix() == live.current_mix() and twin.measure_share(state) == live.measure_share(state)
    assert np.array_equal(twin.score(state, probe, ok), before)
    counts = dict(live._counts)
    for i in range(50):
        twin.observe(pod(f"a/big{i}", 70 * GIB, count=1, cpu=60_000))
    assert dict(live._counts) == counts and live.current_mix() != twin.current_mix()
    assert np.array_equal(live.score(state, probe, ok), before)
    assert pickle.loads(pickle.dumps(twin)).current_mix() == twin.current_mix()  # it travels to the worker
