"""The default policy's deferred work (`FragDual.refresh_steps`): LP re-solves and mix rebuilds done in short steps
off the request path (`extender/refresh.py` runs them), with the recent shapes' scores rewarmed under the new
solution or mix beside the ones in use and swapped in whole (`docs/extender-speed.md`)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from packing.arrays import B
from packing.groups import dense_groups
from packing.model import PodDemand
from packing.policies.dual_lp import DualSolution, same_values, solve_duals
from packing.policies.dual_rows import DualRows
from packing.policies.frag_tables import CacheEntry, NodeTable, PodTerms
from packing.policies.homes import HomeBook
from packing.policies.mix import MixArrays, PodShape, cpu_per_vram, cpu_pressure, fgd_share_at, top_mix
from packing.state import ClusterState

if TYPE_CHECKING:
    from packing.policies.frag_dual import FragDual

# A deferred rebuild scores about REFRESH_ROWS distinct node rows per step (rows alike are scored once,
# `_rows_per_step`): ~1 ms at 5,000 nodes, about the longest a verb waits behind it. A fresh table, where the one in
# use cannot be carried over, is interned TABLE_ROWS a step.
REFRESH_ROWS = 1250
TABLE_ROWS = 250  # interning a row costs more than scoring it


@dataclass
class _Parts:
    """A mix's arrays and the table and per-shape caches built under it."""

    arrays: MixArrays | None
    table: NodeTable | None
    cache: dict[tuple[object, ...], CacheEntry]
    terms: dict[tuple[object, ...], PodTerms]
    dual_rows: dict[tuple[object, ...], DualRows] = field(default_factory=dict)


def steps(p: FragDual, state: ClusterState) -> Iterator[bool]:
    """The deferred work (`go_live`), one short step per `next`; each value yielded says whether the next
    step needs the caller's lock (the state's writers' lock; the first step always does). The LP is solved
    without it; everything else reads or swaps the policy's and the state's arrays under it."""
    if "mix" in p._due:
        yield from _mix_steps(p, state)
    if "lp" in p._due:
        yield from _lp_steps(p, state)


def _lp_steps(p: FragDual, state: ClusterState) -> Iterator[bool]:
    p._due.discard("lp")
    if p._dual is None or p.resolve <= 0 or p._since_solve < p.resolve:
        return
    problem, counted = p._lp_problem(state), p._since_solve
    yield False
    sol = solve_duals(*problem) if problem is not None else None
    yield True
    warm: dict[tuple[object, ...], DualRows] = {}
    if not same_values(p._dual, sol):  # else the kept stages hold as they are (`FragDual._adopt`)
        yield from _rewarm_dual(p, state, sol, warm, _rows_per_step(p._table, len(state)))
    p._adopt(sol)
    p._dual_rows.update(warm)
    p._since_solve = max(0, p._since_solve - counted)  # arrivals since its input was read


def _rewarm_dual(p: FragDual, state: ClusterState, sol: DualSolution | None,
                 warm: dict[tuple[object, ...], DualRows], per_step: int) -> Iterator[bool]:
    """Into `warm`: the recent shapes' kept first stage under a new LP solution."""
    for pod in reversed(list(p._recent.values())):
        old, e = p._dual_rows.get(pod.shape), p._cache.get(pod.shape)
        if old is not None and e is not None and old.key[0] is e:
            yield from _warm_rows(p, state, pod, e, old, sol, p._rows_rho(), bool(p._tail), warm, per_step)


def _warm_rows(p: FragDual, state: ClusterState, pod: PodDemand, e: CacheEntry, old: DualRows,
               sol: DualSolution | None, rho: float, homes: bool,
               into: dict[tuple[object, ...], DualRows], per_step: int,
               table: NodeTable | None = None) -> Iterator[bool]:
    """Into `into`: the shape's kept first stage on the rows `old` holds, under the measure's entry `e`, the LP
    solution `sol` and the ratio `rho` (the next ones, built beside those in use), `per_step` rows a step,
    each under the caller's lock, from the feasibility and homes term (`homes`: the next mix has one) the
    rows were last scored with. A row that moves meanwhile is redone by the next verb like any moved row."""
    n = len(state)
    if old.sver.shape[0] != n:
        return
    ref, full = p._reference(state)
    new = DualRows.empty((e, sol, rho, full), n)
    todo = np.flatnonzero(old.sver >= 0)
    for lo in range(0, todo.size, per_step):
        if len(state) != n:
            return  # the node set moved under it: the verbs start afresh
        rows = todo[lo: lo + per_step]
        new.put(rows, state.version[rows], e.version[rows], old.feas[rows], old.h[rows],
                p._stage_rows(state, pod, e, old.feas, old.h if homes else None, ref, full, sol, rho, rows, table))
        yield True
    into[pod.shape] = new


