"""vramfit's placement policy: place each pod where it costs the workload mix the least usable VRAM.

The measure is `packing.policies.frag_measure`, its tables `packing.policies.frag_tables`, the mix
`packing.policies.mix`. `FragAware` scores nodes and chooses units inside a node by the same loss (node and
unit choice in one step); remaining ties go to cluster order. The default `vramfit` (`packing.policies.frag_dual`)
builds on it.
"""

from __future__ import annotations

import copy
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packing import fit
from packing.arrays import B
from packing.model import (
    Assignment,
    GpuGrant,
    PodDemand,
)
from packing.policies.base import BasePolicy
from packing.policies.frag_measure import PodView
from packing.policies.frag_tables import CacheEntry, NodeTable, PodTerms, evaluate_rows
from packing.policies.homes import (
    HomeBook,
    Tail,
    gpus_per_pod,
    home_loss,
    pods_left,
    tail_shapes,
)
from packing.policies.mix import (
    LEARN_MAX,
    LEARN_MAX_GPUS,
    MODE_OK,
    SCARCITY,
    MixArrays,
    PodShape,
    cpu_pressure,
    fgd_share_at,
    mix_order,
    shape_weight,
    top_mix,
)
from packing.state import ClusterState


@dataclass
class FragAware(BasePolicy):
    """Fragmentation-aware: smallest loss of VRAM the workload mix can still use; node and units together."""

    name: str = "frag-aware"
    whole_gpu: bool = False
    weighting: str = "count"  # 'count' (FGD) or 'mass'
    coverage: float = 0.95
    max_types: int = 64
    learn: bool | None = None  # learn the mix from observe(); default: only when no mix is given
    measure: str = "both"  # 'fgd': usable VRAM per shape (FGD); 'units': pods of the shape, GPUs and CPU
    # together; 'both': each shape under both, its weight split by `fgd_share`
    # Under 'both', the part of each shape's weight valued by FGD's measure; None: from the workload's CPU
    # pressure (`packing.policies.mix.fgd_share_at`), which is how the default runs.
    fgd_share: float | None = None
    scarcity: str = "nodes"  # how a shape's weight grows with the scarcity of the GPUs it could use (mix.SCARCITY)
    refresh: int = 2048  # re-snapshot the learned mix every `refresh` pods (and at 1, 2, 4, ... before: a young mix changes fast)
    # Distinct shapes the learnt counts keep: past twice this many, the least frequent are dropped down to it
    # (their weight still counts in the coverage total), so a stream of one-off shapes cannot grow memory.
    max_shapes: int = 4096
    # Weight of the homes of the multi-GPU shapes the mix leaves out (`packing.policies.homes`); 0: not looked at.
    homes: float = 0.0
    homes_scarce: bool = False  # weigh a lost home by how far the shape's expected arrivals need the homes left
    mix: Sequence[tuple[Any, float]] | None = None  # (PodShape or PodDemand, count) pairs
    _counts: Counter[PodShape] = field(default_factory=Counter)
    _dropped: float = 0.0  # weight of the GPU shapes pruned from _counts
    _observed: int = 0
    _next_refresh: int = 1
    _snapshot: list[tuple[PodShape, float]] = field(default_factory=list)
    _tail: Tail = field(default_factory=lambda: Tail.of(()))  # the left-out multi-GPU shapes, as of the snapshot
    _home_book: HomeBook | None = None
    _per_pod: tuple[int, float] | None = None  # (reference GPU MiB, GPUs per pod of the counts) for `homes`
    # The counts as they were at the snapshot (CPU-only shapes too): the CPU pressure is read from them, so it
    # moves only when the mix does and every cached score stays valid between.
    _pressure_counts: dict[PodShape, float] = field(default_factory=dict)
    _arrays: MixArrays | None = None
    _mix_changed: bool = False  # the snapshot moved on since `_arrays` were built from it
    _state_ref: Any = None  # weakref to the state the arrays and the table were built for
    _table: NodeTable | None = None
    _cache: dict[tuple[object, ...], CacheEntry] = field(default_factory=dict)
    _terms: dict[tuple[object, ...], PodTerms] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given: list[tuple[PodShape, float]] = []
        if self.mix:
            given += [(PodShape.of(s) if isinstance(s, PodDemand) else s, float(c)) for s, c in self.mix]
        for shape, c in given:
            self._counts[shape] += c  # type: ignore[assignment]
        if self.learn is None:
            self.learn = not given
        if given:
            self._snapshot = top_mix(self._counts, self.weighting, self.coverage, self.max_types)
            self._pressure_counts = dict(self._counts)
            self._tail = self._tail_of(self._snapshot)
        if self.scarcity not in SCARCITY:
            raise ValueError(f"scarcity must be one of {', '.join(SCARCITY)}, got {self.scarcity!r}")
        if self.fgd_share is not None and not 0.0 <= self.fgd_share <= 1.0:
            raise ValueError(f"fgd_share must be within [0, 1] or None, got {self.fgd_share!r}")

    def __getstate__(self) -> dict[str, Any]:
        # The caches hold a weak reference to a state (which cannot be pickled): a copy starts them afresh.
        d = dict(self.__dict__)
        d.update(_state_ref=None, _table=None, _arrays=None, _cache={}, _terms={}, _home_book=None)
        return d

    def fork(self) -> FragAware:
        """A copy that learns on its own from here, its caches fresh: what has been learnt (counts, the mix) is
        copied one level deep (shapes are immutable), not deep-copied, since a planner forks once a round."""
        twin = copy.copy(self)
        twin.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, list, set)) else v
                              for k, v in self.__getstate__().items()})
        return twin

    # ------------------------------------------------------------------ mix
    def observe(self, pod: PodDemand) -> None:
        if not self.learn or not _learnable(pod):
            return
        self._counts[PodShape.of(pod)] += 1
        self._observed += 1
        if len(self._counts) > 2 * self.max_shapes:
            self._prune()
        if self._observed >= self._next_refresh:
            self._next_refresh = (self._next_refresh * 2 if self._next_refresh < self.refresh
                                  else self._next_refresh + self.refresh)
            snapshot = top_mix(self._counts, self.weighting, self.coverage, self.max_types, self._dropped)
            if snapshot != self._snapshot:  # an unchanged mix keeps every cached score
                self._snapshot = snapshot
                self._pressure_counts = dict(self._counts)
                self._mix_changed = True
            self._tail = self._tail_of(snapshot)
            self._per_pod = None

    def _tail_of(self, snapshot: Sequence[tuple[PodShape, float]]) -> Tail:
        if self.homes <= 0:
            return Tail.of(())
        kept_total = sum(self._counts[s] * shape_weight(s, self.weighting) for s, _ in snapshot)
        return tail_shapes(((s, c * shape_weight(s, self.weighting)) for s, c in self._counts.items()),
                           snapshot, kept_total)

    def home_loss(self, state: ClusterState, pod: PodDemand, select: B, rows: B) -> np.ndarray:
        """[N] `homes` x what placing the pod costs the left-out shapes' homes (`packing.policies.homes`)."""
        if not self._tail:
            return np.zeros(len(state))
        book = self._home_book
        if book is None or book.tail is not self._tail or book.mix is not self._arrays:
            # A new tail, or a rebuilt mix (the unit choices `select` the book's answers rest on may move).
            book = self._home_book = HomeBook(self._tail, self._arrays)
        left = None
        if self.homes_scarce:
            ref = book.ref_mib(state)
            if self._per_pod is None or self._per_pod[0] != ref:
                self._per_pod = (ref, gpus_per_pod(self._counts.items(), ref))
            left = pods_left(state, ref, self._per_pod[1])
        return self.homes * home_loss(state, pod, book, select, rows, left)

    def _prune(self) -> None:
        """Keep the `max_shapes` heaviest shapes (top_mix's order), in the order first seen (its last tie-break)."""
        ranked = sorted(((s, c * shape_weight(s, self.weighting)) for s, c in self._counts.items()), key=mix_order)
        keep = {s for s, _ in ranked[: self.max_shapes]}
        self._dropped += sum(w for s, w in ranked[self.max_shapes:] if s.gpu_count > 0)
        self._counts = Counter({s: c for s, c in self._counts.items() if s in keep})

    def learnt_shapes(self) -> int:
        """Distinct shapes the learnt counts hold now (at most 2 x max_shapes)."""
        return len(self._counts)

    def current_mix(self) -> list[tuple[PodShape, float]]:
        """The mix the policy scores against now (shape, weight), weights summing to 1."""
        return list(self._snapshot)

    def measure_share(self, state: ClusterState) -> float:
        """The FGD measure's share of the weight under 'both' on this state (`fgd_share`, or the CPU pressure's)."""
        if self.fgd_share is not None:
            return self.fgd_share
        return fgd_share_at(cpu_pressure(self._pressure_counts, state))

    def _mix_arrays(self, state: ClusterState) -> MixArrays:
        return self._prepare(state)[0]

    def _prepare(self, state: ClusterState) -> tuple[MixArrays, NodeTable]:
        """The mix resolved against this state and the state's interned table, both brought up to date."""
        arr, table = self._arrays, self._table
        same = self._state_ref is not None and self._state_ref() is state
        g = state.present.shape[1]
        if not same or table is None or table.g != g or table.oversized(len(state)):
            arr = table = None
        if arr is None or self._mix_changed or arr.stale(state):
            new = MixArrays.build(self._snapshot, state, self.measure, self.measure_share(state), self.scarcity)
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
                       mode_ok=MODE_OK[pod.isolation], kind_ok=kind_ok,
                       tenant_id=state.known_tenant_id(pod.tenant),
                       same_tenant=np.array([s.tenant in (None, pod.tenant) for s in mix.shapes], dtype=bool))

    # -------------------------------------------------------------- scoring
    def _entry(self, state: ClusterState, pod: PodDemand, rows_wanted: B | None) -> CacheEntry:
        mix, table = self._prepare(state)
        key = pod.shape
        n = len(state)
        g = table.g
        e = self._cache.get(key)
        if e is None or e.version.shape[0] != n or e.select.shape[1] != g:
            e = CacheEntry(version=np.full(n, -1, dtype=np.int64), loss=np.full(n, np.inf),
                            pack=np.zeros(n), select=np.zeros((n, g), dtype=bool), loss_g=np.full((n, g), np.inf),
                            view=e.view if e is not None else None)
            if len(self._cache) > 512:
                self._cache.clear()
                self._terms.clear()
            self._cache[key] = e
        stale = e.version != state.version
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
            ev = evaluate_rows(state, rows, table, mix, p, pt)
            e.loss[rows] = ev.loss
            e.pack[rows] = ev.pack
            e.select[rows] = ev.select
            e.loss_g[rows] = ev.loss_g
            e.version[rows] = state.version[rows]
        return e

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        feas = np.asarray(feasible_now, dtype=bool)
        return self._measure_score(state, pod, feas, self._entry(state, pod, feas))

    def _measure_score(self, state: ClusterState, pod: PodDemand, feas: B, e: CacheEntry) -> np.ndarray:
        """`score` from the shape's cache entry `e`, current on the feasible rows."""
        if self._tail and pod.gpu_count > 0:
            return -(e.loss + self.home_loss(state, pod, e.select, feas & np.isfinite(e.loss)))
        return -e.loss

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        node = state.node_at(node_index)
        if pod.gpu_count == 0:
            return Assignment(node=node.name, gpus=())
        e = self._cache.get(pod.shape)
        arr = self._arrays
        if (e is None or arr is None or self._mix_changed or self._state_ref is None or self._state_ref() is not state
                or e.version.shape[0] != len(state) or e.version[node_index] != state.version[node_index]
                or arr.stale(state)):
            want = np.zeros(len(state), dtype=bool)
            want[node_index] = True
            e = self._entry(state, pod, want)  # else: scored just now, nothing changed since
        cols = np.flatnonzero(e.select[node_index])
        if cols.size != pod.gpu_count:
            return fit.choose_units(state, node.name, pod, self.whole_gpu)
        usage = state.usage(node.name)
        grants: list[GpuGrant] = []
        for j in cols:
            gu = usage.gpus[int(j)]
            if gu.rules.instanced:  # the mode's own best-fit instance (the smallest free one that fits)
                offer = gu.rules.candidate(gu, pod)[0]
                if offer is None:
                    return fit.choose_units(state, node.name, pod, self.whole_gpu)
                grants.append(offer)
            else:
                grants.append(GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib))
        chosen = Assignment(node=node.name, gpus=tuple(sorted(grants, key=lambda g: g.index)))
        if state.units_problem(pod, chosen) is not None:  # the measure's GPUs mix kinds: one kind of unit instead
            return fit.choose_units(state, node.name, pod, self.whole_gpu)
        return chosen


def _learnable(pod: PodDemand) -> bool:
    return (0 <= pod.vram_mib <= LEARN_MAX and 0 <= pod.gpu_count <= LEARN_MAX_GPUS
            and 0 <= pod.cpu_milli <= LEARN_MAX)
