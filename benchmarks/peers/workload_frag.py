"""Fragmentation of nodes with respect to a target workload (the FGD paper's measure), as pure numpy.

Definitions (shared/reference/fgd-benchmark.md §1.2-1.3): a node n with per-GPU remaining capacity r[n, g]
(milli-GPU, 0..1000; absent GPU slots are 0), free CPU cpu_left[n] and GPU model type(n) has, for one task
type m = (c_m, d_m, k_m, T_m), the fragment

    f_n(m) = idle(n)                        if d_m == 0 (XL / XR: a CPU-only task uses no GPU)
           = idle(n)                        if T_m is non-empty and type(n) not in T_m (NA)
           = sum_{g: r[n,g] < d_m} r[n,g]   if >= k_m GPUs have r >= d_m and cpu_left >= c_m (Q3)
           = idle(n)                        otherwise (Q1 / Q2 / Q4)

and F_n(M) = sum_m p_m f_n(m). The benchmark metrics and the `paper:fgd` policy both call these functions, so
the measure and the policy can never drift apart.

Exactness: p_m = count_m / kept, so `kept * F_n(M) = sum_m count_m f_n(m)` is an integer. We compute that
integer ("scaled frag", int64) and divide once. FGD's score quantises sigmoid(delta / 1000) to an integer,
and delta == 0 (a placement that leaves fragmentation unchanged) must give exactly 50, never 49 through
rounding noise.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

# A spec key as the simulator forms it: (cpu milli, per-GPU milli, GPU count, "|"-joined allowed models).
SpecKey = tuple[int, int, int, str]


@dataclass(frozen=True)
class TargetWorkload:
    """The target workload M: the most popular task specs with their (integer) popularity counts."""

    cpu: IntArray  # [M] milli-CPU
    milli: IntArray  # [M] per-GPU milli-GPU (0 = CPU-only)
    count: IntArray  # [M] GPUs per task
    models: tuple[frozenset[str], ...]  # [M] allowed GPU models, lower-case; empty = any
    weight: IntArray  # [M] number of pods with this spec (popularity numerator)
    kept: int  # sum of weight: the popularity denominator (p_m = weight / kept)
    total: int  # pods counted before the cut (kept / total = share of pods covered)

    @property
    def size(self) -> int:
        return int(self.cpu.shape[0])

    @property
    def prob(self) -> FloatArray:
        return self.weight.astype(np.float64) / float(self.kept)

    def keys(self) -> list[SpecKey]:
        return [(int(c), int(d), int(k), "|".join(sorted(t))) for c, d, k, t in
                zip(self.cpu, self.milli, self.count, self.models, strict=True)]

    def access_ids(self, node_models: Sequence[str | None]) -> tuple[IntArray, BoolArray]:
        """(id [N], table [U, M]): node n's access row is table[id[n]]; one row per distinct model."""
        names = sorted({(m or "").lower() for m in node_models})
        pos = {m: i for i, m in enumerate(names)}
        ids = np.array([pos[(m or "").lower()] for m in node_models], dtype=np.int64)
        return ids, self.access(names)

    def access(self, node_models: Sequence[str | None]) -> BoolArray:
        """[N, M] True where spec m may run on node n's GPU model (the NA case is the False entries)."""
        out = np.ones((len(node_models), self.size), dtype=bool)
        for j, allowed in enumerate(self.models):
            if allowed:
                out[:, j] = [(m or "").lower() in allowed for m in node_models]
        return out


def _models_of(type_str: str) -> frozenset[str]:
    return frozenset(s.strip().lower() for s in type_str.split("|") if s.strip())


def target_workload(specs: Iterable[SpecKey], threshold_pct: float = 95.0, step: int = 1) -> TargetWorkload:
    """Build M from the original workload's spec keys, as the simulator's `GetTypicalPods` does.

    Counts pods per key (every pod weighs 1, CPU-only pods included), sorts by count descending with ties
    broken by the reverse of (cpu, milli, count, type) order (Go's `sort.Reverse` of the ascending `Less`),
    and keeps the shortest prefix, grown `step` specs at a time, whose cumulative count reaches
    `threshold_pct` % of all pods.
    """
    counts: Counter[SpecKey] = Counter(specs)
    if not counts:
        raise ValueError("empty workload: no specs to build a target workload from")
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    expected = threshold_pct * total / 100.0
    kept_n, cum = 0, 0
    while cum < expected and kept_n < len(ordered):
        upto = min(kept_n + step, len(ordered))
        while kept_n < upto:
            cum += ordered[kept_n][1]
            kept_n += 1
    chosen = ordered[:kept_n]
    return TargetWorkload(
        cpu=np.array([k[0] for k, _ in chosen], dtype=np.int64),
        milli=np.array([k[1] for k, _ in chosen], dtype=np.int64),
        count=np.array([k[2] for k, _ in chosen], dtype=np.int64),
        models=tuple(_models_of(k[3]) for k, _ in chosen),
        weight=np.array([c for _, c in chosen], dtype=np.int64),
        kept=int(cum),
        total=int(total),
    )


def row_sum(a: npt.NDArray[np.int64]) -> IntArray:
    """Sum over the last axis. einsum: numpy's reduce is slow on short rows (8 GPU slots)."""
    return np.einsum("...g->...", np.asarray(a, dtype=np.int64))


