"""The dual rule's per-node answer for one pod shape, kept row by row.

`FragDual` ranks a single-GPU pod's nodes in two stages: per node, the best reference GPU by the dual key and
the best other GPU by the measure's loss (a reduction over the node's GPUs, from that node's row alone); then,
over all nodes, the ranks of those bests (`merge`). The first stage is most of the work and a placement moves
one row, so it is kept per shape (`DualRows`) and redone only on rows whose inputs moved: the state's row
version, the measure's row version (its cache entry), the pod's feasibility there, or the homes term added to
the row. Everything it read that is not per row (the LP solution, the CPU-per-VRAM ratio, the reference size,
the measure's cache entry itself) is the entry's identity: when one changes the entry starts afresh. The
second stage runs in full each time; it is O(nodes) over one-dimensional arrays.

Kept rows are bit-for-bit what a full pass computes (`tests/packing/test_dual_rows.py`): each row's values
come from the same elementwise operations on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from packing.arrays import F64, I64, B

# Score step between reference choices of successive dual keys (VRAM units): small beside any loss
# difference, so the measure still weighs reference against other GPUs at the best reference choice's loss.
RANK_STEP = 1e-6

IntP = npt.NDArray[np.intp]


@dataclass
class Stage:
    """The first stage on some rows (all of them, or those redone)."""

    best: F64  # the smallest dual key over the row's reference candidates (inf: none)
    pick: IntP  # the GPU slot of that key (0 where none, as argmin over inf gives)
    at_pick: F64  # the loss (homes term included) at `pick`
    others: B  # whether the row has a candidate GPU outside the reference size
    off_best: F64  # the smallest loss over those (inf: none)
    off_pick: IntP

    @staticmethod
    def none(n: int) -> Stage:
        """n rows with no candidate GPU (what the first stage gives a row the pod does not fit; `at_pick` is
        read only on a row with a candidate)."""
        return Stage(np.full(n, np.inf), np.zeros(n, dtype=np.intp), np.full(n, np.inf), np.zeros(n, dtype=bool),
                     np.full(n, np.inf), np.zeros(n, dtype=np.intp))

    def take(self, idx: IntP) -> Stage:
        """The rows `idx` of this stage."""
        return Stage(*(getattr(self, name)[idx] for name in FIELDS))

    def spread(self, at: B) -> Stage:
        """This stage (of the rows `at` marks) placed among `at.size` rows, the others with no candidate."""
        out = Stage.none(at.shape[0])
        for name in FIELDS:
            getattr(out, name)[at] = getattr(self, name)
        return out


FIELDS = ("best", "pick", "at_pick", "others", "off_best", "off_pick")


@dataclass
class Reach:
    """Per row: whether a reference GPU has a finite loss there (feasible now or not), which decides whether the
    dual rule applies to the shape at all. Kept apart from `DualRows` because it is read before the LP
    solution is asked for (asking may solve it)."""

    entry: object  # the measure's cache entry it was read from (identity)
    sver: I64  # state row version read (-1: never)
    ever: I64  # the entry's row version read
    use: B

    @staticmethod
    def empty(entry: object, n: int) -> Reach:
        return Reach(entry, np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=bool))

    def fits(self, entry: object, n: int) -> bool:
        return self.entry is entry and self.sver.shape[0] == n

    def stale(self, sver: I64, ever: I64) -> IntP:
        return np.flatnonzero((self.sver != sver) | (self.ever != ever))


@dataclass
class DualRows:
    """One shape's per-row first stage (module docstring), valid for the identity it was made under."""

    key: tuple[object, ...]  # (measure cache entry, LP solution, CPU per VRAM unit, reference size): identities
    sver: I64  # [N] state row version each row was computed at (-1: never)
    ever: I64  # [N] the measure entry's row version it read
    feas: B  # [N] the feasibility it was computed with
    h: F64  # [N] the homes term it added to the measure's loss
    stage: Stage  # [N] each row's first stage

    @staticmethod
    def empty(key: tuple[object, ...], n: int) -> DualRows:
        none = np.full(n, -1, dtype=np.int64)
        return DualRows(key, none, none.copy(), np.zeros(n, dtype=bool), np.zeros(n), Stage.none(n))

    def fits(self, key: tuple[object, ...], n: int) -> bool:
        return self.sver.shape[0] == n and len(key) == len(self.key) and all(
            a is b or (isinstance(a, (int, float)) and a == b) for a, b in zip(key, self.key, strict=True))

    def stale(self, sver: I64, ever: I64, feas: B, h: F64) -> IntP:
        """Rows whose inputs moved since they were computed."""
        return np.flatnonzero((self.sver != sver) | (self.ever != ever) | (self.feas != feas) | (self.h != h))

    def put(self, rows: IntP, sver: I64, ever: I64, feas: B, h: F64, st: Stage) -> None:
        """Store the first stage redone on `rows` with the inputs it read there."""
        self.sver[rows], self.ever[rows], self.feas[rows], self.h[rows] = sver, ever, feas, h
        mine = self.stage
        for name in FIELDS:
            getattr(mine, name)[rows] = getattr(st, name)


def first_stage(loss_g: F64, cand: B, ref: B, keys: F64) -> Stage:
    """Per row of [r, G] arrays: the measure's loss (homes term added), the candidate GPUs, the reference GPUs
    and the dual key of every GPU (`FragDual._keys` of the loss and the cost)."""
    r = np.arange(cand.shape[0])
    key = np.where(cand & ref, keys, np.inf)
    pick = np.argmin(key, axis=1)
    others = cand & ~ref
    off = np.where(others, loss_g, np.inf)
    off_pick = np.argmin(off, axis=1)
    return Stage(key[r, pick], pick, loss_g[r, pick], np.asarray(others.any(axis=1)), off[r, off_pick], off_pick)


def merge(st: Stage) -> tuple[F64, IntP]:
    """(node scores, the GPU slot each node's score stands for, -1 = the measure's choice off the reference
    size) from the first stage of every row.

    Among reference GPUs the dual key orders the choices; a GPU outside the reference size has no dual cost, so
    it is weighed against them by the measure's loss alone: every reference choice scores the loss of the best
    one (by the key), less a tiny step per rank of its key. Where no row has another candidate (the trace) the
    key scores the nodes as it is."""
    best, pick = st.best, st.pick
    if not st.others.any():
        return np.where(np.isfinite(best), -best, -np.inf), pick
    ref_score = np.full(best.shape[0], -np.inf)
    has = np.isfinite(best)
    if has.any():
        _, rank = np.unique(best[has], return_inverse=True)  # equal keys, equal rank
        win = int(np.flatnonzero(has)[np.argmin(best[has])])
        ref_score[has] = -float(st.at_pick[win]) - RANK_STEP * rank
    use_off = -st.off_best > ref_score
    return np.where(use_off, -st.off_best, ref_score), np.where(use_off, -1, pick)
