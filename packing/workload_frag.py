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


def scaled_frag(gpu_left: IntArray, cpu_left: IntArray, access: BoolArray, wl: TargetWorkload) -> IntArray:
    """kept * F_n(M) for every row: gpu_left [..., G] (absent GPUs = 0), cpu_left [...], access [..., M].

    Leading dimensions broadcast, so hypothetical states (e.g. [N, G, G] for "t placed on GPU g") go
    through the same code as the real ones.
    """
    r = np.asarray(gpu_left, dtype=np.int64)
    idle = r.sum(axis=-1)  # [...]
    d = wl.milli  # [M]
    fits_gpu = r[..., None, :] >= d[:, None]  # [..., M, G]
    n_fit = fits_gpu.sum(axis=-1)  # [..., M]
    small = np.where(fits_gpu, 0, r[..., None, :]).sum(axis=-1)  # [..., M] GPUs too small for one unit
    satisfied = ((d > 0) & access & (n_fit >= wl.count)
                 & (np.asarray(cpu_left, dtype=np.int64)[..., None] >= wl.cpu))
    frag = np.where(satisfied, small, idle[..., None])  # [..., M]
    return frag @ wl.weight


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
    """Memoised `scaled_frag` per node state.

    F_n(M) depends only on the multiset of remaining GPU capacities, the free CPU and the node's access
    row, and replays revisit the same few thousand node states again and again. A dict lookup costs about a
    microsecond where a numpy call on one row costs a hundred; misses are computed in one vectorised batch.
    """

    def __init__(self, wl: TargetWorkload, max_entries: int = 2_000_000) -> None:
        self.wl = wl
        self.max_entries = max_entries
        self._memo: dict[tuple[bytes, int], int] = {}

    def rows(self, gpu_left: IntArray, cpu_left: IntArray, access: BoolArray) -> IntArray:
        """kept * F for each row of gpu_left [R, G] (absent = 0), cpu_left [R], access [R, M]."""
        r = np.asarray(gpu_left, dtype=np.int64)
        cpu = np.asarray(cpu_left, dtype=np.int64)
        acc = np.asarray(access, dtype=bool)
        n = r.shape[0]
        # One key per row: sorted capacities + access bits (bytes), and the free CPU.
        blob = np.concatenate([np.sort(r, axis=1).view(np.uint8).reshape(n, -1),
                               acc.view(np.uint8).reshape(n, -1)], axis=1)
        keys = [(blob[i].tobytes(), int(cpu[i])) for i in range(n)]
        out = np.empty(n, dtype=np.int64)
        miss: list[int] = []
        memo = self._memo
        for i, k in enumerate(keys):
            v = memo.get(k)
            if v is None:
                miss.append(i)
            else:
                out[i] = v
        if miss:
            m = np.asarray(miss, dtype=np.int64)
            vals = scaled_frag(r[m], cpu[m], acc[m], self.wl)
            out[m] = vals
            if len(memo) + len(miss) > self.max_entries:
                memo.clear()
            for i, v in zip(miss, vals.tolist(), strict=True):
                memo[keys[i]] = v
        return out
