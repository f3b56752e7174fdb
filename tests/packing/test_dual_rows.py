"""The default policy's scores kept row by row (packing/policies/dual_rows.py) are exactly the pass over every
row: the same scores, the same GPU picks, the same placements, through placements, releases, LP re-solves, mix
refreshes and the homes term."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies.frag_dual import VRAMFIT, FragDual
from packing.state import ClusterState


@dataclass
class EveryRow(FragDual):
    """The default computing every row on every score (its own `_rank` turns the row cache off)."""

    def _rank(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray, loss_g: np.ndarray,
              cand: np.ndarray, ref: np.ndarray, cost: np.ndarray) -> np.ndarray:
        return super()._rank(state, pod, feasible_now, loss_g, cand, ref, cost)


# Two GPU sizes (so the reference size and the measure's other GPUs both occur) in pooled and exclusive modes.
GPU_KINDS = [(81920, Mode.TIMESLICE, 4), (81920, Mode.MPS, 4), (40960, Mode.TIMESLICE, 4), (40960, Mode.EXCLUSIVE, 1)]


def cluster(layout: list[list[int]], cpu: list[int]) -> ClusterState:
    nodes = []
    for i, kinds in enumerate(layout):
        gpus = tuple(Gpu(index=j, memory_mib=GPU_KINDS[k][0], mode=GPU_KINDS[k][1], replicas=GPU_KINDS[k][2],
                         product="P80" if GPU_KINDS[k][0] == 81920 else "P40",
                         model="P80" if GPU_KINDS[k][0] == 81920 else "P40")
                     for j, k in enumerate(kinds))
        nodes.append(Node(f"n{i}", gpus, cpu_milli=cpu[i % len(cpu)]))
    return ClusterState(nodes)


def stream(rng: random.Random, n: int) -> list[tuple[PodDemand, int]]:
    """n pods of few shapes (a shape comes back with most of its rows kept; 2-GPU pods outside the learnt mix
    bring the homes term), each with the position of a placed pod to release first (none when out of range)."""
    return [(PodDemand(key=f"{tenant}/p{i}", vram_mib=rng.choice([8192, 20000, 38000]), gpu_count=rng.choice([1, 1, 1, 2]),
                       tenant=tenant, isolation=rng.choice([Isolation.NONE, Isolation.PROCESS]),
                       cpu_milli=rng.choice([2, 8, 20]) * 1000), rng.randint(-8, 6))
            for i, tenant in enumerate(rng.choice("aab") for _ in range(n))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.sampled_from([3, 16, 64]), st.sampled_from([8, 32, 96]))
def test_kept_rows_score_and_place_as_every_row(rng: random.Random, resolve: int, cores: int) -> None:
    settings_ = {**VRAMFIT, "resolve": resolve, "refresh": 32}
    kept, full = FragDual(name="vramfit", **settings_), EveryRow(name="vramfit", **settings_)
    assert kept._by_rows() and not full._by_rows()
    # 14 kinds of node, 6 of each: rows alike share their first stage (`FragDual._alike`, from GROUP_ROWS rows).
    kinds = [[rng.randrange(len(GPU_KINDS)) for _ in range(rng.randint(1, 4))] for _ in range(14)]
    layout = [kinds[i % len(kinds)] for i in range(84)]
    states = cluster(layout, [cores * 1000]), cluster(layout, [cores * 1000])
    placed: list[PodDemand] = []
    for pod, release in stream(rng, 80):
        if 0 <= release < len(placed):
            gone = placed.pop(release)
            for s in states:
                s.release(gone.key)
        answers = []
        for s, policy in zip(states, (kept, full), strict=True):
            scores = policy.score(s, pod, fit.feasible(s, pod).now)
            picks = None if policy._pick is None else policy._pick[2].copy()
            answers.append((scores, picks, schedule_one(s, pod, policy, explain_failures=False).assignment))
        (s1, p1, a1), (s2, p2, a2) = answers
        assert np.array_equal(s1, s2, equal_nan=True)
        assert (p1 is None) == (p2 is None) and (p1 is None or np.array_equal(p1, p2))
        assert a1 == a2
        if a1 is not None:
            placed.append(pod)


def test_a_resolve_that_prices_gaps_alike_keeps_the_kept_rows_and_one_that_does_not_starts_afresh() -> None:
    policy = FragDual(name="vramfit", **{**VRAMFIT, "resolve": 0})
    state = cluster([[0, 0], [0, 2], [2, 3]] * 30, [32000])
    pod = PodDemand(key="a/p", vram_mib=8192, gpu_count=1, tenant="a", cpu_milli=2000)
    for size in (8192, 20000, 8192):  # a mix for the LP
        policy.observe(replace(pod, vram_mib=size))
    now = fit.feasible(state, pod).now
    before = policy.score(state, pod, now)
    kept, sol = policy._dual_rows[pod.shape], policy._dual
    assert sol is not None
    alike = replace(sol, val=sol.val.copy(), price=dict(sol.price))  # a new solve, the same values
    policy._adopt(alike)
    assert policy._dual_rows[pod.shape] is kept and kept.key[1] is alike  # re-keyed, not recomputed
    assert np.array_equal(policy.score(state, pod, now), before) and policy._dual_rows[pod.shape] is kept
    other = replace(sol, val=sol.val * 2)
    policy._adopt(other)
    assert kept.key[1] is alike  # other values: the kept stage no longer fits and is started afresh
    policy.score(state, pod, now)
    assert policy._dual_rows[pod.shape] is not kept and policy._dual_rows[pod.shape].key[1] is other
