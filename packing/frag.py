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

Speed. A GPU's terms depend only on its own state and a node's sums only on its GPUs and free CPU, so
`NodeTable` interns both per mix: the per-GPU terms are computed once per distinct GPU state, each node's
value once per distinct node state (5,000 mixed nodes hold a few hundred) and shared by every pod shape; a pod
shape evaluates one (node state, GPU state) pair per distinct candidate. Per pod shape the per-node result is
cached by node version, so one placement re-scores only the node it changed; a mix refresh that keeps
shapes keeps their columns. `evaluate` is the same computation row by row, the reference the tests hold the
tables to.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence
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
from packing.policy_base import BasePolicy
from packing.state import MAX_MIG_INSTANCES, MODE_CODE, ClusterState

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
# Compact storage of whole numbers in the interned tables: VRAM per GPU (< 2**24 MiB) is exact in float32,
# GPU counts fit int8 per GPU and int16 per node.
F32 = npt.NDArray[np.float32]
I8 = npt.NDArray[np.int8]
I16 = npt.NDArray[np.int16]
Int = npt.NDArray[np.integer[Any]]

_MODE_ORDER = sorted(MODE_CODE, key=MODE_CODE.__getitem__)
_SHARED = np.array([m in SHARED_FAILURE_MODES for m in _MODE_ORDER] + [False])
_EXCL, _MIG, _MPS = MODE_CODE[Mode.EXCLUSIVE], MODE_CODE[Mode.MIG], MODE_CODE[Mode.MPS]


def pooled(mode: Any, unit_cap: Any, mem: Any) -> Any:
    """GPUs whose VRAM is one pool pods draw from: time-slicing, and MPS without replicas (pinned limits).
    MPS with replicas hands out fixed shares (unit_cap < memory) and is not pooled."""
    return (mode == MODE_CODE[Mode.TIMESLICE]) | ((mode == _MPS) & (unit_cap >= mem))
# mode code -> allowed, per isolation; the extra last entry (mode -1) is "no GPU here".
_MODE_OK: dict[Isolation, B] = {
    iso: np.array([m in modes for m in _MODE_ORDER] + [False]) for iso, modes in ALLOWED_MODES.items()
}
_I64_MAX = int(np.iinfo(np.int64).max)
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
            max_types: int = 64, dropped: float = 0.0) -> list[tuple[Shape, float]]:
    """The most popular GPU shapes covering `coverage` of the weight (FGD keeps 95 %), weights summing to 1.

    CPU-only shapes are left out: they can use no GPU, so they never change a loss. `dropped`: the weight of
    GPU shapes no longer counted (`FragAware.max_shapes`), still part of the total the coverage is of.
    """
    weighted = [(s, c * shape_weight(s, weighting)) for s, c in counts.items() if s.gpu_count > 0]
    weighted = [(s, w) for s, w in weighted if w > 0]
    if not weighted:
        return []
    weighted.sort(key=_mix_order)
    total = sum(w for _, w in weighted) + dropped
    kept: list[tuple[Shape, float]] = []
    cum = 0.0
    for s, w in weighted:
        if cum >= coverage * total or len(kept) >= max_types:
            break
        kept.append((s, w))
        cum += w
    return [(s, w / cum) for s, w in kept]


def _mix_order(sw: tuple[Shape, float]) -> tuple[object, ...]:
    """Most weight first; equal weights in a fixed order of the shape (then the order they were first seen)."""
    return (-sw[1], sw[0].vram_mib, sw[0].gpu_count, sw[0].cpu_milli, sw[0].tenant or "")


# Largest per-pod VRAM, CPU or GPU count a learnt shape may have: the state's arrays are int64 (and CPU
# untracked is 2^40), the mix's GPU counts int8. A pod beyond these fits nowhere; learning it could only
# overflow the arithmetic of every later score.
_LEARN_MAX = 1 << 40
_LEARN_MAX_GPUS = 64


