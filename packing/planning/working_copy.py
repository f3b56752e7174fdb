"""Working copies of a `ClusterState` for the planners: `sub_state` copies the books and arrays of some nodes
and shares what never changes (`copy.deepcopy` of a 5,000-node state costs seconds); a `DeltaSource` keeps one
copy of a live state up to date row by row, as `StateDelta`s that `apply_delta` applies (in the same process or,
pickled, in the planner's worker)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from packing.model import Gpu, GpuGrant, Holder, Node
from packing.planning.by_field import copy_by_field
from packing.state import ClusterState
from packing.usage import NodeUsage
from packing.views import StateViews


class WorkingCopy(ClusterState):
    """A planner's working copy: `copy()` copies the books (who holds what) and the arrays, and shares what
    never changes (nodes, GPUs, mode rules). `copy.deepcopy` of a 5,000-node state costs seconds."""

    def copy(self) -> ClusterState:
        return sub_state(self, self.node_names)

    def __deepcopy__(self, memo: dict[int, object]) -> ClusterState:
        return self.copy()


def copy_usage(nu: NodeUsage) -> NodeUsage:
    gpus = []
    for gu in nu.gpus:
        c = copy_by_field(gu)
        c.grants = dict(gu.grants)
        c.tenants = dict(gu.tenants)
        c.mig_holder = dict(gu.mig_holder)
        gpus.append(c)
    return NodeUsage(nu.node, gpus, nu.cpu_used, nu.mem_used)


@dataclass(frozen=True)
class RowBooks:
    """One node's books without its description: what a delta sends for a row whose node the copy already has
    (the node and its GPUs never change while the same object describes the row; pickling them was ~80 % of a
    row's bytes and of the time the planner held the store's lock)."""

    cpu_used: int
    mem_used: int
    gpus: tuple[tuple[dict[str, GpuGrant], dict[str, int], dict[str, str], int, str | None], ...]

    @classmethod
    def of(cls, nu: NodeUsage) -> RowBooks:
        """The live books (their dicts shared: `copied` or a pickle freezes them)."""
        return cls(nu.cpu_used, nu.mem_used,
                   tuple((gu.grants, gu.tenants, gu.mig_holder, gu.used_mib, gu.whole_holder) for gu in nu.gpus))

    def copied(self) -> RowBooks:
        return RowBooks(self.cpu_used, self.mem_used,
                        tuple((dict(g), dict(t), dict(m), u, w) for g, t, m, u, w in self.gpus))

    def onto(self, nu: NodeUsage) -> None:
        """Write these books into the copy's usage of the same node (its dicts are the copy's own)."""
        nu.cpu_used, nu.mem_used = self.cpu_used, self.mem_used
        for gu, (grants, tenants, mig_holder, used, whole) in zip(nu.gpus, self.gpus, strict=True):
            gu.grants, gu.tenants, gu.mig_holder, gu.used_mib, gu.whole_holder = grants, tenants, mig_holder, used, whole


def _rows(state: ClusterState, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Copies of the given rows of every array (fancy indexing copies)."""
    return {name: getattr(state, "_" + name)[rows] for name in StateViews._ARRAYS}


def sub_state(state: ClusterState, names: Sequence[str]) -> WorkingCopy:
    """A copy of `state` restricted to `names`: each node's books copied as they are (holders recorded with force
    stay recorded), its rows of the arrays copied; the registries of tenant and GPU-kind ids copied whole, so the
    ids in those rows keep their meaning. It reads ClusterState's internals: it lives in the core, beside them."""
    sub = WorkingCopy(relax_tenancy=bool(getattr(state, "relax_tenancy", False)), max_gpus=state._g)
    rows = np.array([state.index_of(n) for n in names], dtype=np.int64)
    for name, part in _rows(state, rows).items():
        setattr(sub, "_" + name, part)
    _copy_registries(sub, state)
    sub._nodes = [copy_usage(state.usage(n)) for n in names]
    sub._index = {n: i for i, n in enumerate(names)}
    keep = set(names)
    sub._holders = {k: h for k, h in state._holders.items() if h.assignment.node in keep}
    return sub


