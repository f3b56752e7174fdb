"""Dual-price gap values (packing/policies/frag_dual.py): the knapsack, the LP's duals, and the policy's invariants."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import research_policies
from benchmarks.research_policies import COMBINES, FragAwareLab, FragDualLab
from packing import fit
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import DEFAULT_POLICY, get_policy, policy_names
from packing.policies.frag_dual import FragDual, gap_values, grid_step, solve_duals
from packing.state import ClusterState

research_policies.register()  # frag-dual, vramfit-measure: the benchmark's variants of the default

prices = st.dictionaries(st.integers(1, 12), st.floats(-5.0, 50.0, allow_nan=False), max_size=5)


def brute_force(prices: dict[int, float], g: int) -> float:
    """Best total price of a multiset of sizes fitting in g, by enumerating every multiset."""
    items = sorted((s, p) for s, p in prices.items() if s > 0)

    def best(i: int, room: int) -> float:
        if i == len(items):
            return 0.0
        s, p = items[i]
        return max(c * p + best(i + 1, room - c * s) for c in range(room // s + 1))

    return best(0, g)


@settings(max_examples=80, deadline=None)
@given(prices, st.integers(0, 20))
def test_gap_values_match_brute_force(pr: dict[int, float], top: int) -> None:
    val = gap_values(pr, top)
    for g in range(top + 1):
        assert val[g] == pytest.approx(brute_force(pr, g), abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(prices, st.integers(0, 40))
def test_gap_values_are_monotone_and_zero_at_zero(pr: dict[int, float], top: int) -> None:
    val = gap_values(pr, top)
    assert val[0] == 0.0
    assert (np.diff(val) >= 0).all()


sizes_mix = st.dictionaries(st.integers(1, 10), st.floats(0.5, 30.0), min_size=1, max_size=4)
fills = st.dictionaries(st.integers(0, 9), st.integers(0, 6), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(sizes_mix, fills)
def test_duals_certify_the_lp_optimum(expected: dict[int, float], by_fill: dict[int, int]) -> None:
    """(val, pi) is dual feasible, so sum_a b_a val(top - a) + sum_s n_s pi_s bounds the packing; LP
    duality makes it equal to the optimum: the gap values are exactly what the duals imply."""
    top = 10
    sol = solve_duals(expected, {a: float(n) for a, n in by_fill.items()}, top, step=1, perturb=0.0)
    dual_obj = sum(n * sol.val[top - a] for a, n in by_fill.items()) + sum(
        expected[s] * sol.pi[s] for s in sol.pi)
    assert dual_obj == pytest.approx(sol.packed, rel=1e-6, abs=1e-6)
    # Feasibility of the arc constraints: a gap is worth at least any item plus what is left of it.
    for g in range(top + 1):
        for s, y in sol.price.items():
            if s <= g:
                assert sol.val[g] >= y + sol.val[g - s] - 1e-9


def test_dual_cost_is_zero_for_a_placement_the_lp_uses() -> None:
    """Two sizes that pair exactly (6 + 4 = 10) and fill all bins: each costs exactly its price."""
    sol = solve_duals({6: 5.0, 4: 5.0}, {0: 5.0}, 10, step=1, perturb=0.0)
    assert sol.packed == pytest.approx(50.0)
    assert sol.val[10] - sol.val[4] == pytest.approx(sol.price[6])


def test_grid_step_is_exact_on_trace_sizes_and_coarse_on_mib() -> None:
    assert grid_step([810, 470, 1000], 1000) == 10
    assert grid_step([8191, 1000], 81920) == 81920 // 100


# ---------------------------------------------------------------------------------------------- policy
def trace_like_state(gpus_per_node: list[int], cpu: int = 32000) -> ClusterState:
    nodes = [Node(f"n{i}", tuple(Gpu(index=j, memory_mib=1000, mode=Mode.TIMESLICE, product="G2", model="G2",
                                     replicas=1000) for j in range(k)), cpu_milli=cpu)
             for i, k in enumerate(gpus_per_node)]
    return ClusterState(nodes)


MIX = [(PodDemand(key="m/a", vram_mib=810, tenant="t"), 5.0), (PodDemand(key="m/b", vram_mib=190, tenant="t"), 2.0),
       (PodDemand(key="m/c", vram_mib=500, tenant="t"), 3.0), (PodDemand(key="m/d", vram_mib=1000, tenant="t"), 4.0)]


def test_registered() -> None:
    assert "frag-dual" in policy_names()
    assert isinstance(get_policy("frag-dual"), FragDual)
    with pytest.raises(ValueError):
        FragDualLab(combine="nope")
    with pytest.raises(ValueError, match="cpu_gap"):
        FragDual(cpu_gap="False")  # type: ignore[arg-type]


def test_the_default_is_the_measured_dual_variant_and_takes_overrides() -> None:
    assert DEFAULT_POLICY == "vramfit"
    p = get_policy()
    assert isinstance(p, FragDual) and p.name == "vramfit"
    assert type(p) is FragDual and (p.resolve, p.cpu_gap, p.homes, p.homes_scarce) == (64, True, 4.0, True)
    old_name = get_policy("vramfit-dual")
    assert isinstance(old_name, FragDualLab) and (old_name.combine, old_name.lp_mix, old_name.resolve) == (
        "lex-dual", "observed", 64)
    m = get_policy("vramfit-measure")
    assert type(m) is FragAwareLab and m.name == "vramfit-measure" and not m.use_workload
    q = get_policy("vramfit", resolve=256)
    assert isinstance(q, FragDual) and q.resolve == 256


def test_prefers_the_gap_the_mix_fills() -> None:
    """A 190 pod goes into the 190 sliver next to an 810 rather than cutting a fresh half GPU."""
    state = trace_like_state([2])
    p810 = PodDemand(key="t/a", vram_mib=810, tenant="t")
    p500 = PodDemand(key="t/b", vram_mib=500, tenant="t")
    state.allocate(p810, fit.choose_units(state, "n0", p810) or pytest.fail("no fit"))
    a = fit.choose_units(state, "n0", p500)
    assert a is not None
    state.allocate(p500, a)
    policy = FragDualLab(mix=MIX, combine="dual")
    small = PodDemand(key="t/c", vram_mib=190, tenant="t")
    d = schedule_one(state, small, policy, explain_failures=False)
    assert d.node == "n0"
    free = sorted(int(x) for x in state.pool_free[0][:2])
    assert free == [0, 500]  # the sliver was filled, the half GPU kept for a 500


gpu_counts = st.lists(st.integers(1, 4), min_size=1, max_size=4)
demands = st.lists(st.tuples(st.sampled_from([100, 190, 230, 470, 500, 810, 1000]), st.integers(1, 2),
                             st.integers(0, 8)), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_counts, demands, st.sampled_from(COMBINES), st.sampled_from([0, 5]), st.sampled_from(["workload",
                                                                                                   "observed"]),
       st.booleans())
def test_never_overcommits(layout: list[int], ds: list[tuple[int, int, int]], combine: str, resolve: int,
                           lp_mix: str, cpu_gap: bool) -> None:
    state = trace_like_state(layout, cpu=16000)
    policy = get_policy("frag-dual", mix=MIX, combine=combine, resolve=resolve, lp_mix=lp_mix, cpu_gap=cpu_gap)
    for i, (milli, count, cpu) in enumerate(ds):
        k = 1 if milli < 1000 else count
        p = PodDemand(key=f"t/p{i}", vram_mib=milli, gpu_count=k, tenant="t", isolation=Isolation.NONE,
                      cpu_milli=cpu * 1000)
        fits = bool(fit.feasible(state, p).now.any())
        d = schedule_one(state, p, policy, explain_failures=False)
        assert (d.node is None) == (not fits)  # places whenever the filter says it fits
        used: Counter[tuple[str, int]] = Counter()
        cpu_used: Counter[str] = Counter()
        for h in state.holders():
            cpu_used[h.assignment.node] += h.pod.cpu_milli
            for g in h.assignment.gpus:
                assert g.vram_mib >= h.pod.vram_mib
                used[(h.assignment.node, g.index)] += g.vram_mib
        assert all(v <= 1000 for v in used.values())
        assert all(v <= 16000 for v in cpu_used.values())
        assert (state.pool_free >= 0).all() and (state.cpu_free >= 0).all()



# A mix whose pods bring 16 CPU-milli per VRAM unit (rho): filling a node's 2,000 free units takes 32,000.
# 600 + 300 leaves 100 of a GPU, so the LP cannot place all and the sizes keep positive prices.
CPU_MIX = [(PodDemand(key="m/a", vram_mib=600, tenant="t", cpu_milli=9600), 3.0),
           (PodDemand(key="m/b", vram_mib=300, tenant="t", cpu_milli=4800), 1.0)]


def test_cpu_gap_charges_the_gap_value_a_node_cannot_fill() -> None:
    """Two idle 4-GPU nodes cost a 600-unit pod the same GPU space. On the one with 64 CPUs the pod's 20 CPUs
    leave its other 3,400 units 44 CPUs where the mix needs 54.4 to fill them, so the CPU-aware cost is higher
    there and the pod goes to the node with 128 CPUs. The GPU-only cost cannot tell the two apart."""
    nodes = [Node(f"n{i}", tuple(Gpu(index=j, memory_mib=1000, mode=Mode.TIMESLICE, product="G2", model="G2",
                                     replicas=1000) for j in range(4)), cpu_milli=cpu)
             for i, cpu in enumerate([64000, 128000])]
    state = ClusterState(nodes)
    pod = PodDemand(key="t/p", vram_mib=600, tenant="t", cpu_milli=20000)
    gpu_only = FragDual(mix=CPU_MIX).dual_cost(state, pod)
    aware = FragDualLab(mix=CPU_MIX, combine="dual", cpu_gap=True)
    cost = aware.dual_cost(state, pod)
    assert gpu_only[0, 0] == pytest.approx(gpu_only[1, 0]) and gpu_only[0, 0] > 0
    assert cost[1] == pytest.approx(gpu_only[1])  # 128 CPUs cover the node's gaps before and after
    assert (cost[0, :4] > gpu_only[0, :4] + 1.0).all()
    d = schedule_one(state, pod, aware, explain_failures=False)
    assert d.node == "n1"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_counts, st.lists(st.tuples(st.sampled_from([300, 600]), st.integers(0, 12)), max_size=12),
       st.sampled_from([300, 600]), st.integers(0, 12), st.integers(4, 40))
def test_cpu_gap_cost_is_never_below_the_gpu_cost(layout: list[int], before: list[tuple[int, int]], milli: int,
                                                  cpu: int, node_cpu: int) -> None:
    """The CPU-aware cost is the GPU cost or more (never a bonus for a node short of CPU), and exactly the
    GPU cost where the node's free CPU still covers rho x its free units after the placement."""
    state = trace_like_state(layout, cpu=node_cpu * 1000)
    placer = FragDualLab(mix=CPU_MIX, combine="dual")
    for i, (m, c) in enumerate(before):
        schedule_one(state, PodDemand(key=f"t/b{i}", vram_mib=m, tenant="t", cpu_milli=c * 1000), placer,
                     explain_failures=False)
    pod = PodDemand(key="t/p", vram_mib=milli, tenant="t", cpu_milli=cpu * 1000)
    gpu_only = FragDual(mix=CPU_MIX).dual_cost(state, pod)
    cost = FragDual(mix=CPU_MIX, cpu_gap=True).dual_cost(state, pod)
    assert (cost >= gpu_only - 1e-9).all()
    rho = 16.0
    free = np.clip(state.pool_free, 0, 1000).sum(axis=1)
    roomy = state.cpu_free - pod.cpu_milli >= rho * (free - milli)
    assert np.allclose(cost[roomy], gpu_only[roomy])
