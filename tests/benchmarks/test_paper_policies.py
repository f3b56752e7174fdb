"""The six FGD-paper policies and the workload fragmentation measure, on hand-built nodes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.peers.paper_policies import (
    PaperFGD,
    best_gpus,
    gpu_left,
    normalise_min_max,
    sigmoid_score,
    spec_key,
)
from benchmarks.peers.workload_frag import (
    FragMemo,
    TargetWorkload,
    frag_case,
    node_frag,
    scaled_frag,
    target_workload,
)
from benchmarks.replay import to_demand, to_node
from benchmarks.trace import TraceNode, TraceTask
from packing import fit
from packing.model import Assignment, GpuGrant, PodDemand
from packing.policies import get_policy, policy_names
from packing.state import ClusterState

_n = 0


def cluster(*nodes: tuple[int, int, str]) -> ClusterState:
    """Nodes as (gpus, cpu_milli, model), named n0, n1, ... in index order."""
    return ClusterState(to_node(f"n{i}", TraceNode(f"n{i}", cpu, 1 << 20, g, model))
                        for i, (g, cpu, model) in enumerate(nodes))


def pod(milli: int, gpus: int = 1, cpu: int = 1000, spec: Sequence[str] = ()) -> PodDemand:
    global _n
    _n += 1
    return to_demand(TraceTask(f"p{_n}", cpu, 100, gpus, milli if gpus else 0, tuple(spec)), f"trace/p{_n}")


def hold(state: ClusterState, node: int, used: Sequence[int], cpu: int = 0) -> None:
    """Take `used[g]` milli on GPU g of node (each by its own pod) and `cpu` milli-CPU."""
    name = state.node_at(node).name
    for g, u in enumerate(used):
        if u:
            p = pod(u, 1, 0)
            state.allocate(p, Assignment(name, (GpuGrant(index=g, vram_mib=u),)))
    if cpu:
        state.allocate(pod(0, 0, cpu), Assignment(name, ()))


def everywhere(state: ClusterState) -> np.ndarray:
    return np.ones(len(state), dtype=bool)


def test_registered() -> None:
    for name in ("paper:random", "paper:dotprod", "paper:clustering", "paper:packing", "paper:bestfit",
                 "paper:fgd"):
        assert name in policy_names()
        assert get_policy(name).name == name


def test_absent_gpu_slots_hold_zero() -> None:
    s = cluster((2, 8000, "T4"), (8, 8000, "G2"))
    assert (gpu_left(s)[0, 2:] == 0).all() and (gpu_left(s)[1] == 1000).all()


# --------------------------------------------------------------------------------------- GPU selection
def test_best_gpu_least_remaining_lowest_index() -> None:
    s = cluster((4, 64000, "G2"))
    hold(s, 0, [600, 300, 300, 0])  # remaining 400, 700, 700, 1000
    assert best_gpus(s, 0, pod(350)) == [0]
    assert best_gpus(s, 0, pod(500)) == [1]  # 700 twice: lowest index
    assert best_gpus(s, 0, pod(1000)) == [3]
    assert best_gpus(s, 0, pod(1000, 2)) is None
    assert best_gpus(s, 0, pod(0, 0)) == []


def test_random_picks_feasible_and_fitting() -> None:
    s = cluster((2, 8000, "T4"), (2, 8000, "T4"), (2, 8000, "T4"))
    pol = get_policy("paper:random", seed=7)
    mask = np.array([False, True, True])
    for _ in range(20):
        sc = pol.score(s, pod(500), mask)
        assert sorted(sc.tolist()) == [0, 0, 100] and sc[0] == 0
    hold(s, 1, [800, 0])
    for _ in range(10):
        a = pol.choose(s, 1, pod(500))
        assert a is not None and a.gpus[0].index == 1  # only GPU 1 has 500 left
    a = get_policy("paper:random", seed=1).choose(s, 1, pod(1000))
    assert a is not None and a.gpus[0].index == 1


# --------------------------------------------------------------------------------------------- DotProd
def test_dotprod_prefers_smallest_dot_product() -> None:
    s = cluster((8, 96000, "G2"), (2, 16000, "T4"))
    p = pod(500, 1, 4000)
    sc = get_policy("paper:dotprod").score(s, p, everywhere(s))
    dot0 = 96000 / 128000 * 4000 / 128000 + 8000 / 8000 * 500 / 8000
    dot1 = 16000 / 128000 * 4000 / 128000 + 2000 / 8000 * 500 / 8000
    assert sc.tolist() == [math.floor(100 * (1 - dot0 / 2)), math.floor(100 * (1 - dot1 / 2))]
    assert sc[1] >= sc[0]  # the emptier-looking big node has the larger dot product: lower score


# ---------------------------------------------------------------------------------------- GpuClustering
def test_clustering_bases_and_fill() -> None:
    s = cluster((8, 96000, "G2"), (8, 96000, "G2"), (8, 96000, "G2"), (8, 96000, "G2"))
    pol = get_policy("paper:clustering")
    s.allocate(pod(300), Assignment("n0", (GpuGrant(0, 300),)))  # share only
    s.allocate(pod(300), Assignment("n1", (GpuGrant(0, 300),)))
    s.allocate(pod(1000), Assignment("n1", (GpuGrant(1, 1000),)))  # share + 1-gpu
    s.allocate(pod(1000, 2), Assignment("n2", (GpuGrant(0, 1000), GpuGrant(1, 1000))))  # 2-gpu only
    s.allocate(pod(0, 0, 5000), Assignment("n3", ()))  # CPU-only adds no tag: n3 counts as empty
    sc = pol.score(s, pod(200), everywhere(s))
    fill = [25 * (8000 - idle) // 8000 for idle in (7700, 6700, 6000, 8000)]
    assert sc.tolist() == [75 + fill[0], 50 + fill[1], 0 + fill[2], 25 + fill[3]]
    assert pol.score(s, pod(0, 0), everywhere(s)).tolist() == [0, 0, 0, 0]


# ------------------------------------------------------------------------------------------ GpuPacking
def test_packing_cases() -> None:
    s = cluster((8, 96000, "G2"), (2, 96000, "T4"), (4, 96000, "G2"), (4, 96000, "G2"))
    hold(s, 2, [700, 0, 0, 0])  # one shared GPU with 300 left
    hold(s, 3, [200, 0, 0, 0])  # one shared GPU with 800 left
    pol = get_policy("paper:packing")
    sc = pol.score(s, pod(250), everywhere(s))
    # idle nodes: case 3, max(33 - free, free); used nodes: case 1 on the shared GPU, fuller scores higher
    assert sc.tolist() == [25, 31, max(100 - (300 * 100 // 1000) // 10, 50), max(100 - (800 * 100 // 1000) // 10, 50)]
    sc = pol.score(s, pod(900), everywhere(s))  # must take a free GPU on the used nodes: case 2
    assert sc[2] == sc[3] == 49
    assert pol.score(s, pod(1000, 3), everywhere(s))[2] == 47
    assert pol.score(s, pod(0, 0), everywhere(s)).tolist() == [0, 0, 0, 0]


# --------------------------------------------------------------------------------------------- BestFit
def test_bestfit_raw_and_min_max() -> None:
    s = cluster((8, 96000, "G2"), (2, 16000, "T4"), (2, 16000, "T4"))
    p = pod(500, 1, 4000)
    raw = [math.floor(100 * (1 - ((c - 4000) / 128000 * 0.5 + (g - 500) / 8000 * 0.5)))
           for c, g in ((96000, 8000), (16000, 2000), (16000, 2000))]
    lo, hi = min(raw), max(raw)
    sc = get_policy("paper:bestfit").score(s, p, everywhere(s))
    assert sc.tolist() == [(r - lo) * 100 // (hi - lo) for r in raw]
    assert sc[1] == sc[2] == 100  # tie: the core takes the lowest index (n1)
    assert normalise_min_max(np.array([5, 5, 9]), np.array([True, True, False])).tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------------- fragmentation cases
WL = target_workload([(4000, 0, 0, "")] * 2 + [(2000, 500, 1, "")] * 3 + [(8000, 1000, 2, "")] * 4
                     + [(1000, 300, 1, "T4")] * 1)


def test_frag_cases() -> None:
    r = [1000, 400, 0, 0]
    assert frag_case(r, 5000, "G2", 4000, 0, 0) == "XL"
    assert frag_case(r, 3000, "G2", 4000, 0, 0) == "XR"
    assert frag_case(r, 5000, "G2", 1000, 300, 1, frozenset({"t4"})) == "NA"
    assert frag_case(r, 5000, "G2", 2000, 500, 1) == "Q3"
    assert frag_case(r, 1000, "G2", 2000, 500, 1) == "Q4"
    assert frag_case(r, 9000, "G2", 8000, 1000, 2) == "Q2"
    assert frag_case(r, 1000, "G2", 8000, 1000, 2) == "Q1"


def test_frag_amounts_per_case() -> None:
    r = np.array([[1000, 400, 0, 0]])
    idle = 1400
    acc = WL.access(["G2"])
    f = int(scaled_frag(r, np.array([5000]), acc, WL)[0])
    # XL (CPU-only): idle; Q3 for 500m: only the 400 GPU; Q2 for 2x1000: idle; NA for the T4 spec: idle
    assert f == 2 * idle + 3 * 400 + 4 * idle + 1 * idle
    assert node_frag(r, np.array([5000]), acc, WL)[0] == pytest.approx(f / WL.kept)
    f_low_cpu = int(scaled_frag(r, np.array([1000]), acc, WL)[0])  # Q4 for 500m: now all idle counts
    assert f_low_cpu == 2 * idle + 3 * idle + 4 * idle + 1 * idle
    assert int(scaled_frag(np.zeros((1, 4), dtype=np.int64), np.array([0]), acc, WL)[0]) == 0  # full node
    t4 = int(scaled_frag(r, np.array([5000]), WL.access(["T4"]), WL)[0])
    assert t4 == f - 1 * idle + 1 * 0  # on a T4 node the 300m spec fits both GPUs: no fragment


def test_target_workload_cut_and_ties() -> None:
    specs = [(1, 100, 1, "")] * 50 + [(2, 100, 1, "")] * 30 + [(3, 100, 1, "")] * 10 + [(9, 100, 1, "")] * 5 \
        + [(8, 100, 1, "")] * 5
    wl = target_workload(specs, 95.0)
    # 50 + 30 + 10 = 90 < 95: one more spec; the tie at 5 goes to the larger key (Go's sort.Reverse)
    assert wl.keys() == [(1, 100, 1, ""), (2, 100, 1, ""), (3, 100, 1, ""), (9, 100, 1, "")]
    assert wl.kept == 95 and wl.total == 100
    assert wl.prob.sum() == pytest.approx(1.0)


def test_default_trace_target_workload() -> None:
    from benchmarks.replay import workload_of
    from benchmarks.trace import DEFAULT_PODS_CSV, load_tasks

    wl = workload_of(load_tasks(DEFAULT_PODS_CSV))
    assert wl.size == 35 and round(100 * wl.kept / wl.total, 2) == 95.26  # the simulator's log
    assert wl.keys()[0] == (3152, 810, 1, "")  # "3.15 CPU" in the log and round(100 * int(wl.weight[0]) / wl.total, 2) == 12.84
    assert wl.keys()[1][1:] == (1000, 1, "") and round(wl.keys()[1][0], -2) == 11300
    assert int((wl.count > 1).sum()) == 0 and int((wl.milli == 0).sum()) == 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 100, 250, 300, 500, 700, 1000]), min_size=4, max_size=4),
                min_size=1, max_size=30),
       st.lists(st.integers(0, 10000), min_size=30, max_size=30), st.lists(st.booleans(), min_size=30, max_size=30))
def test_memo_equals_direct(rows: list[list[int]], cpus: list[int], t4: list[bool]) -> None:
    ids, table = WL.access_ids(["G2", "T4"])
    n = len(rows)
    r = np.array(rows, dtype=np.int64)
    cpu = np.array(cpus[:n], dtype=np.int64)
    acc_id = np.array([1 if x else 0 for x in t4[:n]], dtype=np.int64)
    memo = FragMemo(WL, table)
    direct = scaled_frag(r, cpu, table[acc_id], WL)
    assert memo.rows(r, cpu, acc_id).tolist() == direct.tolist()
    assert memo.rows(r[::-1], cpu[::-1], acc_id[::-1]).tolist() == direct[::-1].tolist()  # from the memo now
    # permutation-invariant in the GPUs
    assert scaled_frag(r[:, ::-1], cpu, table[acc_id], WL).tolist() == direct.tolist()


# ------------------------------------------------------------------------------------------------- FGD
def expected_fgd(state: ClusterState, wl: TargetWorkload, node: int, p: PodDemand) -> tuple[int, int]:
    """Reference FGD score by the definition, in plain Python on one node: (score, GPU)."""
    model = state.node_at(node).gpus[0].model
    r = gpu_left(state)[node].tolist()
    cpu = int(state.cpu_free[node])

    def frag(rr: list[int], c: int) -> float:
        total = 0.0
        for cp, d, k, models, w in zip(wl.cpu, wl.milli, wl.count, wl.models, wl.prob, strict=True):
            case = frag_case(rr, c, model, int(cp), int(d), int(k), models)
            total += w * (sum(x for x in rr if x < d) if case == "Q3" else sum(rr))
        return total

    before = frag(r, cpu)
    if p.gpu_count == 1 and p.vram_mib < 1000:
        best, gpu = -1, -1
        for g, x in enumerate(r):
            if x >= p.vram_mib:
                after = list(r)
                after[g] -= p.vram_mib
                sc = int(100 / (1 + math.exp(-(before - frag(after, cpu - p.cpu_milli)) / 1000)))
                if gpu == -1 or sc > best:
                    best, gpu = sc, g
        return best, gpu
    after = list(r)
    need = p.gpu_count
    for g, x in enumerate(r):
        if need and x == 1000:
            after[g] = 0
            need -= 1
    return int(100 / (1 + math.exp(-(before - frag(after, cpu - p.cpu_milli)) / 1000))), -1


def test_sigmoid_quantisation() -> None:
    assert sigmoid_score(np.array([0.0, 40.0, 41.0, -41.0, 5000.0, -5000.0])).tolist() == [50, 50, 51, 48, 99, 0]


def test_fgd_matches_definition_and_picks_gpu() -> None:
    s = cluster((4, 32000, "G2"), (2, 16000, "T4"), (8, 96000, "G2"), (4, 6000, "G2"))
    hold(s, 0, [700, 500, 0, 0], cpu=4000)
    hold(s, 1, [100, 0])
    hold(s, 3, [0, 0, 900, 0])
    pol = PaperFGD(workload=WL)
    for p in (pod(300), pod(500, 1, 2000), pod(1000), pod(1000, 2), pod(0, 0, 3000), pod(300, 1, 1000, ["T4"])):
        mask = fit.feasible(s, p).now
        sc = pol.score(s, p, mask)
        for i in np.flatnonzero(mask).tolist():
            want, gpu = expected_fgd(s, WL, i, p)
            assert sc[i] == want, (p, i)
            if gpu >= 0:
                a = pol.choose(s, i, p)
                assert a is not None and a.gpus[0].index == gpu


def test_fgd_cache_follows_node_versions() -> None:
    s = cluster((4, 32000, "G2"), (4, 32000, "G2"))
    pol = PaperFGD(workload=WL)
    p = pod(300)
    first = pol.score(s, p, everywhere(s)).tolist()
    assert first[0] == first[1]
    hold(s, 1, [800, 0, 0, 0])
    second = pol.score(s, pod(300), everywhere(s))
    assert second[1] == expected_fgd(s, WL, 1, p)[0] and second[0] == first[0]


def test_fgd_learns_workload_from_arrivals() -> None:
    s = cluster((2, 32000, "G2"))
    pol = get_policy("paper:fgd")
    assert pol.score(s, pod(300), everywhere(s)).tolist() == [0.0]  # nothing observed yet
    for _ in range(5):
        pol.observe(pod(300))
    assert pol.score(s, pod(300), everywhere(s)).tolist() != [0.0]
    fixed = PaperFGD(workload=WL)
    fixed.observe(pod(700))  # a given workload is never replaced by observations
    assert fixed.workload() is WL
    assert spec_key(pod(300, 1, 1000, ["T4", "G2"])) == (1000, 300, 1, "g2|t4")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from([100, 300, 500, 1000]),
                          st.sampled_from([1, 2]), st.sampled_from(["paper:packing", "paper:clustering",
                                                                    "paper:fgd"])),
                min_size=1, max_size=25))
def test_cached_scores_equal_fresh_policy(steps: list[tuple[int, int, int, int, str]]) -> None:
    """Policies that cache per node version score exactly like a fresh instance after any placements."""
    s = cluster((4, 64000, "G2"), (2, 16000, "T4"), (8, 96000, "G2"), (1, 8000, "T4"))
    kept = {name: get_policy(name, workload=WL) for name in ("paper:packing", "paper:clustering", "paper:fgd")}
    for node, _, milli, count, name in steps:
        p = pod(milli, count if milli == 1000 else 1)
        mask = fit.feasible(s, p).now
        fresh = get_policy(name, workload=WL).score(s, p, mask)
        assert kept[name].score(s, p, mask)[mask].tolist() == fresh[mask].tolist()
        a = kept[name].choose(s, node, p) if mask[node] else None
        if a is not None:
            s.allocate(p, a)
