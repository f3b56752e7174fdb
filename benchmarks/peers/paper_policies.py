"""The six placement policies of the FGD paper (Weng et al., ATC'23), as scoring functions for the core's
registry (`benchmarks.peers.register` adds them; the core does not ship them).

Exactly as the authors' simulator implements them (shared/reference/fgd-benchmark.md §1.4-1.5): integer
quantised scores, the reversed dot product, min-max normalised BestFit, FGD's sigmoid score, and the GPU
selection rules inside a node (`best`, `random`, FGD's own). The core picks the highest score and breaks
ties to the lowest node index, which the benchmark orders like the simulator's seeded node names.

Units: these policies live in the trace's world of milli-GPU. The benchmark models every trace GPU as a
time-sliced GPU with `memory_mib = 1000`, so `pool_free` is the remaining milli-GPU `r[n, g]` and a pod's
`vram_mib` is its per-GPU milli-GPU `d`. A task is *sharing* iff `gpu_count == 1 and vram_mib < 1000`;
otherwise it takes `gpu_count` fully free GPUs (or none: CPU-only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks.peers.workload_frag import (
    FragMemo,
    SpecKey,
    TargetWorkload,
    row_count,
    row_sum,
    target_workload,
)
from packing.model import Assignment, GpuGrant, PodDemand
from packing.state import ClusterState

MILLI = 1000  # one whole GPU in milli-GPU
MAX_SPEC_CPU = 128000.0  # simulator const.go: normalisers of DotProd / BestFit / GpuClustering
MAX_SPEC_GPU = 8000.0
MAX_SPEC_GPU_INT = 8000
MAX_SCORE = 100

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


# --------------------------------------------------------------------------------------------- helpers
def is_sharing(pod: PodDemand) -> bool:
    return pod.gpu_count == 1 and 0 < pod.vram_mib < MILLI


def spec_key(pod: PodDemand) -> SpecKey:
    """The simulator's typical-pod key of a pod: (cpu, per-GPU milli, GPU count, models)."""
    d = pod.vram_mib if pod.gpu_count > 0 else 0
    return (pod.cpu_milli, d, pod.gpu_count, "|".join(sorted(pod.models or ())))


def gpu_left(state: ClusterState) -> IntArray:
    """[N, G] remaining milli-GPU per GPU slot. The core keeps absent slots at 0 (`_refresh` zeroes the row
    before filling present GPUs), so no masking is needed; tests/benchmarks/test_paper_policies.py checks it."""
    return state.pool_free


def _usable(state: ClusterState, i: int, pod: PodDemand) -> BoolArray:
    """[G] GPUs of node i the pod may use at all (present, allowed model)."""
    kinds_ok = state.allowed_kinds(pod.models)[state.kind[i]]
    return np.asarray(state.present[i] & kinds_ok, dtype=bool)


def best_gpus(state: ClusterState, i: int, pod: PodDemand) -> list[int] | None:
    """GPU selection `best`: sharing -> the fitting GPU with the least remaining (lowest index on ties);
    whole GPUs -> the lowest-index fully free GPUs; CPU-only -> none. Slot numbers (None: no fit)."""
    if pod.gpu_count == 0:
        return []
    r = state.pool_free[i]
    ok = _usable(state, i, pod)
    if is_sharing(pod):
        cand = np.flatnonzero(ok & (r >= pod.vram_mib))
        if cand.size == 0:
            return None
        return [int(cand[np.argmin(r[cand])])]  # argmin returns the first (lowest index) minimum
    free = np.flatnonzero(ok & (r >= MILLI) & (r >= pod.vram_mib))
    if free.size < pod.gpu_count:
        return None
    return [int(x) for x in free[: pod.gpu_count]]


def assignment_for(state: ClusterState, i: int, pod: PodDemand, slots: list[int] | None) -> Assignment | None:
    if slots is None:
        return None
    gpus = state.node_at(i).gpus
    return Assignment(node=state.node_at(i).name,
                      gpus=tuple(GpuGrant(index=gpus[s].index, vram_mib=pod.vram_mib) for s in sorted(slots)))


