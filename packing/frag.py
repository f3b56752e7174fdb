"""vramfit's placement policy: place each pod where it costs the workload mix the least usable VRAM.

The measure (FGD's fragmentation, Weng et al. ATC'23, generalised to VRAM units and trust rules). For a
workload mix M of pod shapes m (per-GPU VRAM v_m, GPU count k_m, isolation, tenant, allowed models, CPU)
with weights w_m (sum 1), a node n offers shape m

    usable_n(m) = sum over GPUs g that m may use (mode allowed by its isolation, model allowed, shared GPU
                  not owned by another tenant) of the free VRAM of g that sits in units >= v_m
                  (the free pool of a time-sliced / pinned-MPS GPU, the free MPS shares, the free MIG
                  instances that are big enough, an idle exclusive GPU)

counted only when the node can host m at all (>= k_m such GPUs and enough free CPU). Everything else that
is free is fragment for m: MIG instances or MPS shares too small, a GPU shared by another tenant, a mode m's
isolation forbids, a model m may not use, GPUs whose node lacks CPU. FGD's node fragmentation is
F_n = W * free_n - sum_m w_m usable_n(m); stranded VRAM (a grant bigger than the pod, e.g. a whole GPU)
adds to it. Placing pod t frees nothing and takes t's VRAM, so the change of F + stranded VRAM is
-W * v_t * k_t (the same on every node) plus the *loss*

    loss_n = sum_m w_m (usable_n(m) - usable_n'(m))   (n' = n with t placed on the chosen units)

The policy places t where the loss is smallest, exactly (FGD quantises it through a sigmoid into ~100
levels, so many nodes tie and a random node order decides), and chooses the units inside the node by the
same loss (node and unit choice in one step); remaining ties go to cluster order.

Second measure ('units'): FGD counts a GPU as wholly usable by m as soon as one pod of m fits, and a node
as usable as soon as its CPU takes one pod. 'units' values what the node can really still take:
`min(pods of m its GPUs hold, free CPU // cpu_m) * v_m * k_m` (a pooled GPU holds free // v_m pods, capped by
free replicas; an MPS share, MIG instance or idle exclusive GPU holds one). It sees CPU running out
before the GPUs do, and the slack of a GPU no multiple of v_m fills. The default, 'both', scores each
shape under both measures with half its weight: on the Alibaba trace it beats either measure alone
(benchmarks/POLICY_NOTES.md has every variant and its figure).

The mix is learned online from `observe` and/or given as a parameter (the trace benchmark passes FGD's
target workload).

Everything is vectorised over the state's [N, G] views; per pod shape the per-node result is cached by
node version, so one placement re-scores only the node it changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from packing import fit
from packing.model import (
    ALLOWED_MODES,
    SHARED_FAILURE_MODES,
    Assignment,
    GpuGrant,
    Isolation,
    Mode,
    PodDemand,
)
from packing.policies import BasePolicy, register_policy
from packing.state import MODE_CODE, ClusterState

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

_MODE_ORDER = sorted(MODE_CODE, key=MODE_CODE.__getitem__)
_SHARED = np.array([m in SHARED_FAILURE_MODES for m in _MODE_ORDER] + [False])
_EXCL, _MIG, _MPS = MODE_CODE[Mode.EXCLUSIVE], MODE_CODE[Mode.MIG], MODE_CODE[Mode.MPS]
# mode code -> allowed, per isolation; the extra last entry (mode -1) is "no GPU here".
_MODE_OK: dict[Isolation, B] = {
    iso: np.array([m in modes for m in _MODE_ORDER] + [False]) for iso, modes in ALLOWED_MODES.items()
}
_ROUND = 1e6  # losses are rounded to 1e-6 so that float noise never breaks a genuine tie


def _view(state: ClusterState, name: str) -> Any:
    """One of the state's numpy views (they are set as properties at import, so mypy cannot see them)."""
    return getattr(state, name)


@dataclass(frozen=True)
class Shape:
    """One pod shape of the workload mix (what decides where a pod can go, minus its identity)."""

    vram_mib: int
    gpu_count: int = 1
    isolation: Isolation = Isolation.NONE
    tenant: str | None = "default"  # None: whichever tenant asks (a single-tenant mix, e.g. a trace)
    models: frozenset[str] | None = None
    cpu_milli: int = 0

    @staticmethod
    def of(pod: PodDemand) -> Shape:
        return Shape(pod.vram_mib, pod.gpu_count, pod.isolation, pod.tenant, pod.models, pod.cpu_milli)