@dataclass(frozen=True)
class MixConsts:
    """Per-column constants of `node_value` (see `MixArrays.consts`)."""

    gpu_shape: B
    all_gpu: bool
    any_units: bool
    k: I64
    single: B
    cpu_pos: B
    cpu_den: I64


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
    _tenants: dict[str | None, int] | None = field(default=None, init=False, repr=False, compare=False)
    _consts: MixConsts | None = field(default=None, init=False, repr=False, compare=False)

    def consts(self) -> MixConsts:
        """Per-column constants of `node_value`, computed once per mix (it runs on every score)."""
        if self._consts is None:
            gpu_shape = self.count > 0
            self._consts = MixConsts(gpu_shape=gpu_shape, all_gpu=bool(gpu_shape.all()),
                                     any_units=bool(self.units.any()), k=np.maximum(self.count, 1),
                                     single=self.count == 1, cpu_pos=self.cpu > 0, cpu_den=np.maximum(self.cpu, 1))
        return self._consts

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

    def take(self, cols: npt.NDArray[np.intp]) -> MixArrays:
        """The mix restricted to some columns (weights as they are: per-column terms only)."""
        return MixArrays(shapes=tuple(self.shapes[int(j)] for j in cols), vram=self.vram[cols], count=self.count[cols],
                         cpu=self.cpu[cols], weight=self.weight[cols], mode_ok=self.mode_ok[:, cols],
                         tenant_id=self.tenant_id[cols], kind_ok=self.kind_ok[:, cols], units=self.units[cols])

    def stale(self, state: ClusterState) -> bool:
        """Tenant ids or GPU kinds the arrays were resolved against have changed."""
        if self.kind_ok.shape[0] != len(state.allowed_kinds(None)):
            return True
        # One look-up per distinct tenant, not per shape: this runs on every score.
        if self._tenants is None:
            self._tenants = {s.tenant: int(t) for s, t in zip(self.shapes, self.tenant_id, strict=True)}
        return any(_tenant_id(state, name) != t for name, t in self._tenants.items())


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
        return Rows(present=v["present"], mode=mode, pool_free=v["pool_free"], unit_max=v["unit_max"],
                    slots_free=v["slots_free"], pooled=pooled(mode, v["unit_cap"], v["mem"]), tenant=v["tenant"], kind=v["kind"],
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


def node_value(usable_sum: I64 | F64, ok_count: Int, cpu_free: I64, mix: MixArrays) -> I64 | F64:
    """[..., M] what a node still offers each shape.

    FGD: the usable VRAM when the node can host one pod of the shape (enough GPUs and CPU), else 0.
    'units': the VRAM of as many pods of the shape as the node can still take, GPUs and CPU together
    (min of GPU units and free CPU / the shape's CPU): CPU that runs out strands GPUs in proportion.
    """
    c = mix.consts()
    cpu = cpu_free[..., None]
    sat = (ok_count >= mix.count) & (cpu >= mix.cpu)
    if not c.all_gpu:
        sat &= c.gpu_shape
    fgd = np.where(sat, usable_sum, 0)
    if not c.any_units:
        return fgd
    gpu_units = np.where(c.single, usable_sum, np.floor(ok_count / c.k))
    cpu_units = np.where(c.cpu_pos, np.floor(np.maximum(cpu, 0) / c.cpu_den), float(1 << 40))
    units = np.minimum(gpu_units, cpu_units) * mix.vram * c.k
    if not c.all_gpu:
        units = np.where(c.gpu_shape, units, 0)
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
    s = np.where((mig_free >= v) & (mig_free > 0), mig_free, _I64_MAX).min(axis=-1)
    return np.where(s == _I64_MAX, 0, s)


@dataclass
class Evaluation:
    """Per node row: the loss of the best unit choice, a packing tie-break, and the chosen GPU columns."""

    loss: F64  # [R]
    pack: F64  # [R] free VRAM left on the node's usable GPUs afterwards (smaller = fuller node)
    select: B  # [R, G]
    loss_g: F64  # [R, G] loss of putting a one-GPU pod on each GPU (inf where it can't go)


def take_terms(r: Rows, p: PodView) -> tuple[I64, I64, I64]:
    """(take, take_mig, leftover-before-masking) per GPU: what the pod's unit takes, its MIG instance, the slack."""
    free = np.where(r.present, r.pool_free, 0)
    is_mig = r.mode == _MIG
    take_mig = smallest_instance(r.mig_free, p.vram) if is_mig.any() else np.zeros_like(free)
    take = np.where(is_mig, take_mig, np.where(r.pooled, p.vram, r.unit_max))
    take = np.where(r.mode == _EXCL, free, take)
    left = np.where(is_mig, take_mig - p.vram, r.unit_max - p.vram)
    return take, take_mig, left


@dataclass(frozen=True)
class GpuTerms:
    """Per GPU and mix shape [R, G, M], before the pod: what the node's value is summed from."""

    elig: B
    usable: Any  # unit_terms' usable (int64, or float64 with the 'units' measure), not yet masked by elig
    n_fit: Int
    eu: Any  # usable where eligible
    okg: B  # counts towards the shape's GPU count

    @staticmethod
    def of(r: Rows, mix: MixArrays) -> GpuTerms:
        elig = eligible(r, mix)
        usable, n_fit = unit_terms(r.pool_free, r.unit_max, r.slots_free, r.mode == _MIG, r.mig_free, mix.vram,
                                   r.pooled, mix.units)
        return GpuTerms(elig, usable, n_fit, np.where(elig, usable, 0), (n_fit > 0) & elig)


def after_terms(r: Rows, mix: MixArrays, p: PodView, take: I64, take_mig: I64, t: GpuTerms) -> tuple[Any, I64]:
    """(change of usable, change of counts) per GPU and mix shape [R, G, M] if the pod's unit goes there."""
    is_mig = r.mode == _MIG
    pf2 = r.pool_free - take
    slots2 = r.slots_free - 1
    thr2 = np.where(r.pooled, pf2, np.where(slots2 > 0, r.unit_max, 0))
    thr2 = np.where(r.mode == _EXCL, 0, thr2)
    usable2, n_fit2 = unit_terms(pf2, thr2, slots2, np.zeros_like(is_mig), r.mig_free, mix.vram, r.pooled, mix.units)
    if is_mig.any():
        inst_big = (take_mig[..., None] >= mix.vram) & (take_mig[..., None] > 0)
        lost = np.where(inst_big, np.where(mix.units, 1, take_mig[..., None]), 0)
        usable2 = np.where(is_mig[..., None], t.usable - lost, usable2)
        n_fit2 = np.where(is_mig[..., None], t.n_fit - inst_big, n_fit2)
    # Joining an unowned shared GPU makes it the pod's tenant's failure domain.
    shared = _SHARED[np.where(r.mode < 0, -1, r.mode).astype(np.intp)]
    elig2 = t.elig & (~shared[..., None] | p.same_tenant)
    d_eu = np.where(elig2, usable2, 0) - t.eu
    d_ok = ((n_fit2 > 0) & elig2).astype(np.int64) - t.okg
    return d_eu, d_ok


def first_unit(key_loss: F64, leftover: I64, idle: B) -> tuple[npt.NDArray[np.intp], F64]:
    """(column, its loss) per row: the first of `rank_units`' order, without a 2-D lexsort (slow on few rows)."""
    best = key_loss.min(axis=1)
    tie = key_loss == best[:, None]
    tie &= leftover == np.where(tie, leftover, _I64_MAX).min(axis=1, keepdims=True)
    busy = tie & ~idle
    tie = np.where(busy.any(axis=1, keepdims=True), busy, tie)
    return tie.argmax(axis=1), best


def rank_units(cand: B, key_loss: F64, leftover: I64, idle: B, k: int) -> tuple[npt.NDArray[np.intp], B, B]:
    """(chosen columns [R, k], selection [R, G], enough candidates [R]) for a k-GPU pod.

    Inside each row: smallest loss, then tightest unit, then already-used GPUs, then index."""
    n_rows, g = cand.shape
    if k == 1:
        chosen = first_unit(key_loss, leftover, idle)[0][:, None]
    else:
        order = np.lexsort((np.broadcast_to(np.arange(g), (n_rows, g)), idle, leftover, key_loss), axis=-1)
        chosen = order[:, :k]
    select = np.zeros((n_rows, g), dtype=bool)
    select[np.arange(n_rows)[:, None], chosen] = True
    select &= cand
    return chosen, select, cand.sum(axis=1) >= k


def evaluate(r: Rows, mix: MixArrays, p: PodView) -> Evaluation:
    """Loss of placing the pod on each row's best units (see the module docstring); inf where it can't go.

    The reference evaluation: `FragAware` computes the same through interned GPU and node states."""
    n_rows, g = r.present.shape
    cand = pod_candidates(r, p) if p.count > 0 else np.zeros((n_rows, g), dtype=bool)
    free = np.where(r.present, r.pool_free, 0)
    free_node = free.sum(axis=1).astype(np.float64)
    # What the pod's unit takes from each candidate GPU and what is left behind.
    take, take_mig, left = take_terms(r, p)
    leftover = np.where(cand, left, 0)

    m = mix.size
    if m == 0:
        loss_g = np.zeros((n_rows, g))
        before = np.zeros(n_rows)
        after0 = before
    else:
        t = GpuTerms.of(r, mix)
        usable_n = t.eu.sum(axis=1)  # [R, M]
        count_n = t.okg.sum(axis=1)
        before = node_value(usable_n, count_n, r.cpu_free, mix) @ mix.weight
        cpu_after = r.cpu_free - p.cpu
        if p.count == 0:
            after0 = node_value(usable_n, count_n, cpu_after, mix) @ mix.weight
            loss_g = np.zeros((n_rows, g))
        else:
            after0 = before
            d_eu, d_ok = after_terms(r, mix, p, take, take_mig, t)
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

    inf = np.inf
    key_loss = np.where(cand, loss_g, inf)
    k = p.count
    chosen, select, enough = rank_units(cand, key_loss, leftover, r.idle, k)  # idle: join a used GPU first
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
    """One pod shape's evaluation per node row, valid while the row's version is unchanged."""

    version: I64
    loss: F64
    pack: F64
    select: B
    loss_g: F64
    view: PodView | None = None  # the pod as last resolved against the state


# ------------------------------------------------------------------------------------------ interned states
# Everything `evaluate` computes per GPU depends only on that GPU's own state (its signature: mode, free
# pool, unit, slots, pooling, tenant, kind, free MIG instances), and a node's sums only on the multiset of
# its GPUs' signatures and its free CPU (its content). `NodeTable` interns both for one state and one mix:
# per-GPU terms are computed once per signature, a node's value V once per content and shared by every pod
# shape; a pod shape then evaluates one (content, signature) pair per distinct candidate GPU. The
# arithmetic on each pair is `evaluate`'s (exact integer sums, then the same float dot with the weights).

_HASH_MUL = np.random.default_rng(20231).integers(1, 1 << 62, size=64, dtype=np.int64) | 1


class Interner:
    """Stable ids 0, 1, ... for the rows of int64 key matrices, kept across calls.

    A batch is grouped by a multiplicative hash, checked row by row for equality (so exact: a collision
    falls back to grouping by the bytes), and only its distinct rows touch the dict."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def intern(self, keys: I64) -> tuple[I64, I64]:
        """(id per row, the rows of `keys` that got new ids, in id order)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        b = keys.shape[0]
        if b <= 16:  # a node or two: the dict alone is cheaper than grouping
            first: I64 = np.arange(b)
            inv: I64 = first
        else:
            h = keys @ _HASH_MUL[: keys.shape[1]]  # int64 wraps around: fine for a hash
            _, first, inv = np.unique(h, return_index=True, return_inverse=True)
            if not (keys == keys[first[inv]]).all():
                void = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
                _, first, inv = np.unique(void, return_index=True, return_inverse=True)
        ids = self._ids
        out = np.empty(first.size, dtype=np.int64)
        new: list[int] = []
        buf = keys.tobytes()
        w = keys.dtype.itemsize * keys.shape[1]
        for j, row in enumerate(first.tolist()):
            kb = buf[row * w: (row + 1) * w]
            i = ids.get(kb)
            if i is None:
                i = ids[kb] = len(ids)
                new.append(row)
            out[j] = i
        return out[inv], np.array(new, dtype=np.int64)


def _grown(arr: Any, n: int) -> Any:
    """`arr` with room for at least n rows (capacity doubles; rows beyond the used ones are scratch)."""
    if arr.shape[0] >= n:
        return arr
    out = np.zeros((max(n, 2 * arr.shape[0], 64), *arr.shape[1:]), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


_SIG_VIEWS = ("present", "mode", "pool_free", "unit_max", "unit_cap", "mem", "slots_free", "tenant", "kind")
_SIG_WIDTH = len(_SIG_VIEWS) + MAX_MIG_INSTANCES


def gpu_features(state: ClusterState, rows: I64) -> I64:
    """[R, G, W] each GPU's signature: everything the measure reads from one GPU (the views, then the free MIG
    instances)."""
    # One placement since (the common case) or every row (a first build): a slice is a view, fancy
    # indexing copies.
    sel: slice | I64 = rows
    if rows.size == 1:
        sel = slice(int(rows[0]), int(rows[0]) + 1)
    elif rows.size == len(state):
        sel = slice(None)
    mig = _view(state, "mig_free")[sel]
    f = np.empty((*mig.shape[:2], _SIG_WIDTH), dtype=np.int64)
    for j, name in enumerate(_SIG_VIEWS):
        f[..., j] = _view(state, name)[sel]
    f[..., len(_SIG_VIEWS):] = mig
    return f


def signature_rows(f: I64) -> Rows:
    """Signatures [U, W] as state rows of one GPU each ([U, 1] views), for the row functions above."""
    col = f[:, None, :]
    mode = col[..., 1].astype(np.int8)
    return Rows(present=col[..., 0].astype(bool), mode=mode, pool_free=col[..., 2], unit_max=col[..., 3],
                slots_free=col[..., 6], pooled=pooled(mode, col[..., 4], col[..., 5]), tenant=col[..., 7].astype(np.int32),
                kind=col[..., 8].astype(np.int32), mig_free=col[..., 9:], idle=np.zeros(col.shape[:2], dtype=bool),
                cpu_free=np.zeros(col.shape[0], dtype=np.int64))


def _column_key(mix: MixArrays, j: int) -> tuple[object, ...]:
    """What a mix column's per-GPU terms depend on (not its weight)."""
    return mix.shapes[j], bool(mix.units[j]), int(mix.tenant_id[j]), mix.kind_ok[:, j].tobytes()


class NodeTable:
    """A state's GPUs and nodes interned under one mix (see above): [U, M] terms per GPU signature,
    [C, M] sums and the value V per node content, and each node row's signatures and content."""

    def __init__(self, mix: MixArrays, g: int) -> None:
        m = mix.size
        self.g = g
        self.version: I64 = np.zeros(0, dtype=np.int64)  # node version the row was interned at (-1: never)
        self.sig: I64 = np.zeros((0, g), dtype=np.int64)  # [N, G]
        self.content: I64 = np.zeros(0, dtype=np.int64)  # [N]
        self.sigs = Interner()
        self.sig_feat: I64 = np.zeros((0, _SIG_WIDTH), dtype=np.int64)
        self.sig_eu: F32 = np.zeros((0, m), dtype=np.float32)  # usable where eligible (whole numbers: sums are exact)
        self.sig_ok: I8 = np.zeros((0, m), dtype=np.int8)
        self.sig_elig: B = np.zeros((0, m), dtype=bool)
        self.sig_nfit: I8 = np.zeros((0, m), dtype=np.int8)  # units of the size that fit (MIG: <= 8 instances)
        self.contents = Interner()
        self.c_sigs: I64 = np.zeros((0, g), dtype=np.int64)  # sorted signatures of the content
        self.c_cpu: I64 = np.zeros(0, dtype=np.int64)
        self.c_free: I64 = np.zeros(0, dtype=np.int64)  # free VRAM of the node
        self.c_usable: F64 = np.zeros((0, m))
        self.c_count: I16 = np.zeros((0, m), dtype=np.int16)
        self.c_value: F64 = np.zeros(0)
        self.c_valued: B = np.zeros(0, dtype=bool)  # V computed under the current weights

    def oversized(self, n: int) -> bool:
        """Interned states no longer on any node pile up in a long run: time to start afresh."""
        return len(self.sigs) > 2 * n * self.g + 4096 or len(self.contents) > 4 * n + 4096

    def update(self, state: ClusterState, mix: MixArrays) -> None:
        """Re-intern the rows whose node changed since (a placement changes one)."""
        ver = _view(state, "version")
        n = ver.shape[0]
        if self.version.shape[0] != n:
            keep = min(n, self.version.shape[0])
            self.version = np.concatenate([self.version[:keep], np.full(n - keep, -1, dtype=np.int64)])
            self.sig = np.concatenate([self.sig[:keep], np.zeros((n - keep, self.g), dtype=np.int64)])
            self.content = np.concatenate([self.content[:keep], np.zeros(n - keep, dtype=np.int64)])
        rows = np.flatnonzero(self.version != ver)
        if rows.size == 0:
            return
        feats = gpu_features(state, rows).reshape(-1, _SIG_WIDTH)
        ids, new = self.sigs.intern(feats)
        if new.size:
            self._add_signatures(feats[new], mix)
        sig = ids.reshape(rows.size, self.g)
        key = np.concatenate([np.sort(sig, axis=1), _view(state, "cpu_free")[rows][:, None]], axis=1)
        cids, cnew = self.contents.intern(key)
        if cnew.size:
            self._add_contents(key[cnew], mix)
        self.sig[rows] = sig
        self.content[rows] = cids
        self.version[rows] = ver[rows]

    def _add_signatures(self, feats: I64, mix: MixArrays) -> None:
        lo, hi = len(self.sigs) - feats.shape[0], len(self.sigs)
        t = GpuTerms.of(signature_rows(feats), mix)
        self.sig_feat = _grown(self.sig_feat, hi)
        self.sig_eu = _grown(self.sig_eu, hi)
        self.sig_ok = _grown(self.sig_ok, hi)
        self.sig_elig = _grown(self.sig_elig, hi)
        self.sig_nfit = _grown(self.sig_nfit, hi)
        self.sig_feat[lo:hi] = feats
        self.sig_eu[lo:hi] = t.eu[:, 0]
        self.sig_ok[lo:hi] = t.okg[:, 0]
        self.sig_elig[lo:hi] = t.elig[:, 0]
        self.sig_nfit[lo:hi] = t.n_fit[:, 0]

    def terms(self, lo: int, hi: int) -> GpuTerms:
        """`GpuTerms` of signatures lo..hi as [U, 1, M] rows, from the table. The usable VRAM is only kept where
        eligible, which is all `after_terms` reads of it (its result is masked by eligibility)."""
        eu = self.sig_eu[lo:hi, None]
        return GpuTerms(elig=self.sig_elig[lo:hi, None], usable=eu, n_fit=self.sig_nfit[lo:hi, None], eu=eu,
                        okg=self.sig_ok[lo:hi, None].astype(bool))

    def _sums(self, sigs: I64, cols: slice | I64) -> tuple[F64, I64]:
        """Per content (its signatures [C, G]): the mix columns `cols` summed over its GPUs (whole numbers:
        the order of the sum does not matter)."""
        if sigs.shape[0] <= 64:
            return (self.sig_eu[sigs][..., cols].sum(axis=1, dtype=np.float64),
                    self.sig_ok[sigs][..., cols].sum(axis=1, dtype=np.int64))
        usable = self.sig_eu[sigs[:, 0]][:, cols].astype(np.float64)
        count = self.sig_ok[sigs[:, 0]][:, cols].astype(np.int64)
        for j in range(1, sigs.shape[1]):  # one column of GPUs at a time: far cheaper than a [C, G, M] gather
            usable += self.sig_eu[sigs[:, j]][:, cols]
            count += self.sig_ok[sigs[:, j]][:, cols]
        return usable, count

    def _add_contents(self, keys: I64, mix: MixArrays) -> None:
        lo, hi = len(self.contents) - keys.shape[0], len(self.contents)
        if hi > self.c_cpu.shape[0]:
            for name in ("c_sigs", "c_cpu", "c_free", "c_usable", "c_count", "c_value", "c_valued"):
                setattr(self, name, _grown(getattr(self, name), hi))
        sigs = keys[:, : self.g]
        self.c_sigs[lo:hi] = sigs
        self.c_cpu[lo:hi] = keys[:, self.g]
        feat = self.sig_feat[sigs]
        self.c_free[lo:hi] = np.where(feat[..., 0] != 0, feat[..., 2], 0).sum(axis=1)  # present, pool_free
        self.c_usable[lo:hi], self.c_count[lo:hi] = self._sums(sigs, slice(None))
        self.c_valued[lo:hi] = False

    def values(self, contents: I64, mix: MixArrays, extra: tuple[F64, Int, I64] | None = None) -> tuple[F64, F64]:
        """(V per content, the node value of `extra` (usable, count, free CPU) rows).

        V, what the node offers the mix now, is computed once per content and weights; the missing ones go
        through `node_value` together with the extra rows (one pass, not two)."""
        valued = self.c_valued[contents]
        todo = contents[~valued]
        if todo.size > 1:
            todo = np.sort(todo)  # distinct ids (plain np.unique imports numpy.ma on first use: ~35 ms)
            todo = todo[np.concatenate(([True], todo[1:] != todo[:-1]))]
        if extra is None:
            extra = (np.zeros((0, mix.size)), np.zeros((0, mix.size), dtype=np.int64), np.zeros(0, dtype=np.int64))
        if todo.size == 0 and extra[2].size == 0:
            return self.c_value[contents], np.zeros(0)
        if mix.size == 0:
            v = np.zeros(todo.size + extra[2].size)
        elif todo.size == 0:
            v = node_value(*extra, mix) @ mix.weight
        else:
            v = node_value(np.concatenate([self.c_usable[todo], extra[0]]),
                           np.concatenate([self.c_count[todo], extra[1]]),
                           np.concatenate([self.c_cpu[todo], extra[2]]), mix) @ mix.weight
        self.c_value[todo] = v[: todo.size]
        self.c_valued[todo] = True
        return self.c_value[contents], v[todo.size:]

    def remix(self, old: MixArrays, new: MixArrays) -> None:
        """Carry the table over to a new mix: columns of shapes the old mix had move (whole numbers, exact);
        only new shapes' columns are computed; every V is recomputed under the new weights."""
        where = {_column_key(old, j): j for j in range(old.size)}
        src = np.array([where.get(_column_key(new, j), -1) for j in range(new.size)], dtype=np.intp)
        keep = src >= 0
        fresh = np.flatnonzero(~keep)
        u, c = len(self.sigs), len(self.contents)
        eu = np.zeros((self.sig_eu.shape[0], new.size), dtype=np.float32)
        ok = np.zeros((self.sig_ok.shape[0], new.size), dtype=np.int8)
        elig = np.zeros((self.sig_elig.shape[0], new.size), dtype=bool)
        nfit = np.zeros((self.sig_nfit.shape[0], new.size), dtype=np.int8)
        usable = np.zeros((self.c_usable.shape[0], new.size))
        count = np.zeros((self.c_count.shape[0], new.size), dtype=np.int16)
        eu[:u, keep] = self.sig_eu[:u, src[keep]]
        ok[:u, keep] = self.sig_ok[:u, src[keep]]
        elig[:u, keep] = self.sig_elig[:u, src[keep]]
        nfit[:u, keep] = self.sig_nfit[:u, src[keep]]
        usable[:c, keep] = self.c_usable[:c, src[keep]]
        count[:c, keep] = self.c_count[:c, src[keep]]
        self.sig_eu, self.sig_ok, self.sig_elig, self.sig_nfit = eu, ok, elig, nfit
        self.c_usable, self.c_count = usable, count
        if fresh.size and u:
            t = GpuTerms.of(signature_rows(self.sig_feat[:u]), new.take(fresh))
            eu[:u, fresh] = t.eu[:, 0]
            ok[:u, fresh] = t.okg[:, 0]
            elig[:u, fresh] = t.elig[:, 0]
            nfit[:u, fresh] = t.n_fit[:, 0]
            if c:
                usable[:c, fresh], count[:c, fresh] = self._sums(self.c_sigs[:c], fresh)
        self.c_valued[:] = False


@dataclass
class PodTerms:
    """A pod's terms per GPU signature (grown as new signatures appear): candidate, what its unit takes, the
    slack left, and the change of each mix shape's usable VRAM and GPU count. They do not depend on the pod's
    CPU nor on its GPU count (beyond none or some), so pod shapes that differ only there share them."""

    tenant_id: int  # the pod's tenant and allowed GPU kinds as resolved when they were computed
    kind_ok: B
    n: int = 0
    cand: B = field(default_factory=lambda: np.zeros(0, dtype=bool))
    take: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    left: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    d_eu: F32 = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    d_ok: I8 = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int8))

    def extend(self, table: NodeTable, mix: MixArrays, p: PodView) -> None:
        hi = len(table.sigs)
        if hi <= self.n:
            return
        r = signature_rows(table.sig_feat[self.n: hi])
        take, take_mig, left = take_terms(r, p)
        cand = pod_candidates(r, p) if p.count > 0 else np.zeros(take.shape, dtype=bool)
        if self.d_eu.shape[1] != mix.size:  # first use: the terms live as long as the mix
            self.d_eu = np.zeros((self.cand.shape[0], mix.size), dtype=np.float32)
            self.d_ok = np.zeros((self.cand.shape[0], mix.size), dtype=np.int8)
        if hi > self.cand.shape[0]:
            for name in ("cand", "take", "left", "d_eu", "d_ok"):
                setattr(self, name, _grown(getattr(self, name), hi))
        self.cand[self.n: hi] = cand[:, 0]
        self.take[self.n: hi] = take[:, 0]
        self.left[self.n: hi] = left[:, 0]
        if mix.size and p.count > 0:
            d_eu, d_ok = after_terms(r, mix, p, take, take_mig, table.terms(self.n, hi))
            self.d_eu[self.n: hi] = d_eu[:, 0]
            self.d_ok[self.n: hi] = d_ok[:, 0]
        self.n = hi