def _copy_registries(dst: StateViews, src: StateViews) -> None:
    dst._tenant_ids = dict(src._tenant_ids)
    dst._gpu_kinds = dict(src._gpu_kinds)
    dst._kind_gpus = list(src._kind_gpus)


@dataclass(frozen=True)
class StateDelta:
    """What a copy of a live state needs to catch up (`DeltaSource.delta`, `apply_delta`).

    reset: (node names, GPU columns, relax_tenancy) when the copy starts over (first delta, or the node set
    changed); its rows arrive in this delta and the next ones. rows: the rows whose version moved, with their rows
    of every array (`arrays`) and their books (`usage`: the whole `NodeUsage` where the copy has not got the row's
    node yet, else its `RowBooks`; the live objects until `copied()`, or a pickle, freezes them). holders: new or
    replaced holders (a confirm replaces one without moving a row); dropped: holders gone.
    registries: tenant ids, GPU-kind ids and their representative GPUs, whole (they only grow, and are small).
    complete: every moved row is in, so the copy equals the state as it was when this delta was taken."""

    reset: tuple[list[str], int, bool] | None
    rows: np.ndarray
    arrays: dict[str, np.ndarray]
    usage: list[NodeUsage | RowBooks]
    holders: dict[str, Holder]
    dropped: list[str]
    registries: tuple[dict[str, int], dict[tuple[str, str], int], list[Gpu]]
    complete: bool

    def copied(self) -> StateDelta:
        """This delta with its books copied: safe to apply after the state's lock is released."""
        return replace(self, usage=[nu.copied() if isinstance(nu, RowBooks) else copy_usage(nu) for nu in self.usage])


HOLDERS_PER_ROW = 8  # holders one delta may carry per row it may carry (`max_rows`): a piece stays small