def shape_weight(shape: Shape, weighting: str) -> float:
    """Weight of one pod of this shape: 'count' (FGD's popularity) or 'mass' (the VRAM it asks for)."""
    if weighting == "count":
        return 1.0
    if weighting == "mass":
        return float(shape.vram_mib * shape.gpu_count)
    raise ValueError(f"unknown weighting {weighting!r}; use 'count' or 'mass'")


def top_mix(counts: Counter[Shape], weighting: str = "count", coverage: float = 0.95,
            max_types: int = 64) -> list[tuple[Shape, float]]:
    """The most popular GPU shapes covering `coverage` of the weight (FGD keeps 95 %), weights summing to 1.

    CPU-only shapes are left out: they can use no GPU, so they never change a loss.
    """
    weighted = [(s, c * shape_weight(s, weighting)) for s, c in counts.items() if s.gpu_count > 0]
    weighted = [(s, w) for s, w in weighted if w > 0]
    if not weighted:
        return []
    weighted.sort(key=lambda sw: (-sw[1], sw[0].vram_mib, sw[0].gpu_count, sw[0].cpu_milli, sw[0].tenant or ""))
    total = sum(w for _, w in weighted)
    kept: list[tuple[Shape, float]] = []
    cum = 0.0
    for s, w in weighted:
        if cum >= coverage * total or len(kept) >= max_types:
            break
        kept.append((s, w))
        cum += w
    return [(s, w / cum) for s, w in kept]


