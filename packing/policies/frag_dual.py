"""Dual prices of the packing LP as values of GPU gaps: one step of lookahead over the workload mix.

Online stochastic bin packing (Gupta & Radovanovic, "Interior-point-based online stochastic bin packing",
Oper. Res. 2020): when the item-size distribution is known, solve the packing LP for the expected
arrivals once, take the dual price of each size and value a free gap g of a bin by the best multiset of
sizes that fits in it,

    val(g) = max { sum_s y_s * c_s : sum_s s * c_s <= g, c_s >= 0 integer }     (an unbounded knapsack)

Placing an item of size d on a bin with free f then costs val(f) - val(f - d): by LP duality this is
>= y_d, with equality exactly on the placements an optimal fractional packing uses, so the rule prefers
gaps the expected workload fills well and avoids cutting gaps into slivers nobody asks for.

The LP (its code: `packing.policies.dual_lp`) is the arc-flow model of `benchmarks/lp_bound.py` (Valerio de
Carvalho 1999) over the GPUs of one VRAM size, extended with partly used GPUs as flow sources (for re-solving
on the current state):

    max  sum_{a,s} s x_{a,s}
    s.t. out(a) - in(a) <= b_a            for every fill level a < top  (b_a GPUs are filled to a now)
         sum_a x_{a,s} <= n_s             (expected arrivals of size s)

Whole-GPU tasks are items of the full size (k of them for a k-GPU task). The dual of a size's count row,
pi_s >= 0, is what an item of size s is worth beyond the GPU space it takes; y_s = s - pi_s is the GPU
space it is worth, and the gap values are in those units (milli-GPU on the trace). With node potentials
u_a the dual also reads u_a >= val(top - a), so val is the tightest gap value the LP's duals imply.

The policy (`FragDual`, registered as the default `vramfit`) keeps vramfit's measure
(`packing.policies.frag_aware.FragAware`) for node choice, whole-GPU, multi-GPU and CPU-only pods, and uses the
dual gap cost for pods that take part of a pooled GPU (time-slicing / pinned MPS): dual cost first, the measure's
loss among equal costs. The LP's size mix is the sizes of the pods observed (the scored mix's shapes until 200
have been seen). The benchmark's research variants (`benchmarks/research_policies.py`) combine the two otherwise.
Only GPUs of the reference size (the most common pooled GPU memory in the state) get a dual cost; on a
mixed fleet the others fall back to the measure alone (one LP per GPU size is not done). With `cpu_gap` (on in
the default) a node's gaps count only as far as its free CPU can fill them (`FragDual.cpu_cost`).
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from packing.arrays import F64, I64, B
from packing.groups import dense_groups
from packing.model import Assignment, GpuGrant, PodDemand
from packing.policies import frag_dual_refresh
from packing.policies.dual_lp import DualSolution, gap_values, grid_step, same_values, solve_duals
from packing.policies.dual_rows import DualRows, Reach, Stage, first_stage, merge
from packing.policies.frag_aware import FragAware
from packing.policies.frag_tables import GROUP_ROWS, CacheEntry, NodeTable
from packing.policies.mix import cpu_per_vram
from packing.state import ClusterState

# The LP's names are re-exported: callers have always found them here.
__all__ = ["LIVE_ROWS", "VRAMFIT", "DualSolution", "FragDual", "gap_values", "grid_step", "make_vramfit",
           "solve_duals"]

# ----------------------------------------------------------------------------------------------- policy
# Live mode (`FragDual.go_live`): states of at least LIVE_ROWS nodes defer their re-solves and mix rebuilds (below
# it a full rescore costs ~0.2 ms, less than handing it over); a deferred rebuild rescores, in short steps
# (`frag_dual_refresh`), the REWARM_SHAPES shapes scored last, so none of them pays a full rescore on its next call.
LIVE_ROWS = 1000
REWARM_SHAPES = 64


@dataclass
class FragDual(FragAware):
    """vramfit's measure plus dual-price gap values from the packing LP of the expected workload."""

    name: str = "vramfit"
    quantum: float = 1.0  # dual costs within the same multiple of this tie, and the loss decides (`_keys`)
    resolve: int = 0  # > 0: re-solve on the current state every `resolve` arrivals (remaining arrivals)
    horizon: float = 1.0  # expected arrivals up to horizon x cluster GPU capacity (the 100 % point)
    min_remaining: float = 0.05  # keep re-solving with at least this share of capacity still to come
    cells: int = 100  # grid cells per GPU
    # Value a node's gaps only as far as its free CPU can still bring pods to fill them (`cpu_cost`).
    cpu_gap: bool = False
    _seen: Counter[tuple[int, int]] = field(default_factory=Counter)  # (per-GPU VRAM, count) -> pods seen
    _since_solve: int = 0
    _dual: DualSolution | None = None
    _ref_mem: int = 0
    _pick: tuple[tuple[object, ...], I64, npt.NDArray[np.intp]] | None = None
    _rho: tuple[object, float] | None = None  # (the mix snapshot it was read from, CPU per VRAM unit)
    # Live (`go_live`): on states of at least this many nodes, LP re-solves and mix rebuilds wait for
    # `refresh_steps` and the verbs use the last finished ones; 0: everything synchronously (offline, tests).
    _live_rows: int = 0
    _wake: Callable[[], None] | None = None  # told when work is left for `refresh_steps`
    _due: set[str] = field(default_factory=set)  # "lp", "mix": work left for `refresh_steps`
    # The pod shapes scored most recently, newest last, with a pod of each: what a mix rebuild scores ahead.
    _recent: OrderedDict[tuple[object, ...], PodDemand] = field(default_factory=OrderedDict)
    # Per pod shape: the dual rule's first stage and reach, kept row by row (`packing.policies.dual_rows`).
    _dual_rows: dict[tuple[object, ...], DualRows] = field(default_factory=dict)
    _reaches: dict[tuple[object, ...], Reach] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.cpu_gap, bool):
            raise ValueError(f"cpu_gap must be a bool, got {self.cpu_gap!r}")

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a planner's fork, a pickle) computes synchronously: its results must not wait on a thread.
        d = super().__getstate__()
        d.update(_live_rows=0, _wake=None, _due=set(), _recent=OrderedDict(), _dual_rows={}, _reaches={})
        return d

    # ---------------------------------------------------------------------------------- the LP's input
    def observe(self, pod: PodDemand) -> None:
        if self._deferring(None):
            # Count the pod, but leave a mix refresh it would trigger to `refresh_steps`.
            due = self._next_refresh
            self._next_refresh = sys.maxsize
            try:
                super().observe(pod)
            finally:
                self._next_refresh = due
            if self._observed >= due:
                self._want("mix")
        else:
            super().observe(pod)
        if pod.gpu_count > 0 and pod.vram_mib > 0:
            self._seen[(pod.vram_mib, pod.gpu_count)] += 1
        self._since_solve += 1

    def size_mix(self) -> dict[tuple[int, int], float]:
        """(per-GPU VRAM, GPU count) -> probability among GPU pods, for the LP: the sizes of the pods seen, once
        there are 200 of them; before, the shapes of the scored mix."""
        mix: Counter[tuple[int, int]] = Counter()
        if sum(self._seen.values()) >= 200:
            mix.update({k: float(v) for k, v in self._seen.items()})
        else:
            for s, w in self.current_mix():
                if s.gpu_count > 0 and s.vram_mib > 0:
                    mix[(s.vram_mib, s.gpu_count)] += w  # type: ignore[assignment]
        total = float(sum(mix.values()))
        return {k: float(v) / total for k, v in mix.items()} if total > 0 else {}

    def _reference(self, state: ClusterState) -> tuple[B, int]:
        """Pooled GPUs of the reference size (the dual cost applies to them) and that size."""
        mem = state.vram
        pres = state.present
        pool = pres & state.pooled
        if not self._ref_mem:
            sizes = mem[pool]
            if sizes.size == 0:
                return pool & False, 0
            vals, counts = np.unique(sizes, return_counts=True)
            self._ref_mem = int(vals[np.argmax(counts)])
        return pool & (mem == self._ref_mem), self._ref_mem

    def _solve(self, state: ClusterState) -> DualSolution | None:
        problem = self._lp_problem(state)
        return solve_duals(*problem) if problem is not None else None

    def _lp_problem(self, state: ClusterState) -> tuple[dict[int, float], dict[int, float], int, int] | None:
        """solve_duals's (expected, gpus_by_fill, top, step) on this state, or None (nothing to solve): read
        off the state and the mix, so the solve itself may run without the state's lock."""
        ref, full = self._reference(state)
        mix = self.size_mix()
        if not full or not mix:
            return None
        sizes = sorted({min(v, full) for v, _ in mix})
        step = grid_step(sizes, full, self.cells)
        top = full // step
        capacity = float(full) * float(ref.sum())
        mean = sum(p * min(v, full) * k for (v, k), p in mix.items())
        if self.resolve > 0:
            # Remaining expected arrivals: what fills the reference GPUs up to horizon x their capacity from
            # what they hold now, at least min_remaining x capacity. Read off the state, not counted from
            # arrivals, so it stays true where pods also leave (a live cluster), not only in a replay.
            free = np.clip(state.pool_free[ref], 0, full)
            used = capacity - float(free.sum())
            left = max(self.horizon * capacity - used, self.min_remaining * capacity)
            fill = top - free // step  # cells in use (rounded up)
            levels, counts = np.unique(fill, return_counts=True)
            # full GPUs take nothing more
            by_fill = {a: float(n) for a, n in zip(levels.tolist(), counts.tolist(), strict=True) if a != top}
        else:
            left = self.horizon * capacity
            by_fill = {0: float(ref.sum())}
        pods = left / max(mean, 1e-9)
        expected: Counter[int] = Counter()
        for (v, k), p in mix.items():
            cells = -(-min(v, full) // step)  # an item takes whole cells
            expected[cells] += p * pods * k  # type: ignore[assignment]
        return dict(expected), by_fill, top, step

    def duals(self, state: ClusterState) -> DualSolution | None:
        """The current dual solution (solved on first use and, with `resolve`, every `resolve` arrivals). Live
        on a large state (`go_live`), a re-solve is left to `refresh_steps` and the last solution is used."""
        if self._dual is None or (self.resolve > 0 and self._since_solve >= self.resolve):
            if self._dual is not None and self._deferring(state):
                self._want("lp")
                return self._dual
            self._adopt(self._solve(state))
            self._since_solve = 0
        return self._dual

    def _adopt(self, sol: DualSolution | None) -> None:
        """Use `sol` from now on. The kept first stages (`_dual_rows`) made under a solution of the same values
        stay valid: they are re-keyed to `sol` rather than recomputed."""
        old = self._dual
        if same_values(old, sol):
            for rows in self._dual_rows.values():
                if rows.key[1] is old:
                    rows.key = (rows.key[0], sol, *rows.key[2:])
        self._dual = sol

    # -------------------------------------------------------------------------------------- scoring
    def dual_cost(self, state: ClusterState, pod: PodDemand, ref: tuple[B, int] | None = None) -> F64:
        """[N, G] val(f) - val(f - d) on the reference GPUs (VRAM units), 0 elsewhere. ref: `_reference(state)`,
        where the caller has it already."""
        mask, full = ref if ref is not None else self._reference(state)
        return self._cost_rows(state, pod, mask, full, self.duals(state), slice(None))

    def _cost_rows(self, state: ClusterState, pod: PodDemand, mask: B, full: int, sol: DualSolution | None,
                   rows: npt.NDArray[np.intp] | slice, rho: float | None = None) -> F64:
        """`dual_cost` on some rows ([r, G]) under the LP solution `sol` (and, with `rho`, that CPU per VRAM unit
        in place of the mix in use's); `mask`: the reference GPUs of every row. Each row's cost reads that row
        alone."""
        pf = state.pool_free[rows]
        if sol is None or not full:
            return np.zeros(pf.shape)
        mask = mask[rows]
        free = np.clip(pf, 0, full)
        f = free // sol.step
        after = np.clip(pf - pod.vram_mib, 0, full) // sol.step
        cost = sol.val[f] - sol.val[after]
        if self.cpu_gap:
            cost = self.cpu_cost(state, pod, np.where(mask, free, 0), np.where(mask, sol.val[f], 0.0), cost, rows,
                                 rho)
        return np.where(mask & (pf >= pod.vram_mib), cost, 0.0)

    def cpu_cost(self, state: ClusterState, pod: PodDemand, free: I64, val: F64, cost: F64,
                 rows: npt.NDArray[np.intp] | slice = slice(None), rho: float | None = None) -> F64:
        """[N, G] the dual cost once a node's gaps count only as far as its free CPU can fill them.

        The LP prices GPU space alone, so a gap on a node whose CPU is spent kept its full value and the rule
        cut other gaps to spare it, while pods that would have filled it found no CPU there (such
        CPU-dead gaps were most of what vramfit left over FGD on the multi-GPU variants). A node's gaps are
        worth V = sum_g val(f_g) x min(1, cpu_free / (rho x sum_g f_g)), rho the CPU per VRAM unit of the pod
        mix (what filling a gap brings along). A placement costs the larger of its GPU cost and V - V' (V'
        after it takes its VRAM and CPU): it pays for the gap value its CPU leaves unfillable and is never
        paid for using a node already short of CPU (a bonus there pulled pods off the scarce GPU models, which
        the measure then no longer weighed). free, val: [N, G] free VRAM f and val(f) on the reference GPUs, 0
        elsewhere; cost: the GPU cost; all three, with `rows`, of those rows only. rho: in place of the mix's."""
        rho = self._cpu_per_vram() if rho is None else rho
        if rho <= 0 or pod.cpu_milli <= 0:
            return cost
        gap = free.sum(axis=1, keepdims=True).astype(np.float64)
        worth = val.sum(axis=1, keepdims=True)
        cpu = state.cpu_free[rows].astype(np.float64).reshape(-1, 1)
        before = worth * np.minimum(1.0, cpu / np.maximum(rho * gap, 1e-9))
        cpu_after = np.maximum(cpu - pod.cpu_milli, 0.0)
        after = (worth - cost) * np.minimum(1.0, cpu_after / np.maximum(rho * (gap - pod.vram_mib), 1e-9))
        return np.maximum(cost, before - after)

    def _cpu_per_vram(self) -> float:
        """rho: CPU (milli) per VRAM unit the GPU pods of the mix ask for, count-weighted; 0 if none ask."""
        snap = self._snapshot
        if self._rho is None or self._rho[0] is not snap:
            self._rho = (snap, cpu_per_vram(snap))
        return self._rho[1]

    def _rows_rho(self) -> float:
        """The CPU-per-VRAM ratio the kept rows are valid for (none without `cpu_gap`)."""
        return self._cpu_per_vram() if self.cpu_gap else 0.0

    def _keys(self, loss_g: F64, cost: F64) -> F64:
        """[N, G] the key to minimise per GPU (inf stays inf): the dual cost rounded to `quantum` VRAM units
        first, the measure's loss second."""
        big = 1e7
        return np.round(cost / self.quantum) * big + np.minimum(loss_g, big / 10)

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        self._pick = None
        if self._live_rows:
            self._recent[pod.shape] = pod
            self._recent.move_to_end(pod.shape)
            if len(self._recent) > REWARM_SHAPES:
                self._recent.popitem(last=False)
        if pod.gpu_count != 1:
            return super().score(state, pod, feasible_now)
        feas = np.asarray(feasible_now, dtype=bool)
        e = self._entry(state, pod, feas)  # fills the cache for the feasible rows
        reference = self._reference(state)
        if self._by_rows():
            return self._score_by_rows(state, pod, feas, e, reference)
        ref = reference[0]
        use = ref & np.isfinite(e.loss_g)
        if not use.any():
            return self._measure_score(state, pod, feas, e)
        cand = np.isfinite(e.loss_g) & feas[:, None]
        cost = self.dual_cost(state, pod, reference)
        loss_g = e.loss_g
        if self._tail:
            loss_g = loss_g + self.home_loss(state, pod, e.select, feas & np.isfinite(e.loss))[:, None]
        return self._rank(state, pod, feasible_now, loss_g, cand, ref, cost)

    def _rank(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray, loss_g: F64, cand: B, ref: B,
              cost: F64) -> F64:
        """Node scores from the per-GPU loss and dual cost (a research variant ranks otherwise)."""
        return self._merge(state, pod, loss_g, cand, ref, cost)

    def _merge(self, state: ClusterState, pod: PodDemand, loss_g: F64, cand: B, ref: B, cost: F64) -> F64:
        """Node scores when the dual cost prices only the reference GPUs (`dual_rows.merge`), over every row."""
        scores, pick = merge(first_stage(loss_g, cand, ref, self._keys(loss_g, cost)))
        self._pick = (pod.shape, state.version.copy(), pick)
        return scores

    # ------------------------------------------------------------------- scoring kept row by row
    def _by_rows(self) -> bool:
        """Whether scores are kept row by row (`packing.policies.dual_rows`): the default's own key and ranking
        (a research variant that ranks otherwise computes every row each time)."""
        cls = type(self)
        return cls._keys is FragDual._keys and cls._rank is FragDual._rank

    def _score_by_rows(self, state: ClusterState, pod: PodDemand, feas: B, e: CacheEntry,
                       reference: tuple[B, int]) -> F64:
        """`score` of a single-GPU pod with its first stage kept per row: the same scores and picks as the pass
        over every row, computed on the rows whose inputs moved since the shape was last scored."""
        ref, full = reference
        if not self._reach(state, pod, e, ref).use.any():
            return self._measure_score(state, pod, feas, e)
        # The homes term joins the measure's loss, so it orders choices of equal dual cost (added to the dual cost
        # itself it pulled pods off the GPUs the LP prices: 10.7 % on the multigpu60 twin against 2.1).
        h = (self.home_loss(state, pod, e.select, feas & np.isfinite(e.loss)) if self._tail
             else np.zeros(len(state)))
        sol = self.duals(state)
        rho = self._rows_rho()
        rows = self._dual_rows_for(pod, e, sol, full, rho, len(state))
        redo = rows.stale(state.version, e.version, feas, h)
        if redo.size:
            rows.put(redo, state.version[redo], e.version[redo], feas[redo], h[redo],
                     self._stage_rows(state, pod, e, feas, h if self._tail else None, ref, full, sol, rho, redo))
        scores, pick = merge(rows.stage)
        self._pick = (pod.shape, state.version.copy(), pick)
        return scores

    def _reach(self, state: ClusterState, pod: PodDemand, e: CacheEntry, ref: B) -> Reach:
        """Per row, whether a reference GPU has a finite loss (the dual rule applies to the shape where any does)."""
        n = len(state)
        got = self._reaches.get(pod.shape)
        if got is None or not got.fits(e, n):
            got = self._reaches[pod.shape] = Reach.empty(e, n)
        stale = got.stale(state.version, e.version)
        if not stale.size:
            return got
        # A new entry: every row, through views rather than copies.
        redo: npt.NDArray[np.intp] | slice = slice(None) if stale.size == n else stale
        got.use[redo] = (ref[redo] & np.isfinite(e.loss_g[redo])).any(axis=1)
        got.sver[redo], got.ever[redo] = state.version[redo], e.version[redo]
        return got

    def _dual_rows_for(self, pod: PodDemand, e: CacheEntry, sol: DualSolution | None, full: int, rho: float,
                       n: int) -> DualRows:
        key = (e, sol, rho, full)
        got = self._dual_rows.get(pod.shape)
        if got is None or not got.fits(key, n):
            if len(self._dual_rows) > 512:
                self._dual_rows.clear()
                self._reaches.clear()
            got = self._dual_rows[pod.shape] = DualRows.empty(key, n)
        return got

    def _stage_rows(self, state: ClusterState, pod: PodDemand, e: CacheEntry, feas: B, h: F64 | None, ref: B,
                    full: int, sol: DualSolution | None, rho: float, rows: npt.NDArray[np.intp],
                    table: NodeTable | None = None) -> Stage:
        """The first stage on `rows`, from the same inputs and operations as the pass over every row (`h`: the
        homes term, None without one). Only rows the pod fits are computed, and of rows alike (`_alike`) one."""
        fits = feas[rows]
        live = rows[fits]
        alike = self._alike(state, e, h, live, self._table if table is None else table)
        one = live if alike is None else live[alike[0]]
        loss_g = e.loss_g[one]
        cand = np.isfinite(loss_g)
        if h is not None:
            loss_g = loss_g + h[one][:, None]
        cost = self._cost_rows(state, pod, ref, full, sol, one, rho)
        st = first_stage(loss_g, cand, ref[one], self._keys(loss_g, cost))
        if alike is not None:
            st = st.take(alike[1])
        return st if live.size == rows.size else st.spread(fits)

    @staticmethod
    def _alike(state: ClusterState, e: CacheEntry, h: F64 | None, rows: npt.NDArray[np.intp],
               table: NodeTable | None) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
        """(one row of each kind, each row's kind) among `rows` when grouping saves work, else None. Rows are alike
        when the table holds them current with one `NodeTable.row` id (the same GPUs in order, free CPU and idle
        GPUs: the same reference mask, free VRAM and CPU), the measure's entry is current on them (the same loss)
        and no homes term is added; any other row is a kind of its own."""
        if table is None or rows.size < GROUP_ROWS or table.version.shape[0] != state.version.shape[0]:
            return None
        now = state.version[rows]
        ok = (table.version[rows] == now) & (e.version[rows] == now)
        if h is not None:
            ok &= h[rows] == 0
        bound = len(table.rows)  # ids past the table's: the rows not alike, each a kind of its own
        first, inv = dense_groups(np.where(ok, table.row[rows], bound + np.arange(rows.size)), bound + rows.size)
        return None if 2 * first.size > rows.size else (first, inv)

    # ------------------------------------------------------------------------ live: deferred work
    def go_live(self, wake: Callable[[], None], min_rows: int = LIVE_ROWS) -> None:
        """Defer LP re-solves and mix rebuilds on states of at least `min_rows` nodes to `refresh_steps`
        (`wake()` is called, under the caller's lock, when there is work for it); the verbs meanwhile use the last
        finished LP solution and mix. Smaller states keep computing synchronously (their work is cheap)."""
        self._wake = wake
        self._live_rows = max(1, int(min_rows))

    def refresh_due(self) -> bool:
        return bool(self._due)

    def _deferring(self, state: ClusterState | None) -> bool:
        """Whether a re-solve or rebuild that is due now waits for `refresh_steps`: live, on a large state that
        already has a mix and arrays (the first ones are made synchronously: there is nothing older to use)."""
        if not self._live_rows or self._arrays is None or not self._snapshot or self._state_ref is None:
            return False
        scored = self._state_ref()
        return scored is not None and (state is None or state is scored) and len(scored) >= self._live_rows

    def _want(self, work: str) -> None:
        if work not in self._due:
            self._due.add(work)
            if self._wake is not None:
                self._wake()

    def refresh_steps(self, state: ClusterState) -> Iterator[bool]:
        """The deferred work (`go_live`), one short step per `next` (`frag_dual_refresh.steps`)."""
        return frag_dual_refresh.steps(self, state)

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        pk = self._pick
        if (pk is None or pod.gpu_count != 1 or pk[0] != pod.shape
                or pk[1][node_index] != state.version[node_index]):
            return super().choose(state, node_index, pod)
        j = int(pk[2][node_index])
        if j < 0:  # the node's best is a GPU outside the reference size: the measure's choice
            return super().choose(state, node_index, pod)
        node = state.node_at(node_index)
        gu = state.usage(node.name).gpus[j]
        if gu.rules.instanced:  # the dual cost never applies to MIG: keep the measure's choice
            return super().choose(state, node_index, pod)
        return Assignment(node=node.name, gpus=(GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib),))