class PaperPolicy:
    """Plumbing shared by the six: GPU choice `best` unless overridden, no learning from arrivals."""

    name = "paper"
    whole_gpu = False

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        return assignment_for(state, node_index, pod, best_gpus(state, node_index, pod))

    def observe(self, pod: PodDemand) -> None:
        return None


# ---------------------------------------------------------------------------------------------- Random
class PaperRandom(PaperPolicy):
    """Random-fit: one feasible node drawn uniformly scores 100, the rest 0; a random fitting GPU."""

    name = "paper:random"

    def __init__(self, seed: int | None = None, **_: object) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        out = np.zeros(len(state), dtype=np.float64)
        idx = np.flatnonzero(feasible_now)
        if idx.size:
            out[idx[int(self.rng.integers(idx.size))]] = MAX_SCORE
        return out

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        if not is_sharing(pod):
            return super().choose(state, node_index, pod)  # whole GPUs: lowest-index free ones
        r = state.pool_free[node_index]
        cand = np.flatnonzero(_usable(state, node_index, pod) & (r >= pod.vram_mib))
        if cand.size == 0:
            return None
        return assignment_for(state, node_index, pod, [int(cand[int(self.rng.integers(cand.size))])])


# --------------------------------------------------------------------------------------------- DotProd
class PaperDotProd(PaperPolicy):
    """DotProd: prefers the *smallest* dot product of normalised (CPU, GPU) free and request vectors."""

    name = "paper:dotprod"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        cpu = state.cpu_free.astype(np.float64)
        idle = row_sum(gpu_left(state)).astype(np.float64)
        pc = float(pod.cpu_milli) / MAX_SPEC_CPU
        pg = float(pod.gpu_count * (pod.vram_mib if pod.gpu_count else 0)) / MAX_SPEC_GPU
        dot = (cpu / MAX_SPEC_CPU) * pc + (idle / MAX_SPEC_GPU) * pg
        s = np.trunc(MAX_SCORE * (1.0 - dot / 2.0))
        return np.where(state.cpu_free < pod.cpu_milli, 0.0, s)


# --------------------------------------------------------------------------------------- GpuClustering
_SHARE_BIT = 1


def _tag_bit(pod: PodDemand) -> int:
    """0 for CPU-only tasks (they add no tag); one bit for 'share-gpu'; one bit per '<k>-gpu'."""
    if pod.gpu_count == 0:
        return 0
    if is_sharing(pod):
        return _SHARE_BIT
    return 1 << min(pod.gpu_count, 62)


class PaperClustering(PaperPolicy):
    """GpuClustering: pack tasks of the same kind (share / k-GPU) together, fuller nodes first."""

    name = "paper:clustering"

    def __init__(self, **_: object) -> None:
        self._tags = np.zeros(0, dtype=np.int64)
        self._ver = np.zeros(0, dtype=np.int64)

    def node_tags(self, state: ClusterState) -> IntArray:
        """[N] bitmask of the tags of the GPU tasks on each node (cached per node version)."""
        n = len(state)
        if self._tags.shape[0] != n:
            self._tags = np.zeros(n, dtype=np.int64)
            self._ver = np.full(n, -1, dtype=np.int64)
        stale = np.flatnonzero(self._ver != state.version)
        for i in stale:
            mask = 0
            usage = state.usage(state.node_at(int(i)).name)
            for gu in usage.gpus:
                for key in gu.grants:
                    holder = state.holder(key)
                    if holder is not None:
                        mask |= _tag_bit(holder.pod)
            self._tags[i] = mask
        self._ver = state.version.copy()
        return self._tags

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        n = len(state)
        bit = _tag_bit(pod)
        if bit == 0:
            return np.zeros(n, dtype=np.float64)  # CPU-only: 0 everywhere, the tie-break decides
        tags = self.node_tags(state)
        idle = row_sum(gpu_left(state))
        fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU_INT - idle) // MAX_SPEC_GPU_INT  # Go integer arithmetic
        base = np.where(tags == bit, 75, np.where((tags & bit) != 0, 50, np.where(tags == 0, 25, 0)))
        return (base + fill).astype(np.float64)


