"""Homes of the rare heavy shapes: what a placement costs the multi-GPU shapes the learnt mix leaves out.

The mix keeps the most popular shapes (95 % of the pods by count, as FGD does). A multi-GPU shape that asks a
lot of CPU can be 0.2 % of the pods, below that cut, and yet fit only one class of node (on the multigpu60
variants, 8 GPUs x 120 CPUs fits only the 128-CPU G3 nodes). The measure then never weighs those nodes' fitness
for it, small pods open them first, and the heavy pods fail while nodes they cannot use stand idle
(POLICY_NOTES.md, "Homes for the heavy shapes").

The rule, FGD's fragmentation for the left-out shapes, read at node level: node n is a *home* of shape t now
when it has k_t GPUs of a kind t may use with at least t's VRAM free each, and t's CPU free. A placement that
leaves n no longer a home of t costs w_t x k_t x v_t (w_t: t's share of the GPU pods, in the mix's normalisation;
v_t: its VRAM per GPU), summed over the shapes it unhomes. Which GPUs the pod takes on n is the policy's own unit
choice (`select`), so a pod that fits into an already open GPU costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from packing.arrays import F64, B
from packing.model import PodDemand
from packing.policies.mix import PodShape
from packing.state import ClusterState


@dataclass(frozen=True)
class TailShape:
    shape: PodShape
    weight: float  # its share of the GPU pods, normalised as the mix's weights are


@dataclass(frozen=True)
class Tail:
    """The tail shapes as arrays, built once per mix refresh: `home_loss` reads them on every score."""

    shapes: tuple[TailShape, ...]
    keys: tuple[tuple[frozenset[str] | None, int], ...]  # the classes: (model list, VRAM per GPU)
    cls: np.ndarray  # [T] each shape's class
    gpus: np.ndarray  # [T] GPUs it asks
    cpu: np.ndarray  # [T] CPU it asks
    weight: np.ndarray  # [T] w_t
    mass: np.ndarray  # [T] w_t x k_t x v_t

    @staticmethod
    def of(shapes: Sequence[TailShape]) -> Tail:
        keys = tuple(dict.fromkeys((t.shape.models, t.shape.vram_mib) for t in shapes))
        weight = np.array([t.weight for t in shapes], dtype=np.float64)
        gpus = np.array([t.shape.gpu_count for t in shapes], dtype=np.int64)
        return Tail(tuple(shapes), keys,
                    np.array([keys.index((t.shape.models, t.shape.vram_mib)) for t in shapes], dtype=np.intp),
                    gpus, np.array([t.shape.cpu_milli for t in shapes], dtype=np.int64), weight,
                    weight * gpus * np.array([t.shape.vram_mib for t in shapes], dtype=np.float64))

    def __bool__(self) -> bool:
        return bool(self.shapes)


MAX_TAIL = 32  # the heaviest left-out shapes (by w x k x v) the rule looks at: it runs on every score


def tail_shapes(counts: Iterable[tuple[PodShape, float]], kept: Sequence[tuple[PodShape, float]],
                kept_total: float) -> Tail:
    """The multi-GPU shapes outside the mix (`kept`, whose raw weights summed to `kept_total`), weighted as the
    mix's are (count / kept_total), the heaviest `MAX_TAIL` by GPU VRAM asked."""
    inside = {s for s, _ in kept}
    if kept_total <= 0:
        return Tail.of(())
    tail = [TailShape(s, c / kept_total) for s, c in counts
            if s.gpu_count >= 2 and s.vram_mib > 0 and c > 0 and s not in inside]
    tail.sort(key=lambda t: (-t.weight * t.shape.gpu_count * t.shape.vram_mib, t.shape.vram_mib,
                             t.shape.gpu_count, t.shape.cpu_milli))
    return Tail.of(tail[:MAX_TAIL])


