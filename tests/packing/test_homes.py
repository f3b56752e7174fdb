"""The homes of the rare heavy shapes (packing/policies/homes.py, issue 14): which shapes count, what a placement
costs them, the incremental book, and the default policy keeping a sole home whole."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy
from packing.policies.homes import HomeBook, Tail, TailShape, home_loss, pods_left, tail_shapes
from packing.policies.mix import PodShape
from packing.state import ClusterState

SMALL = PodShape(1000, 1, Isolation.NONE, None, None, 8000)
HEAVY = PodShape(1000, 8, Isolation.NONE, None, None, 120000)  # fits only a 128-CPU node
LIGHT8 = PodShape(1000, 8, Isolation.NONE, None, None, 60000)


def gpus(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=j, memory_mib=1000, mode=Mode.TIMESLICE, product="G", model="G", replicas=1000)
                 for j in range(n))


def g3_then_g2() -> ClusterState:
    """A 128-CPU node first in cluster order (ties go to it), then a 96-CPU one; 8 GPUs each."""
    return ClusterState([Node("g3", gpus(8), cpu_milli=128000), Node("g2", gpus(8), cpu_milli=96000)])


def test_the_tail_is_the_multi_gpu_shapes_outside_the_mix_weighted_as_the_mix() -> None:
    counts = [(SMALL, 990.0), (HEAVY, 4.0), (LIGHT8, 6.0), (PodShape(500, 1), 3.0)]
    tail = tail_shapes(counts, [(SMALL, 1.0)], kept_total=990.0)
    assert [t.shape for t in tail.shapes] == [LIGHT8, HEAVY]  # 1-GPU shapes never; heaviest first
    assert np.allclose(tail.weight, [6 / 990, 4 / 990])
    assert not tail_shapes(counts, [(SMALL, 0.5), (HEAVY, 0.25), (LIGHT8, 0.25)], kept_total=1000.0)


def test_a_placement_costs_the_homes_it_unmakes_and_only_those() -> None:
    state = g3_then_g2()
    tail = Tail.of([TailShape(HEAVY, 0.01)])
    pod = PodDemand(key="t/p", vram_mib=1000, tenant="t", cpu_milli=8000)
    select = np.zeros(state.present.shape, dtype=bool)
    select[:, 0] = True  # the pod would take GPU 0 on either node
    loss = home_loss(state, pod, HomeBook(tail), select, np.ones(2, dtype=bool))
    assert loss[0] == 0.01 * 8 * 1000  # g3 was the heavy shape's home, and would not be after
    assert loss[1] == 0.0  # g2 never was (96 CPUs)
    # A pod that fits into an open GPU leaves g3's eight free GPUs alone... once one of them is open, g3 has
    # only 7 whole GPUs and is no home any more: nothing left to cost.
    opened = PodDemand(key="t/o", vram_mib=300, tenant="t")
    state.allocate(opened, fit.choose_units(state, "g3", opened) or ())
    assert home_loss(state, pod, HomeBook(tail), select, np.ones(2, dtype=bool))[0] == 0.0


def test_homes_many_beyond_the_expected_arrivals_cost_nothing() -> None:
    state = g3_then_g2()
    tail = Tail.of([TailShape(HEAVY, 0.01)])
    pod = PodDemand(key="t/p", vram_mib=1000, tenant="t", cpu_milli=8000)
    select = np.zeros(state.present.shape, dtype=bool)
    select[:, 0] = True
    rows = np.ones(2, dtype=bool)
    # 16 GPUs free at 1 GPU a pod: 16 pods to come, 0.16 of them heavy, against one home.
    left = pods_left(state, 1000, 1.0)
    assert left == 16.0
    assert home_loss(state, pod, HomeBook(tail), select, rows, left)[0] == 0.16 * 0.01 * 8 * 1000
    assert home_loss(state, pod, HomeBook(tail), select, rows, 0.0)[0] == 0.0


sizes = st.lists(st.tuples(st.sampled_from([200, 500, 1000]), st.sampled_from([1, 2, 4]),
                           st.integers(0, 60)), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes, st.integers(0, 10))
def test_the_book_kept_row_by_row_is_the_book_built_afresh(ds: list[tuple[int, int, int]], release: int) -> None:
    state = ClusterState([Node(f"n{i}", gpus(g), cpu_milli=c)
                          for i, (g, c) in enumerate([(8, 128000), (8, 96000), (4, 64000), (2, 32000)])])
    tail = Tail.of([TailShape(HEAVY, 0.01), TailShape(LIGHT8, 0.02),
                    TailShape(PodShape(500, 2, Isolation.NONE, None, None, 4000), 0.03)])
    book = HomeBook(tail)
    book.update(state)
    for i, (milli, k, cpu) in enumerate(ds):
        p = PodDemand(key=f"t/p{i}", vram_mib=milli, gpu_count=1 if milli < 1000 else k, tenant="t",
                      cpu_milli=cpu * 1000)
        for node in state.node_names:
            a = fit.choose_units(state, node, p)
            if a is not None:
                state.allocate(p, a)
                break
        if i == release and state.holders():
            state.release(state.holders()[0].pod.key)
        book.update(state)
        fresh = HomeBook(tail)
        fresh.update(state)
        assert np.array_equal(book.count, fresh.count) and np.array_equal(book.home, fresh.home)
        assert np.array_equal(book.homes, fresh.homes)
        # The per-shape answers kept row by row equal those computed afresh, for a probe pod whose unit choice
        # is a function of the row (its first GPUs with room).
        probe = PodDemand(key="t/probe", vram_mib=500, gpu_count=1, tenant="t", cpu_milli=20000)
        room = state.present & (state.pool_free >= probe.vram_mib)
        select = room & (np.cumsum(room, axis=1) <= probe.gpu_count)
        rows = room.any(axis=1)
        assert np.array_equal(book.lost(state, probe, select, rows)[rows], fresh.lost(state, probe, select, rows)[rows])


def test_the_default_keeps_the_sole_home_of_a_heavy_shape_whole() -> None:
    """Both nodes are idle and equal for a 1-GPU pod but for CPU. Only g3 can ever take the 8-GPU, 120-CPU pods
    the policy has seen (too few to enter its mix); the default leaves g3 whole and opens g2. Without the homes
    term the same policy opens g3, first in cluster order."""
    seen = [PodDemand(key=f"s/{i}", vram_mib=1000, tenant="t", cpu_milli=8000) for i in range(250)]
    for i in range(6):  # seen before the mix's snapshot at 256 pods
        seen.insert(40 * i + 20, PodDemand(key=f"h/{i}", vram_mib=1000, gpu_count=8, tenant="t", cpu_milli=120000))
    placed: dict[float, str | None] = {}
    for homes in (0.0, 4.0):
        policy = get_policy("vramfit", homes=homes)
        for p in seen:
            policy.observe(p)
        assert all(s.gpu_count == 1 for s, _ in policy.current_mix())  # the heavy shape is outside the mix
        assert len(policy._tail.shapes) == (1 if homes else 0)
        state = g3_then_g2()
        pod = PodDemand(key="t/new", vram_mib=1000, tenant="t", cpu_milli=8000)
        placed[homes] = schedule_one(state, pod, policy, explain_failures=False).node
    assert placed == {0.0: "g3", 4.0: "g2"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes)
def test_the_default_with_homes_never_overcommits(ds: list[tuple[int, int, int]]) -> None:
    state = ClusterState([Node(f"n{i}", gpus(g), cpu_milli=c)
                          for i, (g, c) in enumerate([(8, 128000), (8, 96000), (4, 64000)])])
    policy = get_policy("vramfit")
    for i in range(50):  # a learnt mix with a heavy tail
        policy.observe(PodDemand(key=f"s/{i}", vram_mib=500, tenant="t", cpu_milli=4000))
    policy.observe(PodDemand(key="h/0", vram_mib=1000, gpu_count=8, tenant="t", cpu_milli=120000))
    for i, (milli, k, cpu) in enumerate(ds):
        p = PodDemand(key=f"t/p{i}", vram_mib=milli, gpu_count=1 if milli < 1000 else k, tenant="t",
                      cpu_milli=cpu * 1000)
        fits = bool(fit.feasible(state, p).now.any())
        d = schedule_one(state, p, policy, explain_failures=False)
        assert (d.node is None) == (not fits)
        used: Counter[tuple[str, int]] = Counter()
        for h in state.holders():
            for g in h.assignment.gpus:
                used[(h.assignment.node, g.index)] += g.vram_mib
        assert all(v <= 1000 for v in used.values())
        assert (state.pool_free >= 0).all() and (state.cpu_free >= 0).all()