def evaluate_interned(state: ClusterState, rows: I64, table: NodeTable, mix: MixArrays, p: PodView,
                      pt: PodTerms) -> Evaluation:
    """`evaluate` for these node rows, through the table: one evaluation per distinct (content, signature)."""
    sig = table.sig[rows]
    content = table.content[rows]
    n_rows, g = sig.shape
    free_node = table.c_free[content].astype(np.float64)
    m = mix.size
    inf = np.inf
    if p.count == 0:
        loss = np.zeros(n_rows)
        if m:
            before, after0 = table.values(content, mix, (table.c_usable[content], table.c_count[content],
                                                         table.c_cpu[content] - p.cpu))
            loss = np.round((before - after0) * _ROUND) / _ROUND
        # A CPU-only pod belongs where the GPUs are already taken: tie-break on free VRAM.
        return Evaluation(loss=loss, pack=free_node, select=np.zeros((n_rows, g), dtype=bool),
                          loss_g=np.full((n_rows, g), inf))
    cand = pt.cand[sig]
    leftover = np.where(cand, pt.left[sig], 0)
    if m == 0:
        key_loss = np.where(cand, 0.0, inf)
    else:
        key_loss = np.full((n_rows, g), inf)
        ri, gi = np.nonzero(cand)
        pc, ps = content[ri], sig[ri, gi]
        if ri.size > 32:  # one evaluation per distinct (content, signature); a few cost less than grouping
            _, first, inv = np.unique(pc * len(table.sigs) + ps, return_index=True, return_inverse=True)
            pc, ps = pc[first], ps[first]
        before, after = table.values(content, mix, (table.c_usable[pc] + pt.d_eu[ps],
                                                    table.c_count[pc] + pt.d_ok[ps], table.c_cpu[pc] - p.cpu))
        if ri.size:
            lg = np.round((table.c_value[pc] - after) * _ROUND) / _ROUND
            key_loss[ri, gi] = lg[inv] if ri.size > 32 else lg
    k = p.count
    idle = _view(state, "idle")[rows]
    if k == 1 and m > 0:  # the common case, in fewer steps: the chosen unit's loss is the row's least
        col, loss = first_unit(key_loss, leftover, idle)
        ar = np.arange(n_rows)
        hit = cand[ar, col]
        select = np.zeros((n_rows, g), dtype=bool)
        select[ar, col] = hit
        pack = free_node - np.where(hit, pt.take[sig[ar, col]], 0)
        return Evaluation(loss=loss, pack=pack, select=select, loss_g=key_loss)
    chosen, select, enough = rank_units(cand, key_loss, leftover, idle, k)
    if m == 0:
        loss = np.where(enough, 0.0, inf)
    elif k == 1:
        loss = np.where(enough, key_loss[np.arange(n_rows), chosen[:, 0]], inf)
    else:
        joint_usable = table.c_usable[content] + np.where(select[..., None], pt.d_eu[sig], 0).sum(axis=1)
        joint_count = table.c_count[content] + np.where(select[..., None], pt.d_ok[sig], 0).sum(axis=1)
        loss = before - node_value(joint_usable, joint_count, table.c_cpu[content] - p.cpu, mix) @ mix.weight
        loss = np.where(enough, np.round(loss * _ROUND) / _ROUND, inf)
    pack = free_node - np.where(select, pt.take[sig], 0).sum(axis=1)
    return Evaluation(loss=loss, pack=pack.astype(np.float64), select=select, loss_g=key_loss)


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
    refresh: int = 2048  # re-snapshot the learned mix every `refresh` pods (and at 1, 2, 4, ... before: a young mix changes fast)
    # Distinct shapes the learnt counts keep: past twice this many, the least frequent are dropped down to it
    # (their weight still counts in the coverage total), so a stream of one-off shapes cannot grow memory.
    max_shapes: int = 4096
    mix: Sequence[tuple[Any, float]] | None = None  # (Shape or PodDemand, count) pairs
    workload: Any = None  # a trace benchmark's TargetWorkload (FGD's target workload M), used as the mix
    use_workload: bool = True
    seed: int | None = None  # accepted for the benchmark harness; the policy is deterministic
    _counts: Counter[Shape] = field(default_factory=Counter)
    _dropped: float = 0.0  # weight of the GPU shapes pruned from _counts
    _observed: int = 0
    _next_refresh: int = 1
    _snapshot: list[tuple[Shape, float]] = field(default_factory=list)
    _arrays: MixArrays | None = None
    _mix_changed: bool = False  # the snapshot moved on since `_arrays` were built from it
    _state_ref: Any = None  # weakref to the state the arrays and the table were built for
    _table: NodeTable | None = None
    _cache: dict[tuple[object, ...], _CacheEntry] = field(default_factory=dict)
    _terms: dict[tuple[object, ...], PodTerms] = field(default_factory=dict)
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

    def __getstate__(self) -> dict[str, Any]:
        # The caches hold a weak reference to a state (which cannot be pickled): a copy starts them afresh.
        d = dict(self.__dict__)
        d.update(_state_ref=None, _table=None, _arrays=None, _cache={}, _terms={}, _ss_pick=None)
        return d

    # ------------------------------------------------------------------ mix
    def observe(self, pod: PodDemand) -> None:
        if not self.learn or not _learnable(pod):
            return
        self._counts[Shape.of(pod)] += 1
        self._observed += 1
        if len(self._counts) > 2 * self.max_shapes:
            self._prune()
        if self._observed >= self._next_refresh:
            self._next_refresh = (self._next_refresh * 2 if self._next_refresh < self.refresh
                                  else self._next_refresh + self.refresh)
            snapshot = top_mix(self._counts, self.weighting, self.coverage, self.max_types, self._dropped)
            if snapshot != self._snapshot:  # an unchanged mix keeps every cached score
                self._snapshot = snapshot
                self._mix_changed = True

    def _prune(self) -> None:
        """Keep the `max_shapes` heaviest shapes (top_mix's order), in the order first seen (its last tie-break)."""
        ranked = sorted(((s, c * shape_weight(s, self.weighting)) for s, c in self._counts.items()), key=_mix_order)
        keep = {s for s, _ in ranked[: self.max_shapes]}
        self._dropped += sum(w for s, w in ranked[self.max_shapes:] if s.gpu_count > 0)
        self._counts = Counter({s: c for s, c in self._counts.items() if s in keep})

    def learnt_shapes(self) -> int:
        """Distinct shapes the learnt counts hold now (at most 2 x max_shapes)."""
        return len(self._counts)

    def current_mix(self) -> list[tuple[Shape, float]]:
        """The mix the policy scores against now (shape, weight), weights summing to 1."""
        return list(self._snapshot)

    def _mix_arrays(self, state: ClusterState) -> MixArrays:
        return self._prepare(state)[0]

    def _prepare(self, state: ClusterState) -> tuple[MixArrays, NodeTable]:
        """The mix resolved against this state and the state's interned table, both brought up to date."""
        arr, table = self._arrays, self._table
        same = self._state_ref is not None and self._state_ref() is state
        g = _view(state, "present").shape[1]
        if not same or table is None or table.g != g or table.oversized(len(state)):
            arr = table = None
        if arr is None or self._mix_changed or arr.stale(state):
            new = MixArrays.build(self._snapshot, state, self.measure)
            if table is not None and arr is not None and arr.kind_ok.shape[0] == new.kind_ok.shape[0]:
                table.remix(arr, new)  # a mix refresh: keep what the shapes share with the old mix
            else:
                table = NodeTable(new, g)
            self._arrays, self._table, arr = new, table, new
            self._mix_changed = False
            self._state_ref = weakref.ref(state)
            self._cache.clear()
            self._terms.clear()
        assert table is not None
        table.update(state, arr)
        return arr, table

    def _pod_view(self, state: ClusterState, pod: PodDemand, mix: MixArrays, known: PodView | None = None) -> PodView:
        """The pod resolved against the state (`known`: a view to reuse when the state resolves it the same)."""
        kind_ok = state.allowed_kinds(pod.models)
        if known is not None and known.kind_ok is kind_ok and known.tenant_id == state.known_tenant_id(pod.tenant):
            return known
        return PodView(vram=pod.vram_mib, count=pod.gpu_count, cpu=pod.cpu_milli,
                       mode_ok=_MODE_OK[pod.isolation], kind_ok=kind_ok,
                       tenant_id=state.known_tenant_id(pod.tenant),
                       same_tenant=np.array([s.tenant in (None, pod.tenant) for s in mix.shapes], dtype=bool))

    # -------------------------------------------------------------- scoring
    def _entry(self, state: ClusterState, pod: PodDemand, rows_wanted: B | None) -> _CacheEntry:
        mix, table = self._prepare(state)
        key = pod.shape
        n = len(state)
        g = table.g
        e = self._cache.get(key)
        if e is None or e.version.shape[0] != n or e.select.shape[1] != g:
            e = _CacheEntry(version=np.full(n, -1, dtype=np.int64), loss=np.full(n, np.inf),
                            pack=np.zeros(n), select=np.zeros((n, g), dtype=bool), loss_g=np.full((n, g), np.inf),
                            view=e.view if e is not None else None)
            if len(self._cache) > 512:
                self._cache.clear()
                self._terms.clear()
            self._cache[key] = e
        stale = e.version != _view(state, "version")
        if rows_wanted is not None:
            stale &= rows_wanted
        rows = np.flatnonzero(stale)
        if rows.size:
            p = e.view = self._pod_view(state, pod, mix, e.view)
            tkey = (pod.vram_mib, pod.gpu_count > 0, pod.isolation, pod.models, pod.tenant)
            pt = self._terms.get(tkey)
            if pt is None or pt.tenant_id != p.tenant_id or pt.kind_ok is not p.kind_ok:
                pt = self._terms[tkey] = PodTerms(p.tenant_id, p.kind_ok)
            pt.extend(table, mix, p)
            ev = evaluate_interned(state, rows, table, mix, p, pt)
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
            pool = pres & pooled(mode, _view(state, "unit_cap"), mem)
            partial = pool & (pf > 0) & (pf < mem)
            cand = np.isfinite(e.loss_g) & (_view(state, "version") == e.version)[:, None]
            cand &= np.asarray(feasible_now, dtype=bool)[:, None]
            d_ss = sum_of_squares_delta(pf, mem, partial, pod.vram_mib, cand & pool)
            d_ss = np.where(cand & ~pool, 0.0, d_ss)
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
        e = self._cache.get(pod.shape)
        arr = self._arrays
        if (e is None or arr is None or self._mix_changed or self._state_ref is None or self._state_ref() is not state
                or e.version.shape[0] != len(state) or e.version[node_index] != _view(state, "version")[node_index]
                or arr.stale(state)):
            want = np.zeros(len(state), dtype=bool)
            want[node_index] = True
            e = self._entry(state, pod, want)  # else: scored just now, nothing changed since
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


