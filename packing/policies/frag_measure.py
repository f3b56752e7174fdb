"""vramfit's measure of fragmentation: the usable VRAM a workload mix loses when a pod is placed.

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
shape under both measures, its weight split between them by the workload's CPU pressure (mostly FGD's where
CPU is plentiful, half each where it binds: `packing.policies.mix.fgd_share_at`): on the Alibaba trace and its
variants it beats either measure alone (benchmarks/POLICY_NOTES.md has every variant and its figure).


`evaluate` computes it row by row: the reference `packing.policies.frag_tables` is held to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from packing.arrays import F64, I64, B, Int
from packing.policies.mix import (
    ANY_TENANT,
    I64_MAX,
    ROUND,
    MixArrays,
)
from packing.state import ClusterState
from packing.views import INSTANCED_CODE, SHARED_CODE, TAKES_WHOLE_CODE


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
        v = {k: getattr(state, k)[rows] for k in ("present", "mode", "pool_free", "unit_max", "slots_free", "pooled",
                                                 "tenant", "kind", "mig_free", "idle", "cpu_free")}
        return Rows(present=v["present"], mode=v["mode"], pool_free=v["pool_free"], unit_max=v["unit_max"],
                    slots_free=v["slots_free"], pooled=v["pooled"], tenant=v["tenant"], kind=v["kind"],
                    mig_free=v["mig_free"], idle=v["idle"], cpu_free=v["cpu_free"])


def eligible(r: Rows, mix: MixArrays) -> B:
    """[R, G, M] the shape may use the GPU at all: mode, model, and one tenant per shared GPU."""
    mode_idx = np.where(r.mode < 0, -1, r.mode).astype(np.intp)
    e = mix.mode_ok[mode_idx] & mix.kind_ok[r.kind.astype(np.intp)] & r.present[..., None]
    foreign = (SHARED_CODE[mode_idx][..., None] & (r.tenant[..., None] >= 0) & (r.tenant[..., None] != mix.tenant_id)
               & (mix.tenant_id != ANY_TENANT))
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
    usable, n_fit = unit_terms(r.pool_free, r.unit_max, r.slots_free, INSTANCED_CODE[r.mode], r.mig_free, mix.vram)
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
    foreign = SHARED_CODE[mode_idx] & (r.tenant >= 0) & (r.tenant != p.tenant_id)
    fits = (r.unit_max >= p.vram) & (r.slots_free > 0)
    is_mig = INSTANCED_CODE[r.mode]
    if is_mig.any():
        fits = np.where(is_mig, ((r.mig_free >= p.vram) & (r.mig_free > 0)).any(axis=-1), fits)
    return ok & ~foreign & fits


def smallest_instance(mig_free: I64, v: int) -> I64:
    """[...] size of the smallest free MIG instance >= v (0 where none)."""
    s = np.where((mig_free >= v) & (mig_free > 0), mig_free, I64_MAX).min(axis=-1)
    return np.where(s == I64_MAX, 0, s)


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
    is_mig = INSTANCED_CODE[r.mode]
    take_mig = smallest_instance(r.mig_free, p.vram) if is_mig.any() else np.zeros_like(free)
    take = np.where(is_mig, take_mig, np.where(r.pooled, p.vram, r.unit_max))
    take = np.where(TAKES_WHOLE_CODE[r.mode], free, take)
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
        usable, n_fit = unit_terms(r.pool_free, r.unit_max, r.slots_free, INSTANCED_CODE[r.mode], r.mig_free, mix.vram,
                                   r.pooled, mix.units)
        return GpuTerms(elig, usable, n_fit, np.where(elig, usable, 0), (n_fit > 0) & elig)


def after_terms(r: Rows, mix: MixArrays, p: PodView, take: I64, take_mig: I64, t: GpuTerms) -> tuple[Any, I64]:
    """(change of usable, change of counts) per GPU and mix shape [R, G, M] if the pod's unit goes there."""
    is_mig = INSTANCED_CODE[r.mode]
    pf2 = r.pool_free - take
    slots2 = r.slots_free - 1
    thr2 = np.where(r.pooled, pf2, np.where(slots2 > 0, r.unit_max, 0))
    thr2 = np.where(TAKES_WHOLE_CODE[r.mode], 0, thr2)
    usable2, n_fit2 = unit_terms(pf2, thr2, slots2, np.zeros_like(is_mig), r.mig_free, mix.vram, r.pooled, mix.units)
    if is_mig.any():
        inst_big = (take_mig[..., None] >= mix.vram) & (take_mig[..., None] > 0)
        lost = np.where(inst_big, np.where(mix.units, 1, take_mig[..., None]), 0)
        usable2 = np.where(is_mig[..., None], t.usable - lost, usable2)
        n_fit2 = np.where(is_mig[..., None], t.n_fit - inst_big, n_fit2)
    # Joining an unowned shared GPU makes it the pod's tenant's failure domain.
    shared = SHARED_CODE[np.where(r.mode < 0, -1, r.mode).astype(np.intp)]
    elig2 = t.elig & (~shared[..., None] | p.same_tenant)
    d_eu = np.where(elig2, usable2, 0) - t.eu
    d_ok = ((n_fit2 > 0) & elig2).astype(np.int64) - t.okg
    return d_eu, d_ok


def first_unit(key_loss: F64, leftover: I64, idle: B) -> tuple[npt.NDArray[np.intp], F64]:
    """(column, its loss) per row: the first of `rank_units`' order, without a 2-D lexsort (slow on few rows)."""
    best = key_loss.min(axis=1)
    tie = key_loss == best[:, None]
    tie &= leftover == np.where(tie, leftover, I64_MAX).min(axis=1, keepdims=True)
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

    loss_g = np.round(loss_g * ROUND) / ROUND
    if p.count == 0:
        select = np.zeros((n_rows, g), dtype=bool)
        loss = np.round((before - after0) * ROUND) / ROUND
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
        loss = np.where(enough, np.round(loss * ROUND) / ROUND, inf)
    pack = free_node - np.where(select, take, 0).sum(axis=1)
    return Evaluation(loss=loss, pack=pack.astype(np.float64), select=select, loss_g=key_loss)