def _mix_steps(p: FragDual, state: ClusterState) -> Iterator[bool]:
    """FragAware.observe's refresh, then the arrays, the table and the recent shapes' scores under the new
    mix built beside the ones in use, row chunk by row chunk, and swapped in whole."""
    p._due.discard("mix")
    while p._next_refresh <= p._observed:
        p._next_refresh = (p._next_refresh * 2 if p._next_refresh < p.refresh
                           else p._next_refresh + p.refresh)
    snapshot = top_mix(p._counts, p.weighting, p.coverage, p.max_types, p._dropped)
    tail = p._tail_of(snapshot)
    pressure: dict[PodShape, float] = dict(p._counts)
    if snapshot == p._snapshot:  # an unchanged mix keeps every cached score
        p._tail, p._per_pod = tail, None
        return
    yield True
    share = p.fgd_share if p.fgd_share is not None else fgd_share_at(cpu_pressure(pressure, state))
    new = MixArrays.build(snapshot, state, p.measure, share, p.scarcity)
    yield True
    table = _table_for(p, state, new)
    parts = _Parts(new, table, {}, {})
    yield True
    while _current(p, state, new) and table.update(state, new, TABLE_ROWS):
        yield True
    n = len(state)
    rho = cpu_per_vram(snapshot) if p.cpu_gap else 0.0
    per_step = _rows_per_step(table, n)
    for pod in reversed(list(p._recent.values())):
        for rows in _rows_scored(p, pod, n, per_step):
            if not _current(p, state, new) or len(state) != n:
                break
            with _scoring_under(p, parts):
                p._entry(state, pod, rows)
            yield True
        old, e = p._dual_rows.get(pod.shape), parts.cache.get(pod.shape)
        if old is not None and e is not None and _current(p, state, new):
            yield from _warm_rows(p, state, pod, e, old, p._dual, rho, bool(tail), parts.dual_rows, per_step,
                                  parts.table)
    p._snapshot, p._pressure_counts, p._tail, p._per_pod = snapshot, pressure, tail, None
    if not _current(p, state, new) or table.oversized(len(state)):
        p._mix_changed = True  # the state moved under the rebuild: the next score rebuilds in place
        return
    p._arrays, p._table, p._cache, p._terms = parts.arrays, parts.table, parts.cache, parts.terms
    p._dual_rows = parts.dual_rows
    p._mix_changed = False
    if p._tail:
        p._home_book = HomeBook(p._tail, new)
        p._home_book.update(state)


def _rows_scored(p: FragDual, pod: PodDemand, n: int, per_step: int) -> Iterator[B]:
    """The rows the shape was scored on under the mix in use (the ones it was feasible on: a verb scores
    those alone), `per_step` at a time, as masks over the n rows. Read as each chunk is asked for."""
    old = p._cache.get(pod.shape)
    if old is None or old.version.shape[0] != n:
        return
    todo = np.flatnonzero(old.version >= 0)
    for lo in range(0, todo.size, per_step):
        rows = np.zeros(n, dtype=bool)
        rows[todo[lo: lo + per_step]] = True
        yield rows


def _rows_per_step(table: NodeTable | None, n: int) -> int:
    """Rows a rewarm step covers: about REFRESH_ROWS distinct ones. A pass over many rows scores one row of each
    `NodeTable.row` kind, so on a cluster of mostly alike nodes a step's cost follows its kinds, not its rows."""
    if table is None or table.row.shape[0] != n or n == 0 or not len(table.rows):
        return REFRESH_ROWS
    kinds = dense_groups(table.row, len(table.rows))[0].size
    return max(REFRESH_ROWS, REFRESH_ROWS * n // max(kinds, 1))


def _table_for(p: FragDual, state: ClusterState, new: MixArrays) -> NodeTable:
    """A table for the new mix beside the one in use: a copy of it carried over (`NodeTable.remix`, as a
    synchronous refresh does in place), or a fresh one, interned in steps, where it cannot be."""
    old, arr = p._table, p._arrays
    if old is None or arr is None or old.g != state.present.shape[1] or old.oversized(len(state)) \
            or arr.kind_ok.shape[0] != new.kind_ok.shape[0]:
        return NodeTable(new, state.present.shape[1])
    table = copy.deepcopy(old)
    table.remix(arr, new)
    return table


def _current(p: FragDual, state: ClusterState, new: MixArrays) -> bool:
    """The state is still the one the policy scores, with the tenants and GPU kinds `new` was resolved
    against."""
    return p._state_ref is not None and p._state_ref() is state and not new.stale(state)


@contextmanager
def _scoring_under(p: FragDual, parts: _Parts) -> Iterator[None]:
    """Score with `parts` in place of the mix in use, within one step (the caller's lock held throughout)."""
    held = _Parts(p._arrays, p._table, p._cache, p._terms), p._mix_changed
    p._arrays, p._table, p._cache, p._terms = parts.arrays, parts.table, parts.cache, parts.terms
    p._mix_changed = False
    try:
        yield
    finally:
        parts.cache, parts.terms = p._cache, p._terms  # `_entry` may have started them afresh
        old, p._mix_changed = held
        p._arrays, p._table, p._cache, p._terms = old.arrays, old.table, old.cache, old.terms