# ----------------------------------------------------------------------------------------- GpuPacking
class PaperPacking(PaperPolicy):
    """GpuPacking: fill partly used GPUs first, then free GPUs of used nodes, then idle nodes (small first)."""

    name = "paper:packing"

    def __init__(self, **_: object) -> None:
        # (per-GPU milli, count) -> (scores [N], node versions they were computed at): a node's score only
        # changes when the node does, so each step rescores the one node that changed.
        self._cache: dict[tuple[int, int], tuple[IntArray, IntArray]] = {}

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        n = len(state)
        if pod.gpu_count == 0 or pod.vram_mib <= 0:
            return np.zeros(n, dtype=np.float64)
        key = (pod.vram_mib, pod.gpu_count)
        hit = self._cache.get(key)
        if hit is None or hit[0].shape[0] != n:
            hit = (np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
            self._cache[key] = hit
        scores, ver = hit
        stale = np.flatnonzero(ver != state.version)
        if stale.size:
            scores[stale] = packing_scores(state.pool_free[stale], state.present[stale], pod.vram_mib,
                                           pod.gpu_count)
            ver[stale] = state.version[stale]
        return scores.astype(np.float64)


def packing_scores(pool_free: IntArray, present: BoolArray, d: int, k: int) -> IntArray:
    """GpuPacking's score for rows of nodes (remaining milli per GPU slot, slot present)."""
    r = np.where(present, pool_free, -1).astype(np.int64)  # absent slots sort first and never fit
    n_gpus = row_count(present)
    ff = row_count(r == MILLI)
    case3 = np.maximum(MAX_SCORE // 3 - ff, ff)
    rs = np.sort(r, axis=1)  # ascending remaining, as the simulator walks them
    fits = rs >= d
    chosen = fits & (np.cumsum(fits, axis=1) <= k)
    ff_used = row_count(chosen & (rs == MILLI))
    case2 = np.maximum(MAX_SCORE // 2 - ff_used, MAX_SCORE // 3)
    pct = row_sum(np.where(chosen, rs * 100 // MILLI, 0))
    case1 = np.maximum(MAX_SCORE - pct // 10, MAX_SCORE // 2)
    return np.where(ff == n_gpus, case3, np.where(ff_used > 0, case2, case1)).astype(np.int64)


# -------------------------------------------------------------------------------------------- BestFit
class PaperBestFit(PaperPolicy):
    """BestFit: least weighted CPU+GPU left over after placement, min-max normalised to 0..100."""

    name = "paper:bestfit"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        cpu = state.cpu_free.astype(np.float64)
        idle = row_sum(gpu_left(state)).astype(np.float64)
        req_gpu = float(pod.gpu_count * (pod.vram_mib if pod.gpu_count else 0))
        # Same operation order as the simulator, so truncation lands on the same integers.
        left = (cpu - float(pod.cpu_milli)) / MAX_SPEC_CPU * 0.5
        left = left + (idle - req_gpu) / MAX_SPEC_GPU * 0.5
        raw = np.trunc((1.0 - left) * float(MAX_SCORE)).astype(np.int64)
        return normalise_min_max(raw, feasible_now).astype(np.float64)


def normalise_min_max(raw: IntArray, feasible_now: np.ndarray) -> IntArray:
    """The simulator's NormalizeScore over the feasible nodes: (s - min) * 100 // (max - min); all 0 if equal."""
    out = np.zeros_like(raw)
    idx = np.flatnonzero(feasible_now)
    if idx.size == 0:
        return out
    vals = raw[idx]
    lo, hi = int(vals.min()), int(vals.max())
    if hi == lo:
        return out
    out[idx] = (vals - lo) * MAX_SCORE // (hi - lo)
    return out


# ------------------------------------------------------------------------------------------------ FGD
@dataclass
class _SpecScores:
    score: IntArray  # [N] quantised FGD score (valid where ver == state.version)
    gpu: IntArray  # [N] FGD's GPU slot for a sharing task (-1 otherwise)
    ver: IntArray  # [N] node version the entry was computed at


def sigmoid_score(delta_milli: FloatArray) -> IntArray:
    """floor(100 * sigmoid(delta / 1000)), as `int64(sigmoid(x) * 100)` in the simulator."""
    x = np.asarray(delta_milli, dtype=np.float64) / 1000.0
    return np.trunc(1.0 / (1.0 + np.exp(-x)) * float(MAX_SCORE)).astype(np.int64)


class PaperFGD(PaperPolicy):
    """FGD: place where the expected fragmentation of the target workload grows least (node and GPU)."""

    name = "paper:fgd"

    def __init__(self, workload: TargetWorkload | None = None, threshold_pct: float = 95.0, **_: object) -> None:
        self._fixed = workload is not None
        self._wl = workload
        self._threshold = threshold_pct
        self._seen: Counter[SpecKey] = Counter()
        self._seen_at_build = 0
        self._reset_caches()

    # -- workload -------------------------------------------------------------------------------------
    def observe(self, pod: PodDemand) -> None:
        """Without a given workload, learn M from arrivals; rebuilt when arrivals grew by 10 %."""
        if self._fixed:
            return
        self._seen[spec_key(pod)] += 1

    def workload(self) -> TargetWorkload | None:
        if self._fixed:
            return self._wl
        n = sum(self._seen.values())
        if n and (self._wl is None or n >= 1.1 * self._seen_at_build):
            self._wl = target_workload(self._seen.elements(), self._threshold)
            self._seen_at_build = n
            self._reset_caches()
        return self._wl

    def _reset_caches(self) -> None:
        self._specs: dict[SpecKey, _SpecScores] = {}
        self._base = np.zeros(0, dtype=np.int64)
        self._base_ver = np.zeros(0, dtype=np.int64)
        self._acc_id = np.zeros(0, dtype=np.int64)  # per node: id of its GPU model's access row
        self._acc_ver = np.zeros(0, dtype=np.int64)
        self._model_ids: dict[str, int] = {}
        self._memo = (FragMemo(self._wl, np.zeros((0, self._wl.size), dtype=bool))
                      if self._wl is not None else None)

    def _model_id(self, model: str | None, wl: TargetWorkload) -> int:
        key = (model or "").lower()
        mid = self._model_ids.get(key)
        if mid is None:
            assert self._memo is not None
            mid = self._model_ids[key] = len(self._model_ids)
            # Append-only: ids already in memo keys keep meaning the same access row.
            self._memo.access_table = np.vstack([self._memo.access_table, wl.access([key])])
        return mid

    def _frag(self, r: IntArray, cpu: IntArray, acc_id: IntArray) -> IntArray:
        assert self._memo is not None
        return self._memo.rows(r, cpu, acc_id)

    # -- per-node state ---------------------------------------------------------------------------------
    def _sync(self, state: ClusterState, wl: TargetWorkload) -> None:
        """Size caches to the cluster; refresh the per-node access ids and base fragmentation."""
        n = len(state)
        if self._base.shape[0] != n:
            self._reset_caches()
            self._base = np.zeros(n, dtype=np.int64)
            self._base_ver = np.full(n, -1, dtype=np.int64)
            self._acc_id = np.zeros(n, dtype=np.int64)
            self._acc_ver = np.full(n, -1, dtype=np.int64)
        ver = state.version
        stale = np.flatnonzero(self._base_ver != ver)
        if stale.size:
            for i in stale[self._acc_ver[stale] != ver[stale]].tolist():
                gpus = state.node_at(i).gpus
                self._acc_id[i] = self._model_id(gpus[0].model if gpus else None, wl)
                self._acc_ver[i] = ver[i]
            self._base[stale] = self._frag(state.pool_free[stale], state.cpu_free[stale], self._acc_id[stale])
            self._base_ver[stale] = ver[stale]

    def _compute(self, state: ClusterState, pod: PodDemand, wl: TargetWorkload,
                 idx: IntArray) -> tuple[IntArray, IntArray]:
        """Scores and GPU slots of nodes `idx` for this pod (the simulator's calculateGpuShareFragExtendScore)."""
        r = state.pool_free[idx]  # [S, G]; absent slots hold 0
        cpu_after = state.cpu_free[idx] - pod.cpu_milli  # [S]
        acc = self._acc_id[idx]
        base = self._base[idx]
        scale = float(wl.kept)
        if is_sharing(pod):
            d = pod.vram_mib
            ok = (r >= d) & _kinds_ok(state, pod, idx)  # [S, G]
            # F is symmetric in the GPUs, so GPUs with equal remaining capacity give equal hypothetical
            # states; only the lowest index of each value can win the strict '>' scan, so only it is tried.
            g_n = r.shape[1]
            earlier_equal = (r[:, :, None] == r[:, None, :]) & np.tri(g_n, k=-1, dtype=bool)[None, :, :]
            ok &= ~earlier_equal.any(axis=2)
            node_i, gpu_i = np.nonzero(ok)  # only GPUs that can take the task are tried
            hyp = r[node_i].copy()
            hyp[np.arange(node_i.size), gpu_i] -= d
            after = self._frag(hyp, cpu_after[node_i], acc[node_i])
            s = np.full(r.shape, -1, dtype=np.int64)
            s[node_i, gpu_i] = sigmoid_score((base[node_i] - after).astype(np.float64) / scale)
            best = np.argmax(s, axis=1)  # first maximum = lowest index, as the strict '>' scan
            top = s[np.arange(idx.size), best]
            return top, np.where(top >= 0, best, -1)
        hyp = r
        if pod.gpu_count > 0:
            full = (r >= MILLI) & (r >= pod.vram_mib)
            take = full & (np.cumsum(full, axis=1) <= pod.gpu_count)
            hyp = r - np.where(take, pod.vram_mib, 0)
        after = self._frag(hyp, cpu_after, acc)
        s = sigmoid_score((base - after).astype(np.float64) / scale)
        return s, np.full(idx.size, -1, dtype=np.int64)

    def _entry(self, state: ClusterState, pod: PodDemand, wl: TargetWorkload, want: np.ndarray) -> _SpecScores:
        self._sync(state, wl)  # first: a resize resets the spec cache
        key = spec_key(pod)
        n = len(state)
        entry = self._specs.get(key)
        if entry is None or entry.score.shape[0] != n:
            entry = _SpecScores(np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                                np.full(n, -1, dtype=np.int64))
            self._specs[key] = entry
        ver = state.version
        idx = np.flatnonzero(want & (entry.ver != ver))
        if idx.size:
            s, g = self._compute(state, pod, wl, idx)
            entry.score[idx] = s
            entry.gpu[idx] = g
            entry.ver[idx] = ver[idx]
        return entry

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        wl = self.workload()
        if wl is None:
            return np.zeros(len(state), dtype=np.float64)
        return self._entry(state, pod, wl, np.asarray(feasible_now, dtype=bool)).score.astype(np.float64)

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        wl = self.workload()
        if wl is None or not is_sharing(pod):
            return super().choose(state, node_index, pod)  # whole GPUs: lowest-index free ones
        want = np.zeros(len(state), dtype=bool)
        want[node_index] = True
        slot = int(self._entry(state, pod, wl, want).gpu[node_index])
        return assignment_for(state, node_index, pod, None if slot < 0 else [slot])


def _kinds_ok(state: ClusterState, pod: PodDemand, idx: IntArray) -> BoolArray:
    return np.asarray(state.allowed_kinds(pod.models)[state.kind[idx]] & state.present[idx], dtype=bool)


# ------------------------------------------------------------------------------------------- registry
def make_random(seed: int | None = None, **params: object) -> PaperRandom:
    return PaperRandom(seed=seed)


def make_dotprod(**params: object) -> PaperDotProd:
    return PaperDotProd()


def make_clustering(**params: object) -> PaperClustering:
    return PaperClustering()


def make_packing(**params: object) -> PaperPacking:
    return PaperPacking()


def make_bestfit(**params: object) -> PaperBestFit:
    return PaperBestFit()


def make_fgd(workload: TargetWorkload | None = None, threshold_pct: float = 95.0,
              **params: object) -> PaperFGD:
    return PaperFGD(workload=workload, threshold_pct=threshold_pct)


PAPER_POLICIES = ("paper:random", "paper:dotprod", "paper:clustering", "paper:packing", "paper:bestfit",
                  "paper:fgd")