def row_count(ok: BoolArray) -> IntArray:
    """Number of True per row of an [..., G] bool array; for G == 8 a popcount of the row's 8 bytes."""
    ok = np.ascontiguousarray(ok, dtype=bool)
    if ok.shape[-1] == 8:
        return np.bitwise_count(ok.view(np.uint64)[..., 0]).astype(np.int64)
    return np.einsum("...g->...", ok.astype(np.int64))


def scaled_frag(gpu_left: IntArray, cpu_left: IntArray, access: BoolArray, wl: TargetWorkload) -> IntArray:
    """kept * F_n(M) for every row: gpu_left [..., G] (absent GPUs = 0), cpu_left [...], access [..., M].

    Leading dimensions broadcast, so hypothetical states (e.g. [N, G, G] for "t placed on GPU g") go
    through the same code as the real ones.
    """
    r = np.asarray(gpu_left, dtype=np.int64)
    lead = r.shape[:-1]
    g = r.shape[-1]
    r2 = r.reshape(-1, g)
    rows = r2.shape[0]
    cpu = np.broadcast_to(np.asarray(cpu_left, dtype=np.int64), lead).reshape(rows)
    acc = np.broadcast_to(np.asarray(access, dtype=bool), (*lead, wl.size)).reshape(rows, wl.size)
    idle = row_sum(r2)  # [R]
    fits_gpu = r2[:, None, :] >= wl.milli[None, :, None]  # [R, M, G]
    n_fit = row_count(fits_gpu)  # [R, M]
    small = idle[:, None] - np.einsum("rmg,rg->rm", fits_gpu, r2)  # GPUs too small for one unit of m
    satisfied = (wl.milli > 0) & acc & (n_fit >= wl.count) & (cpu[:, None] >= wl.cpu)
    frag = np.where(satisfied, small, idle[:, None])  # [R, M]
    return (frag @ wl.weight).reshape(lead)


def node_frag(gpu_left: IntArray, cpu_left: IntArray, access: BoolArray, wl: TargetWorkload) -> FloatArray:
    """F_n(M) in milli-GPU for every row (see `scaled_frag`)."""
    return scaled_frag(gpu_left, cpu_left, access, wl).astype(np.float64) / float(wl.kept)


def frag_case(gpu_left: Sequence[int], cpu_left: int, node_model: str | None, cpu: int, milli: int, count: int,
              models: frozenset[str] = frozenset()) -> str:
    """The simulator's case name for one (node, task type) pair: XL, XR, NA, Q1, Q2, Q3 or Q4 (for tests and
    explanations; the vectorised functions above are what scoring uses)."""
    if milli == 0:
        return "XL" if cpu_left >= cpu else "XR"
    if models and (node_model or "").lower() not in models:
        return "NA"
    gpu_ok = sum(1 for r in gpu_left if r >= milli) >= count
    cpu_ok = cpu_left >= cpu
    if gpu_ok:
        return "Q3" if cpu_ok else "Q4"
    return "Q2" if cpu_ok else "Q1"


class FragMemo:
    """Memoised `scaled_frag` per node state, for one target workload and one table of access rows.

    F_n(M) depends only on the multiset of remaining GPU capacities, on which of M's CPU thresholds the
    free CPU clears, and on the node's access row; replays revisit the same node states again and again.
    A dict lookup costs about a microsecond where a numpy pass over one row costs tens; misses are computed
    in one vectorised batch.
    """

    def __init__(self, wl: TargetWorkload, access_table: BoolArray, max_entries: int = 2_000_000) -> None:
        self.wl = wl
        self.access_table = np.asarray(access_table, dtype=bool)  # [U, M]: access row per id
        self.max_entries = max_entries
        self._cpu_steps = np.unique(wl.cpu)  # F only sees `cpu_left >= c_m` for these thresholds
        self.cpu_steps: list[int] = self._cpu_steps.tolist()
        self._memo: dict[tuple[int, ...], int] = {}

    def rows(self, gpu_left: IntArray, cpu_left: IntArray, access_id: IntArray) -> IntArray:
        """kept * F for each row: gpu_left [R, G] (absent = 0), cpu_left [R], access_id [R] (into the table)."""
        r = np.asarray(gpu_left, dtype=np.int64)
        n = r.shape[0]
        cpu = np.asarray(cpu_left, dtype=np.int64)
        ids = np.asarray(access_id, dtype=np.int64)
        steps = self.cpu_steps
        if n <= 16:  # plain Python beats numpy's per-call overhead on a few rows
            rl, cl, il = r.tolist(), cpu.tolist(), ids.tolist()
            keys = [(*sorted(rl[i]), bisect_right(steps, cl[i]), il[i]) for i in range(n)]
        else:
            key = np.empty((n, r.shape[1] + 2), dtype=np.int64)
            key[:, :-2] = np.sort(r, axis=1)
            key[:, -2] = np.searchsorted(self._cpu_steps, cpu, side="right")
            key[:, -1] = ids
            keys = [tuple(k) for k in key.tolist()]
        memo = self._memo
        got = [memo.get(k) for k in keys]
        miss = [i for i, v in enumerate(got) if v is None]
        if miss:
            m = np.asarray(miss, dtype=np.int64)
            vals = scaled_frag(r[m], cpu[m], self.access_table[ids[m]], self.wl).tolist()
            if len(memo) + len(miss) > self.max_entries:
                memo.clear()
            for i, v in zip(miss, vals, strict=True):
                memo[keys[i]] = v
                got[i] = v
        return np.asarray(got, dtype=np.int64)