# The default policy `vramfit` (POLICY_NOTES.md, D18; it beat the measure alone on every variant of the suite,
# held-out rows included): the LP re-solved on the current state every 64 pods, mix learnt from the pods it
# sees, each node's gaps valued as far as its free CPU can fill them (`cpu_cost`: lower on 14 of the 16 variant
# rows, POLICY_NOTES.md "The dual cost sees CPU"), and the homes of the multi-GPU shapes the mix leaves out kept
# as far as their expected arrivals need them (`packing.policies.homes`; POLICY_NOTES.md "Homes for the heavy
# shapes"). GPUs outside the reference size keep the measure alone (module docstring).
VRAMFIT = {"resolve": 64, "cpu_gap": True, "homes": 4.0, "homes_scarce": True}


VRAMFIT_DESCRIPTION = ("vramfit's default: the frag-aware measure with the packing LP's dual prices as GPU gap "
                       "values (lex-dual, observed sizes, re-solved every 64 pods, mix learnt, gaps valued as far as "
                       "each node's CPU can fill them, homes of the rare multi-GPU shapes kept while scarce)")


def make_vramfit(**params: Any) -> FragDual:
    """The default policy `vramfit` (`VRAMFIT`); params override its settings."""
    return FragDual(name="vramfit", **{**VRAMFIT, **params})