def _learnable(pod: PodDemand) -> bool:
    return (0 <= pod.vram_mib <= _LEARN_MAX and 0 <= pod.gpu_count <= _LEARN_MAX_GPUS
            and 0 <= pod.cpu_milli <= _LEARN_MAX)


def make_frag_aware(**params: Any) -> FragAware:
    """The `frag-aware` policy (registered in `packing.policies`)."""
    return FragAware(name="frag-aware", **params)


VRAMFIT_DESCRIPTION = "vramfit's default: frag-aware, the mix learnt from the pods it sees"


def make_vramfit(**params: Any) -> FragAware:
    """The default policy `vramfit`. It learns its mix from the pods it sees, as it must in the extender, even
    where a benchmark offers FGD's target workload: on the trace that measured better (POLICY_NOTES.md,
    "Learning the mix")."""
    return FragAware(name="vramfit", **{"use_workload": False, **params})


def shapes_of_workload(wl: Any) -> list[tuple[Shape, float]]:
    """(shape, count) pairs from a `benchmarks.peers.workload_frag.TargetWorkload` (single tenant: tenant None)."""
    return [(Shape(vram_mib=int(d), gpu_count=int(k), tenant=None, models=frozenset(t) or None, cpu_milli=int(c)),
             float(w)) for c, d, k, t, w in zip(wl.cpu, wl.milli, wl.count, wl.models, wl.weight, strict=True)]