@dataclass
class MixArrays:
    """The mix as arrays, resolved against one state's tenant and GPU-kind ids."""

    shapes: tuple[Shape, ...]
    vram: I64  # [M]
    count: I64  # [M]
    cpu: I64  # [M]
    weight: F64  # [M], sums to 1
    mode_ok: B  # [5, M] mode code (+ -1) -> shape may use it
    tenant_id: I64  # [M] state tenant ids (-2: tenant unknown to the state, -3: any tenant)
    kind_ok: B  # [K + 1, M] GPU kind id (+ -1) -> shape may use it
    units: B  # [M] this entry is valued by the 'units' measure (else by FGD's usable VRAM)

    @property
    def size(self) -> int:
        return len(self.shapes)

    @staticmethod
    def build(mix: Sequence[tuple[Shape, float]], state: ClusterState, measure: str = "fgd") -> MixArrays:
        if measure not in ("fgd", "units", "both"):
            raise ValueError(f"unknown measure {measure!r}; use 'fgd', 'units' or 'both'")
        flags = [measure == "units"] * len(mix)
        if measure == "both":  # each shape twice, half the weight under each measure
            mix = [(s, w / 2) for s, w in mix] * 2
            flags = [False] * (len(mix) // 2) + [True] * (len(mix) // 2)
        shapes = tuple(s for s, _ in mix)
        kinds = [state.allowed_kinds(s.models) for s in shapes]
        k = len(state.allowed_kinds(None))
        return MixArrays(
            shapes=shapes,
            vram=np.array([s.vram_mib for s in shapes], dtype=np.int64),
            count=np.array([s.gpu_count for s in shapes], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
            weight=np.array([w for _, w in mix], dtype=np.float64),
            mode_ok=np.stack([_MODE_OK[s.isolation] for s in shapes], axis=1) if shapes
            else np.zeros((5, 0), dtype=bool),
            tenant_id=np.array([_tenant_id(state, s.tenant) for s in shapes], dtype=np.int64),
            kind_ok=np.stack(kinds, axis=1) if shapes else np.zeros((k, 0), dtype=bool),
            units=np.array(flags, dtype=bool),
        )

    def stale(self, state: ClusterState) -> bool:
        """Tenant ids or GPU kinds the arrays were resolved against have changed."""
        if self.kind_ok.shape[0] != len(state.allowed_kinds(None)):
            return True
        return any(_tenant_id(state, s.tenant) != t for s, t in zip(self.shapes, self.tenant_id, strict=True))


_ANY_TENANT = -3


def _tenant_id(state: ClusterState, tenant: str | None) -> int:
    return _ANY_TENANT if tenant is None else state.known_tenant_id(tenant)


@dataclass(frozen=True)
class Rows:
    """The state's views for a subset of node rows (what one scoring pass reads)."""

    present: B
    mode: npt.NDArray[np.int8]
    pool_free: I64
    unit_max: I64
    slots_free: I64
    pooled: B  # time-slicing or pinned MPS: a pod takes its VRAM from a shared pool
    tenant: npt.NDArray[np.int32]
    kind: npt.NDArray[np.int32]
    mig_free: I64  # [R, G, 8]
    idle: B
    cpu_free: I64

    @staticmethod
    def of(state: ClusterState, rows: I64) -> Rows:
        mode = _view(state, "mode")[rows]
        v = {k: _view(state, k)[rows] for k in ("present", "pool_free", "unit_max", "unit_cap", "mem", "slots_free",
                                                "tenant", "kind", "mig_free", "idle", "cpu_free")}
        # MPS with replicas hands out fixed shares (unit_cap < memory); pinned MPS pools like time-slicing.
        pooled = (mode == MODE_CODE[Mode.TIMESLICE]) | ((mode == _MPS) & (v["unit_cap"] >= v["mem"]))
        return Rows(present=v["present"], mode=mode, pool_free=v["pool_free"], unit_max=v["unit_max"],
                    slots_free=v["slots_free"], pooled=pooled, tenant=v["tenant"], kind=v["kind"],
                    mig_free=v["mig_free"], idle=v["idle"], cpu_free=v["cpu_free"])


def eligible(r: Rows, mix: MixArrays) -> B:
    """[R, G, M] the shape may use the GPU at all: mode, model, and one tenant per shared GPU."""
    mode_idx = np.where(r.mode < 0, -1, r.mode).astype(np.intp)
    e = mix.mode_ok[mode_idx] & mix.kind_ok[r.kind.astype(np.intp)] & r.present[..., None]
    foreign = (_SHARED[mode_idx][..., None] & (r.tenant[..., None] >= 0) & (r.tenant[..., None] != mix.tenant_id)
               & (mix.tenant_id != _ANY_TENANT))
    return e & ~foreign


def unit_terms(pool_free: I64, thr: I64, slots: I64, is_mig: B, mig_free: I64, v: I64,
               pooled: B | None = None, units: B | None = None) -> tuple[I64, I64]:
    """(usable, units that fit) per GPU for each size v: [..., M].

    FGD measure (units[m] False or None): usable is VRAM: one unit of `thr` (the largest a new pod can get)
    gives access to the whole free pool; each free MIG instance >= v counts with its size.
    'units' measure (units[m] True; needs `pooled`): usable is how many pods of size v the GPU can still
    take (a pooled GPU: free // v, capped by free replicas; shares, instances, an idle GPU: one each).
    """
    fits = (thr[..., None] >= v) & (slots[..., None] > 0)
    usable = np.where(fits, pool_free[..., None], 0)
    use_units = units is not None and pooled is not None and bool(units.any())
    if use_units:
        assert pooled is not None and units is not None
        # float floor division: exact at these magnitudes (< 2**40) and far faster than int64 `//`
        per_pool = np.minimum(np.floor(pool_free[..., None] / np.maximum(v, 1)), slots[..., None])
        counted = np.where(fits & (v > 0), np.where(pooled[..., None], per_pool, slots[..., None]), 0)
        usable = np.where(units, counted, usable)
    n_fit = fits.astype(np.int64)
    if is_mig.any():
        # Only the MIG GPUs: the per-instance arrays are 8x the per-GPU ones.
        where_mig = np.nonzero(is_mig)
        mf = mig_free[where_mig][..., None]  # [K, 8, 1]
        inst_ok = (mf >= v) & (mf > 0)  # [K, 8, M]
        mig_n = inst_ok.sum(axis=-2)
        mig_usable = np.where(inst_ok, mf, 0).sum(axis=-2)
        if use_units and units is not None:
            mig_usable = np.where(units, mig_n, mig_usable)
        usable = np.array(usable, copy=True)
        usable[where_mig] = mig_usable
        n_fit[where_mig] = mig_n
    return usable, n_fit


def node_value(usable_sum: I64, ok_count: I64, cpu_free: I64, mix: MixArrays) -> I64:
    """[..., M] what a node still offers each shape.

    FGD: the usable VRAM when the node can host one pod of the shape (enough GPUs and CPU), else 0.
    'units': the VRAM of as many pods of the shape as the node can still take, GPUs and CPU together
    (min of GPU units and free CPU / the shape's CPU): CPU that runs out strands GPUs in proportion.
    """
    gpu_shape = mix.count > 0
    sat = (ok_count >= mix.count) & gpu_shape & (cpu_free[..., None] >= mix.cpu)
    fgd = np.where(sat, usable_sum, 0)
    if not mix.units.any():
        return fgd
    k = np.maximum(mix.count, 1)
    gpu_units = np.where(mix.count == 1, usable_sum, np.floor(ok_count / k))
    cpu_units = np.where(mix.cpu > 0, np.floor(np.maximum(cpu_free[..., None], 0) / np.maximum(mix.cpu, 1)),
                         float(1 << 40))
    units = np.where(gpu_shape, np.minimum(gpu_units, cpu_units) * mix.vram * k, 0)
    return np.where(mix.units, units, fgd)


def fragment(r: Rows, mix: MixArrays) -> F64:
    """[R, M] free VRAM of each node that shape m cannot use (the fragmentation measure per shape)."""
    elig = eligible(r, mix)
    usable, n_fit = unit_terms(r.pool_free, r.unit_max, r.slots_free, r.mode == _MIG, r.mig_free, mix.vram)
    eu = np.where(elig, usable, 0)
    count = ((n_fit > 0) & elig).sum(axis=1)
    sat = (count >= mix.count) & (mix.count > 0) & (r.cpu_free[:, None] >= mix.cpu)
    free = np.where(r.present, r.pool_free, 0).sum(axis=1)
    return (free[:, None] - np.where(sat, eu.sum(axis=1), 0)).astype(np.float64)


def node_fragmentation(r: Rows, mix: MixArrays) -> F64:
    """[R] F_n = sum_m w_m * fragment_n(m)."""
    if mix.size == 0:
        return np.where(r.present, r.pool_free, 0).sum(axis=1).astype(np.float64)
    return fragment(r, mix) @ mix.weight


@dataclass(frozen=True)
class PodView:
    """The pod being placed, resolved against the state."""

    vram: int
    count: int
    cpu: int
    mode_ok: B  # [5]
    kind_ok: B  # [K + 1]
    tenant_id: int
    same_tenant: B  # [M] mix shape has the pod's tenant


def pod_candidates(r: Rows, p: PodView) -> B:
    """[R, G] GPUs that can take one of the pod's GPUs now (fit.feasible's per-GPU rule)."""
    mode_idx = np.where(r.mode < 0, -1, r.mode).astype(np.intp)
    ok = r.present & p.mode_ok[mode_idx] & p.kind_ok[r.kind.astype(np.intp)]
    foreign = _SHARED[mode_idx] & (r.tenant >= 0) & (r.tenant != p.tenant_id)
    fits = (r.unit_max >= p.vram) & (r.slots_free > 0)
    is_mig = r.mode == _MIG
    if is_mig.any():
        fits = np.where(is_mig, ((r.mig_free >= p.vram) & (r.mig_free > 0)).any(axis=-1), fits)
    return ok & ~foreign & fits


def smallest_instance(mig_free: I64, v: int) -> I64:
    """[...] size of the smallest free MIG instance >= v (0 where none)."""
    big = np.iinfo(np.int64).max
    s = np.where((mig_free >= v) & (mig_free > 0), mig_free, big).min(axis=-1)
    return np.where(s == big, 0, s)


@dataclass
class Evaluation:
    """Per node row: the loss of the best unit choice, a packing tie-break, and the chosen GPU columns."""

    loss: F64  # [R]
    pack: F64  # [R] free VRAM left on the node's usable GPUs afterwards (smaller = fuller node)
    select: B  # [R, G]
    loss_g: F64  # [R, G] loss of putting a one-GPU pod on each GPU (inf where it can't go)


def evaluate(r: Rows, mix: MixArrays, p: PodView) -> Evaluation:
    """Loss of placing the pod on each row's best units (see the module docstring); inf where it can't go."""
    n_rows, g = r.present.shape
    cand = pod_candidates(r, p) if p.count > 0 else np.zeros((n_rows, g), dtype=bool)
    free = np.where(r.present, r.pool_free, 0)
    free_node = free.sum(axis=1).astype(np.float64)
    is_mig = r.mode == _MIG
    # What the pod's unit takes from each candidate GPU and what is left behind.
    take_mig = smallest_instance(r.mig_free, p.vram) if is_mig.any() else np.zeros_like(free)
    take = np.where(is_mig, take_mig, np.where(r.pooled, p.vram, r.unit_max))
    take = np.where(r.mode == _EXCL, free, take)
    leftover = np.where(cand, np.where(is_mig, take_mig - p.vram, r.unit_max - p.vram), 0)

    m = mix.size
    if m == 0:
        loss_g = np.zeros((n_rows, g))
        before = np.zeros(n_rows)
        after0 = before
    else:
        elig = eligible(r, mix)
        usable, n_fit = unit_terms(r.pool_free, r.unit_max, r.slots_free, is_mig, r.mig_free, mix.vram, r.pooled,
                                   mix.units)
        eu = np.where(elig, usable, 0)
        okg = (n_fit > 0) & elig
        usable_n = eu.sum(axis=1)  # [R, M]
        count_n = okg.sum(axis=1)
        before = node_value(usable_n, count_n, r.cpu_free, mix) @ mix.weight
        cpu_after = r.cpu_free - p.cpu
        if p.count == 0:
            after0 = node_value(usable_n, count_n, cpu_after, mix) @ mix.weight
            loss_g = np.zeros((n_rows, g))
        else:
            after0 = before
            # Hypothetical GPU g after taking the pod's unit.
            pf2 = r.pool_free - take
            slots2 = r.slots_free - 1
            thr2 = np.where(r.pooled, pf2, np.where(slots2 > 0, r.unit_max, 0))
            thr2 = np.where(r.mode == _EXCL, 0, thr2)
            usable2, n_fit2 = unit_terms(pf2, thr2, slots2, np.zeros_like(is_mig), r.mig_free, mix.vram, r.pooled,
                                         mix.units)
            if is_mig.any():
                inst_big = (take_mig[..., None] >= mix.vram) & (take_mig[..., None] > 0)
                lost = np.where(inst_big, np.where(mix.units, 1, take_mig[..., None]), 0)
                usable2 = np.where(is_mig[..., None], usable - lost, usable2)
                n_fit2 = np.where(is_mig[..., None], n_fit - inst_big, n_fit2)
            # Joining an unowned shared GPU makes it the pod's tenant's failure domain.
            shared = _SHARED[np.where(r.mode < 0, -1, r.mode).astype(np.intp)]
            elig2 = elig & (~shared[..., None] | p.same_tenant)
            d_eu = np.where(elig2, usable2, 0) - eu  # [R, G, M]
            d_ok = ((n_fit2 > 0) & elig2).astype(np.int64) - okg
            # One GPU at a time; for a multi-GPU pod this ranks the GPUs and the joint loss follows below.
            usable_after = usable_n[:, None, :] + d_eu
            count_after = count_n[:, None, :] + d_ok
            after = node_value(usable_after, count_after, cpu_after[:, None], mix) @ mix.weight
            loss_g = before[:, None] - after  # [R, G]

    loss_g = np.round(loss_g * _ROUND) / _ROUND
    if p.count == 0:
        select = np.zeros((n_rows, g), dtype=bool)
        loss = np.round((before - after0) * _ROUND) / _ROUND
        # A CPU-only pod belongs where the GPUs are already taken: tie-break on free VRAM.
        return Evaluation(loss=loss, pack=free_node, select=select, loss_g=np.full((n_rows, g), np.inf))

    # Rank GPUs inside each row: smallest loss, then tightest unit, then already-used GPUs, then index.
    inf = np.inf
    key_loss = np.where(cand, loss_g, inf)
    idle_pen = r.idle  # among equal choices, join a GPU already in use
    order = np.lexsort((np.broadcast_to(np.arange(g), (n_rows, g)), idle_pen, leftover, key_loss), axis=-1)
    k = p.count
    chosen = order[:, :k]
    rows_idx = np.arange(n_rows)[:, None]
    select = np.zeros((n_rows, g), dtype=bool)
    select[rows_idx, chosen] = True
    select &= cand
    enough = cand.sum(axis=1) >= k
    if m == 0:
        loss = np.where(enough, 0.0, inf)
    elif k == 1:
        loss = np.where(enough, key_loss[np.arange(n_rows), chosen[:, 0]], inf)
    else:
        joint_usable = usable_n + np.where(select[..., None], d_eu, 0).sum(axis=1)
        joint_count = count_n + np.where(select[..., None], d_ok, 0).sum(axis=1)
        loss = before - node_value(joint_usable, joint_count, cpu_after, mix) @ mix.weight
        loss = np.where(enough, np.round(loss * _ROUND) / _ROUND, inf)
    pack = free_node - np.where(select, take, 0).sum(axis=1)
    return Evaluation(loss=loss, pack=pack.astype(np.float64), select=select, loss_g=key_loss)


@dataclass
class _CacheEntry:
    version: I64
    loss: F64
    pack: F64
    select: B
    loss_g: F64


def gap_keys(pool_free: I64, mem: I64, buckets: int = 100) -> I64:
    """Bucket of a free gap (share of the GPU, `buckets` levels) per GPU size class: the sum-of-squares key."""
    return (mem // 1024) * (buckets + 1) + (pool_free * buckets) // np.maximum(mem, 1)


def sum_of_squares_delta(pool_free: I64, mem: I64, partial: B, v: int, cand: B, buckets: int = 100) -> F64:
    """[R, G] change of sum_h N(h)^2 (N(h) = partly filled GPUs with a gap in bucket h, cluster-wide) when
    the pod's v joins each candidate GPU: Csirik et al.'s Sum-of-Squares rule for online bin packing."""
    keys = gap_keys(pool_free, mem, buckets)
    flat = keys[partial]
    size = int(keys.max()) + 1 if keys.size else 1
    hist = np.bincount(flat, minlength=size).astype(np.float64)
    left = pool_free - v
    keys2 = gap_keys(np.maximum(left, 0), mem, buckets)
    n_old = np.where(partial, hist[keys], 0.0)
    d_remove = np.where(partial, -2.0 * n_old + 1.0, 0.0)
    n_new = hist[np.clip(keys2, 0, size - 1)] - (partial & (keys2 == keys))
    d_add = np.where(left > 0, 2.0 * n_new + 1.0, 0.0)
    return np.where(cand, d_remove + d_add, np.inf)


@dataclass
class FragAware(BasePolicy):
    """Fragmentation-aware: smallest loss of VRAM the workload mix can still use; node and units together."""

    name: str = "frag-aware"
    whole_gpu: bool = False
    weighting: str = "count"  # 'count' (FGD) or 'mass'
    coverage: float = 0.95
    max_types: int = 64
    learn: bool | None = None  # learn the mix from observe(); default: only when no mix is given
    tiebreak: str = "none"  # 'pack': fuller node first (measured worse); 'none': cluster order
    quantize: float = 0.0  # > 0: FGD's integer score floor(100 sigmoid(-dF / quantize)) (ablation only)
    measure: str = "both"  # 'fgd': usable VRAM per shape (FGD); 'units': pods of the shape, GPUs and CPU
    # together; 'both': half the weight each
    cpu_pack: bool = False  # CPU-only pods: among equal losses, the node with the least free VRAM
    sharing: str = "none"  # 'ss': pods that share a pooled GPU follow the sum-of-squares rule first
    refresh: int = 2048  # re-snapshot the learned mix every `refresh` pods (and at 16, 32, ... before)
    mix: Sequence[tuple[Any, float]] | None = None  # (Shape or PodDemand, count) pairs
    workload: Any = None  # a trace benchmark's TargetWorkload (FGD's target workload M), used as the mix
    use_workload: bool = True
    seed: int | None = None  # accepted for the benchmark harness; the policy is deterministic
    _counts: Counter[Shape] = field(default_factory=Counter)
    _observed: int = 0
    _next_refresh: int = 16
    _snapshot: list[tuple[Shape, float]] = field(default_factory=list)
    _arrays: MixArrays | None = None
    _arrays_state: int = 0
    _cache: dict[tuple[object, ...], _CacheEntry] = field(default_factory=dict)
    _ss_pick: tuple[tuple[object, ...], I64, npt.NDArray[np.intp]] | None = None

    def __post_init__(self) -> None:
        given: list[tuple[Shape, float]] = []
        if self.mix:
            given += [(Shape.of(s) if isinstance(s, PodDemand) else s, float(c)) for s, c in self.mix]
        if self.workload is not None and self.use_workload:
            given += shapes_of_workload(self.workload)
        for shape, c in given:
            self._counts[shape] += c  # type: ignore[assignment]
        if self.learn is None:
            self.learn = not given
        if given:
            self._snapshot = top_mix(self._counts, self.weighting, self.coverage, self.max_types)

    # ------------------------------------------------------------------ mix
    def observe(self, pod: PodDemand) -> None:
        if not self.learn:
            return
        self._counts[Shape.of(pod)] += 1
        self._observed += 1
        if self._observed >= self._next_refresh:
            self._next_refresh = (self._next_refresh * 2 if self._next_refresh < self.refresh
                                  else self._next_refresh + self.refresh)
            self._snapshot = top_mix(self._counts, self.weighting, self.coverage, self.max_types)
            self._arrays = None

    def current_mix(self) -> list[tuple[Shape, float]]:
        """The mix the policy scores against now (shape, weight), weights summing to 1."""
        return list(self._snapshot)

    def _mix_arrays(self, state: ClusterState) -> MixArrays:
        arr = self._arrays
        if arr is None or self._arrays_state != id(state) or arr.stale(state):
            arr = self._arrays = MixArrays.build(self._snapshot, state, self.measure)
            self._arrays_state = id(state)
            self._cache.clear()
        return arr

    def _pod_view(self, state: ClusterState, pod: PodDemand, mix: MixArrays) -> PodView:
        return PodView(vram=pod.vram_mib, count=pod.gpu_count, cpu=pod.cpu_milli,
                       mode_ok=_MODE_OK[pod.isolation], kind_ok=state.allowed_kinds(pod.models),
                       tenant_id=state.known_tenant_id(pod.tenant),
                       same_tenant=np.array([s.tenant in (None, pod.tenant) for s in mix.shapes], dtype=bool))

    # -------------------------------------------------------------- scoring
    def _entry(self, state: ClusterState, pod: PodDemand, rows_wanted: B | None) -> _CacheEntry:
        mix = self._mix_arrays(state)
        key = pod.shape
        n = len(state)
        e = self._cache.get(key)
        if e is None or e.version.shape[0] != n or e.select.shape[1] != _view(state, "present").shape[1]:
            g = _view(state, "present").shape[1]
            e = _CacheEntry(version=np.full(n, -1, dtype=np.int64), loss=np.full(n, np.inf),
                            pack=np.zeros(n), select=np.zeros((n, g), dtype=bool), loss_g=np.full((n, g), np.inf))
            if len(self._cache) > 512:
                self._cache.clear()
            self._cache[key] = e
        stale = e.version != _view(state, "version")
        if rows_wanted is not None:
            stale &= rows_wanted
        rows = np.flatnonzero(stale)
        if rows.size:
            ev = evaluate(Rows.of(state, rows), mix, self._pod_view(state, pod, mix))
            e.loss[rows] = ev.loss
            e.pack[rows] = ev.pack
            e.select[rows] = ev.select
            e.loss_g[rows] = ev.loss_g
            e.version[rows] = _view(state, "version")[rows]
        return e

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        e = self._entry(state, pod, np.asarray(feasible_now, dtype=bool))
        score = -e.loss
        self._ss_pick = None
        if self.sharing in ("ss", "ss-tie") and pod.gpu_count == 1:
            mem = _view(state, "mem")
            pf = _view(state, "pool_free")
            mode = _view(state, "mode")
            pres = _view(state, "present")
            pooled = pres & ((mode == MODE_CODE[Mode.TIMESLICE]) | ((mode == _MPS) & (_view(state, "unit_cap") >= mem)))
            partial = pooled & (pf > 0) & (pf < mem)
            cand = np.isfinite(e.loss_g) & (_view(state, "version") == e.version)[:, None]
            cand &= np.asarray(feasible_now, dtype=bool)[:, None]
            d_ss = sum_of_squares_delta(pf, mem, partial, pod.vram_mib, cand & pooled)
            d_ss = np.where(cand & ~pooled, 0.0, d_ss)
            if self.quantize > 0:
                # FGD's bucketed score first; sum-of-squares only decides inside a bucket.
                with np.errstate(over="ignore", invalid="ignore"):
                    q = np.floor(100.0 / (1.0 + np.exp((e.loss_g - pod.vram_mib) / self.quantize)))
                key = np.where(cand, -np.nan_to_num(q, nan=-1.0) * 1e9 + d_ss, np.inf)
            elif self.sharing == "ss-tie":
                # Loss first (to 1e-3), sum-of-squares only among GPUs that lose the same.
                key = np.where(cand, np.round(np.minimum(e.loss_g, 1e9) * 1e3) * 1e6 + d_ss, np.inf)
            else:
                key = np.where(cand, d_ss * 1e7 + np.minimum(e.loss_g, 1e6), np.inf)
            pick = np.argmin(key, axis=1)
            best = key[np.arange(len(state)), pick]
            self._ss_pick = (pod.shape, _view(state, "version").copy(), pick)
            return np.where(np.isfinite(best), -best, -np.inf)
        if self.quantize > 0:
            # FGD: dF = -(VRAM taken) + loss; the score saturates and ties in ~100 integer levels.
            d_f = e.loss - pod.vram_mib * pod.gpu_count
            with np.errstate(over="ignore", invalid="ignore"):
                score = np.floor(100.0 / (1.0 + np.exp(d_f / self.quantize)))
            score = np.nan_to_num(score, nan=-1.0, neginf=-1.0)
        if self.tiebreak == "pack" or (self.cpu_pack and pod.gpu_count == 0):
            # Lexicographic (loss, then fuller node): dense ranks keep exact ties as ties.
            idx = np.flatnonzero(feasible_now)
            out = np.full(len(state), -np.inf)
            if idx.size:
                order = np.lexsort((e.pack[idx], e.loss[idx]))
                lo, pk = e.loss[idx][order], e.pack[idx][order]
                new = np.ones(idx.size, dtype=bool)
                new[1:] = (lo[1:] != lo[:-1]) | (pk[1:] != pk[:-1])
                out[idx[order]] = -np.cumsum(new).astype(np.float64)
            return out
        return score

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        node = state.node_at(node_index)
        if pod.gpu_count == 0:
            return Assignment(node=node.name, gpus=())
        want = np.zeros(len(state), dtype=bool)
        want[node_index] = True
        e = self._entry(state, pod, want)
        cols = np.flatnonzero(e.select[node_index])
        ss = self._ss_pick
        if (ss is not None and pod.gpu_count == 1 and ss[0] == pod.shape
                and ss[1][node_index] == _view(state, "version")[node_index]):
            cols = ss[2][node_index: node_index + 1]
        if cols.size != pod.gpu_count:
            return fit.choose_units(state, node.name, pod, self.whole_gpu)
        usage = state.usage(node.name)
        grants: list[GpuGrant] = []
        for j in cols:
            gu = usage.gpus[int(j)]
            if gu.gpu.mode is Mode.MIG:
                fitting = sorted((i for i in gu.free_instances() if i.memory_mib >= pod.vram_mib),
                                 key=lambda i: (i.memory_mib, i.start))
                if not fitting:
                    return fit.choose_units(state, node.name, pod, self.whole_gpu)
                grants.append(GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib, mig=fitting[0].ref))
            else:
                grants.append(GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib))
        return Assignment(node=node.name, gpus=tuple(sorted(grants, key=lambda g: g.index)))


def _factory(name: str) -> Any:
    def make(**params: Any) -> FragAware:
        return FragAware(name=name, **params)

    make.__doc__ = FragAware.__doc__
    return make


register_policy("frag-aware", FragAware.__doc__ or "")(_factory("frag-aware"))
register_policy("vramfit", "vramfit's default: " + (FragAware.__doc__ or ""))(_factory("vramfit"))


def shapes_of_workload(wl: Any) -> list[tuple[Shape, float]]:
    """(shape, count) pairs from a `packing.workload_frag.TargetWorkload` (single tenant: tenant None)."""
    return [(Shape(vram_mib=int(d), gpu_count=int(k), tenant=None, models=frozenset(t) or None, cpu_milli=int(c)),
             float(w)) for c, d, k, t, w in zip(wl.cpu, wl.milli, wl.count, wl.models, wl.weight, strict=True)]


def mix_from_pods(pods: Iterable[PodDemand]) -> list[tuple[Shape, float]]:
    """(shape, count) pairs for the `mix` parameter, e.g. from a trace's original workload."""
    c: Counter[Shape] = Counter(Shape.of(p) for p in pods)
    return [(s, float(n)) for s, n in c.items()]
