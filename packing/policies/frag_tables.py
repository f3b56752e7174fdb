"""The measure's caching engine: GPU and node states interned per mix, so one placement re-scores one node.

Speed. A GPU's terms depend only on its own state and a node's sums only on its GPUs and free CPU, so
`NodeTable` interns both per mix: the per-GPU terms are computed once per distinct GPU state, each node's
value once per distinct node state (5,000 mixed nodes hold a few hundred) and shared by every pod shape; a pod
shape evaluates one (node state, GPU state) pair per distinct candidate. Per pod shape the per-node result is
cached by node version, so one placement re-scores only the node it changed; a mix refresh that keeps
shapes keeps their columns. `evaluate` is the same computation row by row, the reference the tests hold the
tables to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packing.arrays import F32, F64, I8, I16, I64, B, Int
from packing.groups import dense_groups
from packing.policies.frag_measure import (
    Evaluation,
    GpuTerms,
    PodView,
    Rows,
    after_terms,
    first_unit,
    node_value,
    pod_candidates,
    rank_units,
    take_terms,
)
from packing.policies.mix import ROUND, MixArrays
from packing.state import ClusterState
from packing.views import MAX_MIG_INSTANCES


@dataclass
class CacheEntry:
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


_SIG_VIEWS = ("present", "mode", "pool_free", "unit_max", "unit_cap", "vram", "slots_free", "tenant", "kind", "pooled")
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
    mig = state.mig_free[sel]
    f = np.empty((*mig.shape[:2], _SIG_WIDTH), dtype=np.int64)
    for j, name in enumerate(_SIG_VIEWS):
        f[..., j] = getattr(state, name)[sel]
    f[..., len(_SIG_VIEWS):] = mig
    return f


def signature_rows(f: I64) -> Rows:
    """Signatures [U, W] as state rows of one GPU each ([U, 1] views), for the row functions above."""
    col = f[:, None, :]
    mode = col[..., 1].astype(np.int8)
    return Rows(present=col[..., 0].astype(bool), mode=mode, pool_free=col[..., 2], unit_max=col[..., 3],
                slots_free=col[..., 6], pooled=col[..., 9].astype(bool), tenant=col[..., 7].astype(np.int32),
                kind=col[..., 8].astype(np.int32), mig_free=col[..., 10:], idle=np.zeros(col.shape[:2], dtype=bool),
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
        # [N] the row as the measure reads it (signatures in GPU order, free CPU, idle GPUs): rows with one id
        # evaluate alike for every pod, so a pass over many rows evaluates one of each (`evaluate_rows`).
        self.row: I64 = np.zeros(0, dtype=np.int64)
        self.rows = Interner()
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
        return (len(self.sigs) > 2 * n * self.g + 4096 or len(self.contents) > 4 * n + 4096
                or len(self.rows) > 4 * n + 4096)

    def update(self, state: ClusterState, mix: MixArrays, limit: int | None = None) -> bool:
        """Re-intern the rows whose node changed since (a placement changes one); at most `limit` of them (a
        table built in steps). -> whether changed rows are left."""
        ver = state.version
        n = ver.shape[0]
        if self.version.shape[0] != n:
            keep = min(n, self.version.shape[0])
            self.version = np.concatenate([self.version[:keep], np.full(n - keep, -1, dtype=np.int64)])
            self.sig = np.concatenate([self.sig[:keep], np.zeros((n - keep, self.g), dtype=np.int64)])
            self.content = np.concatenate([self.content[:keep], np.zeros(n - keep, dtype=np.int64)])
            self.row = np.concatenate([self.row[:keep], np.zeros(n - keep, dtype=np.int64)])
        rows = np.flatnonzero(self.version != ver)
        more = limit is not None and rows.size > limit
        if more:
            rows = rows[:limit]
        if rows.size == 0:
            return False
        feats = gpu_features(state, rows).reshape(-1, _SIG_WIDTH)
        ids, new = self.sigs.intern(feats)
        if new.size:
            self._add_signatures(feats[new], mix)
        sig = ids.reshape(rows.size, self.g)
        key = np.concatenate([np.sort(sig, axis=1), state.cpu_free[rows][:, None]], axis=1)
        cids, cnew = self.contents.intern(key)
        if cnew.size:
            self._add_contents(key[cnew], mix)
        self.sig[rows] = sig
        self.content[rows] = cids
        self.row[rows] = self.rows.intern(np.concatenate([sig, state.cpu_free[rows][:, None],
                                                          state.idle[rows].astype(np.int64)], axis=1))[0]
        self.version[rows] = ver[rows]
        return more

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


GROUP_ROWS = 64  # a pass over at least this many rows evaluates one row of each kind (`evaluate_rows`)


def evaluate_rows(state: ClusterState, rows: I64, table: NodeTable, mix: MixArrays, p: PodView,
                  pt: PodTerms) -> Evaluation:
    """`evaluate_interned` on these rows (the table current on them), evaluating one row of each `NodeTable.row`
    id and giving its answer to the rows that share it: a cluster's nodes are mostly alike, so a shape's first pass
    over every node costs as many evaluations as there are kinds of node state."""
    if rows.size < GROUP_ROWS:
        return evaluate_interned(state, rows, table, mix, p, pt)
    first, inv = dense_groups(table.row[rows], len(table.rows))
    if 2 * first.size > rows.size:
        return evaluate_interned(state, rows, table, mix, p, pt)
    ev = evaluate_interned(state, rows[first], table, mix, p, pt)
    return Evaluation(loss=ev.loss[inv], pack=ev.pack[inv], select=ev.select[inv], loss_g=ev.loss_g[inv])


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
            loss = np.round((before - after0) * ROUND) / ROUND
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
            lg = np.round((table.c_value[pc] - after) * ROUND) / ROUND
            key_loss[ri, gi] = lg[inv] if ri.size > 32 else lg
    k = p.count
    idle = state.idle[rows]
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
        loss = np.where(enough, np.round(loss * ROUND) / ROUND, inf)
    pack = free_node - np.where(select, pt.take[sig], 0).sum(axis=1)
    return Evaluation(loss=loss, pack=pack.astype(np.float64), select=select, loss_g=key_loss)