class HomeBook:
    """Which nodes are homes of which tail shape now ([N, T]) and how many GPUs of each class every node has
    free for it ([N, C]), kept up to date row by row (the state's row versions): a score reads them for every
    pod, and a placement moves one row."""

    def __init__(self, tail: Tail, mix: object = None) -> None:
        self.tail = tail
        self.mix = mix  # the policy's mix arrays the unit choices were made under (identity only)
        self._epoch: int | None = None
        self._version = np.zeros(0, dtype=np.int64)
        self.count = np.zeros((0, len(tail.keys)), dtype=np.int64)
        self.home = np.zeros((0, len(tail.shapes)), dtype=bool)
        self.homes = np.zeros(len(tail.shapes), dtype=np.int64)  # [T] nodes that are homes of each shape
        # Per pod shape: ([N] the row version each row was computed at, [N, T] would a pod of that shape on the
        # row unmake its home of each tail shape). A row's answer depends on that row alone (its books and the
        # policy's unit choice there), so only moved rows are computed again.
        self._lost: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._ref: tuple[int, int] | None = None  # (rows_epoch, the state's most common GPU size)

    def ref_mib(self, state: ClusterState) -> int:
        """The most common GPU memory size among the state's GPUs (0: none); read once per node set."""
        if self._ref is None or self._ref[0] != state.rows_epoch:
            sizes = state.vram[state.present]
            size = 0
            if sizes.size:
                vals, freq = np.unique(sizes, return_counts=True)
                size = int(vals[np.argmax(freq)])
            self._ref = (state.rows_epoch, size)
        return self._ref[1]

    def lost(self, state: ClusterState, pod: PodDemand, select: B, rows: B) -> np.ndarray:
        """[N, T] whether placing `pod` on each row unmakes that row's home of each tail shape (rows outside
        `rows` may be stale). `select`: the policy's unit choice, current on `rows`."""
        n, t = len(state), self.tail
        got = self._lost.get(pod.shape)
        if got is None or got[0].shape[0] != n:
            if len(self._lost) > 512:
                self._lost.clear()
            got = self._lost[pod.shape] = (np.full(n, -1, dtype=np.int64), np.zeros((n, len(t.shapes)), dtype=bool))
        version, lost = got
        idx = np.flatnonzero(rows & (version != state.version))
        if idx.size:
            present, free, kind, take = state.present[idx], state.pool_free[idx], state.kind[idx], select[idx]
            taken = np.stack([(take & present & (free >= v) & state.allowed_kinds(m)[kind]).sum(axis=1)
                              for m, v in t.keys], axis=1)  # [rows, classes]: GPUs of each class the pod takes
            after = self.count[idx][:, t.cls] - taken[:, t.cls]
            lost[idx] = self.home[idx] & ((after < t.gpus) | ((state.cpu_free[idx] - pod.cpu_milli)[:, None] < t.cpu))
            version[idx] = state.version[idx]
        return lost

    def update(self, state: ClusterState) -> None:
        version = state.version
        if self._epoch != state.rows_epoch or self._version.shape != version.shape:
            self._lost.clear()
            self._epoch = state.rows_epoch
            self._version = version.copy()
            self.count, self.home = self._rows(state, np.arange(len(state)))
            self.homes = self.home.sum(axis=0)
            return
        rows = np.flatnonzero(self._version != version)
        if rows.size:
            count, home = self._rows(state, rows)
            self.homes += home.sum(axis=0) - self.home[rows].sum(axis=0)
            self.count[rows], self.home[rows] = count, home
            self._version[rows] = version[rows]

    def _rows(self, state: ClusterState, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = self.tail
        present, free, kind = state.present[rows], state.pool_free[rows], state.kind[rows]
        count = np.stack([(present & (free >= v) & state.allowed_kinds(m)[kind]).sum(axis=1) for m, v in t.keys],
                         axis=1) if t.keys else np.zeros((rows.size, 0), dtype=np.int64)
        home = (count[:, t.cls] >= t.gpus) & (state.cpu_free[rows][:, None] >= t.cpu)
        return count, home


def home_loss(state: ClusterState, pod: PodDemand, book: HomeBook, select: B, rows: B,
              pods_left: float | None = None) -> F64:
    """[N] what placing `pod` on each node costs the tail shapes' homes (VRAM units x weight); 0 off `rows`.
    `select`: [N, G] the GPUs the pod would take on each node (the policy's unit choice). With `pods_left` (GPU
    pods the free capacity could still take) a lost home of shape t weighs min(1, w_t x pods_left / homes of t):
    where the homes are many more than t's expected arrivals, losing one costs nothing."""
    out = np.zeros(len(state), dtype=np.float64)
    tail = book.tail
    if not tail or not rows.any():
        return out
    book.update(state)
    mass = tail.mass
    if pods_left is not None:
        mass = mass * np.minimum(1.0, tail.weight * pods_left / np.maximum(book.homes, 1))
    live = np.flatnonzero(mass >= 1e-3 * max(float(mass.max()), 1e-12))
    if live.size == 0:
        return out
    idx = np.flatnonzero(rows & book.home[:, live].any(axis=1))
    if idx.size == 0:
        return out
    lost = book.lost(state, pod, select, rows)
    out[idx] = lost[idx][:, live].astype(np.float64) @ mass[live]
    return out


def gpus_per_pod(counts: Iterable[tuple[PodShape, float]], ref_mib: int) -> float:
    """The counted GPU pods' mean GPU share per pod, a GPU of `ref_mib` counting 1."""
    total = per = 0.0
    for s, c in counts:
        if s.gpu_count > 0:
            total += c
            per += c * s.gpu_count * min(1.0, s.vram_mib / max(ref_mib, 1))
    return per / total if total > 0 else 0.0


def pods_left(state: ClusterState, ref_mib: int, per_pod: float) -> float:
    """GPU pods the free capacity could still take at `per_pod` GPUs of `ref_mib` each (the scarcity of a home
    is read against this)."""
    if per_pod <= 0 or ref_mib <= 0:
        return 0.0
    present = state.present
    return float(np.minimum(state.pool_free[present], ref_mib).sum()) / ref_mib / per_pod