class DeltaSource:
    """The sending half of a working copy: remembers which row versions and holders it has handed out and
    `delta(state, node_set_version)` (the caller holds whatever lock guards `state`) returns what moved since.
    `max_rows` caps the rows of one delta (and its holders at `HOLDERS_PER_ROW` times as many), so a full copy
    can be taken in pieces with the lock released between them; a row that moves after its piece was taken is
    simply moved again, and is in a later delta."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._versions = np.zeros(0, dtype=np.int64)
        self._nodes_sent: list[Node | None] = []  # per row, the node description the copy has (None: none yet)
        self._holders: dict[str, Holder] = {}
        self._log_at: int | None = None  # where in the state's holder journal the next delta reads from
        self._backlog: dict[str, None] = {}  # holder keys still to compare with what was sent (an ordered set)

    def _key_of(self, state: ClusterState, node_set_version: int) -> tuple[Any, ...]:
        return (id(state), state.rows_epoch, node_set_version, state._g, len(state))

    def rows_moved(self, state: ClusterState, node_set_version: int) -> int | None:
        """Rows whose version moved since they were last handed out (the caller holds the state's lock); None
        when the next delta would start over (another state, or the node set changed)."""
        if self._key_of(state, node_set_version) != self._key:
            return None
        return int(np.count_nonzero(state.version != self._versions))

    def delta(self, state: ClusterState, node_set_version: int, max_rows: int | None = None) -> StateDelta:
        """What moved since the last delta: rows (at most `max_rows`), then holders (at most `HOLDERS_PER_ROW`
        per row); `complete` only when neither cap left anything for the next delta."""
        key = self._key_of(state, node_set_version)
        reset: tuple[list[str], int, bool] | None = None
        if key != self._key:  # another state, or the node set changed: rows mean other nodes now
            reset = (state.node_names, state._g, bool(getattr(state, "relax_tenancy", False)))
            self._start_over(key, len(state))
        moved, rows_complete = self._moved_rows(state, max_rows)
        holders, dropped, holders_complete = self._holder_changes(state, reset is not None, max_rows)
        usage = self._row_books(state, moved)
        return StateDelta(reset, moved, _rows(state, moved), usage, holders,
                          dropped, (dict(state._tenant_ids), dict(state._gpu_kinds), list(state._kind_gpus)),
                          rows_complete and holders_complete)

    def _start_over(self, key: tuple[Any, ...], n: int) -> None:
        """Forget what was handed out: the next deltas build a new copy of `n` rows."""
        self._key = key
        self._versions = np.full(n, -1, dtype=np.int64)  # no row sent yet
        self._nodes_sent = [None] * n
        self._holders = {}
        self._backlog = {}

    def _moved_rows(self, state: ClusterState, max_rows: int | None) -> tuple[np.ndarray, bool]:
        """The rows whose version moved (the first `max_rows` of them), marked as sent; whether that is all."""
        version = state.version
        moved = np.flatnonzero(version != self._versions)
        complete = max_rows is None or moved.size <= max_rows
        if not complete:
            moved = moved[:max_rows]
        self._versions[moved] = version[moved]
        return moved, complete

    def _holder_changes(self, state: ClusterState, reset: bool, max_rows: int | None
                        ) -> tuple[dict[str, Holder], list[str], bool]:
        """New or replaced holders (up to the cap) and holders gone, marked as sent; whether the backlog emptied
        before the cap."""
        live, sent = state._holders, self._holders
        news, self._log_at = state.holder_changes_since(None if reset else self._log_at)
        if news is None:  # a new copy, or the journal moved on past us: every holder is a candidate
            news = [*live, *(k for k in sent if k not in live)]
        backlog = self._backlog
        backlog.update(dict.fromkeys(news))
        # A first copy of a busy cluster holds tens of thousands of holders: they come in pieces too.
        cap = None if max_rows is None else max_rows * HOLDERS_PER_ROW
        holders: dict[str, Holder] = {}
        dropped: list[str] = []
        done: list[str] = []
        complete = True
        for k in backlog:  # only the keys looked at are visited: the rest wait for the next piece
            h = live.get(k)
            if h is None:
                if k in sent:
                    dropped.append(k)
            elif sent.get(k) is not h:
                if cap is not None and len(holders) >= cap:
                    complete = False
                    break
                holders[k] = h
            done.append(k)
        for k in done:
            del backlog[k]
        for k in dropped:
            del sent[k]
        sent.update(holders)
        return holders, dropped, complete

    def _row_books(self, state: ClusterState, moved: np.ndarray) -> list[NodeUsage | RowBooks]:
        """Each moved row's books: the whole usage where the copy has not got the row's node yet, else its books."""
        usage: list[NodeUsage | RowBooks] = []
        for i in moved.tolist():
            nu = state._nodes[i]
            if nu.node is self._nodes_sent[i]:
                usage.append(RowBooks.of(nu))
            else:  # a new row, or its node was described anew (upsert_node): the whole usage, once
                usage.append(nu)
                self._nodes_sent[i] = nu.node
        return usage


def apply_delta(books: WorkingCopy | None, delta: StateDelta) -> WorkingCopy:
    """The receiving half: `books` brought up to date by `delta` (a new copy when the delta resets). Its books
    (`usage`) are taken as they are: copy them first (`StateDelta.copied`) unless they came through a pickle."""
    if delta.reset is not None:
        names, columns, relax = delta.reset
        books = WorkingCopy(relax_tenancy=relax, max_gpus=columns)
        books._alloc_arrays(len(names))
        # Placeholders until their rows arrive: a copy is used only after a complete delta.
        books._nodes = [cast(NodeUsage, None)] * len(names)
        books._index = {name: i for i, name in enumerate(names)}
    elif books is None:
        raise ValueError("a delta that does not reset needs the copy it follows")
    rows = delta.rows
    for name, part in delta.arrays.items():
        getattr(books, "_" + name)[rows] = part
    for i, nu in zip(rows.tolist(), delta.usage, strict=True):
        if isinstance(nu, RowBooks):
            nu.onto(books._nodes[i])
        else:
            books._nodes[i] = nu
    for key in delta.dropped:
        books._holders.pop(key, None)
    books._holders.update(delta.holders)
    books._tenant_ids, books._gpu_kinds, books._kind_gpus = delta.registries
    return books

