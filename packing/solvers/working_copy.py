"""Working copies of a `ClusterState` for the planners: `sub_state` copies the books and arrays of some nodes
and shares what never changes (`copy.deepcopy` of a 5,000-node state costs seconds); `StateMirror` keeps one
copy of a live state up to date row by row."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

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
        c = copy.copy(gu)
        c.grants = dict(gu.grants)
        c.tenants = dict(gu.tenants)
        c.mig_holder = dict(gu.mig_holder)
        gpus.append(c)
    return NodeUsage(nu.node, gpus, nu.cpu_used, nu.mem_used)


def sub_state(state: ClusterState, names: Sequence[str]) -> WorkingCopy:
    """A copy of `state` restricted to `names`: each node's books copied as they are (holders recorded with force
    stay recorded), its rows of the arrays copied; the registries of tenant and GPU-kind ids copied whole, so the
    ids in those rows keep their meaning. It reads ClusterState's internals: it lives in the core, beside them."""
    sub = WorkingCopy(relax_tenancy=bool(getattr(state, "relax_tenancy", False)), max_gpus=state._g)
    rows = np.array([state.index_of(n) for n in names], dtype=np.int64)
    for name in StateViews._ARRAYS:
        arr = getattr(state, "_" + name)
        setattr(sub, "_" + name, arr[rows].copy() if rows.size else arr[:0].copy())
    sub._tenant_ids = dict(state._tenant_ids)
    sub._gpu_kinds = dict(state._gpu_kinds)
    sub._kind_gpus = list(state._kind_gpus)
    sub._nodes = [copy_usage(state.usage(n)) for n in names]
    sub._index = {n: i for i, n in enumerate(names)}
    keep = set(names)
    sub._holders = {k: h for k, h in state._holders.items() if h.assignment.node in keep}
    return sub


class StateMirror:
    """A working copy of one live state kept up to date row by row: `sync(state, node_set_version)` (the
    caller holds whatever lock guards `state`) copies only the rows whose version moved, and the whole state
    only when the node set changed. The extender's planner solves on it outside the store's lock."""

    def __init__(self) -> None:
        self.books: WorkingCopy | None = None
        self._key: tuple[Any, ...] | None = None
        self._versions = np.zeros(0, dtype=np.int64)

    def sync(self, state: ClusterState, node_set_version: int) -> ClusterState:
        n = len(state)
        key = (id(state), node_set_version, state._g, n, tuple(state.node_names) if n < 64 else n)
        if self.books is None or key != self._key or list(self.books.node_names) != state.node_names:
            self.books = sub_state(state, state.node_names)
            self._key = key
            self._versions = state.version.copy()
            return self.books
        books = self.books
        version = state.version
        rows = np.flatnonzero(version != self._versions)
        if rows.size:
            for name in StateViews._ARRAYS:
                getattr(books, "_" + name)[rows] = getattr(state, "_" + name)[rows]
            for i in rows.tolist():
                books._nodes[i] = copy_usage(state._nodes[i])
            self._versions = version.copy()
        books._holders = dict(state._holders)
        books._tenant_ids = dict(state._tenant_ids)
        books._gpu_kinds = dict(state._gpu_kinds)
        books._kind_gpus = list(state._kind_gpus)
        return books
