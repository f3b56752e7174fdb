"""prioritize: the policy's score of each requested node, scaled to kube-scheduler's 0..10.

The answer holds one entry per requested node (thousands), so it is assembled from cached per-node JSON
fragments instead of dicts; the scores come from the verdict filter computed for the same pod shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from extender import follow, wire
from extender.verbs.shared import Shared, node_name
from packing.model import InputError, PodDemand


class Prioritize:
    """ExtenderArgs -> HostPriorityList, encoded: the policy's pick gets 10, unknown or infeasible nodes 0."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store = shared.store
        self._prefix_key: tuple[int, int] | None = None
        self._prefix_table = np.zeros(0, dtype=object)

    def __call__(self, args: wire.ExtenderArgs) -> bytes:
        if args.NodeNames is not None:
            names = args.NodeNames
        elif args.Nodes is not None and args.Nodes.items is not None:
            names = [node_name(n, k) for k, n in enumerate(args.Nodes.items)]
        else:
            raise wire.WireError("invalid ExtenderArgs: neither NodeNames nor Nodes.items is set")
        try:
            pod = self.shared.demand(args.Pod)
        except InputError:
            pod = None  # filter already rejected it everywhere; prioritize has no error channel
        plan = self.shared.plan()
        with self.store.lock:
            idx, as_array = self.shared.positions(names)
            prefixes = self._host_prefixes(idx, names)
            if pod is None:
                scores = np.zeros(len(names), dtype=np.int64)
            else:
                ev = self.shared.eval(pod, want_scores=True)
                assert ev.scores is not None
                scores = _scaled(ev.scores, ev.mask.now, idx)
                if plan is not None and plan.assignments:
                    feasible = idx >= 0
                    feasible[feasible] = ev.mask.now[idx[feasible]]
                    scores = self._follow(plan, pod, scores, as_array, feasible)
        return wire.host_priorities_json(prefixes, scores)

    def _follow(self, plan: Any, pod: PodDemand, scores: np.ndarray, names: np.ndarray,
                feasible: np.ndarray) -> np.ndarray:
        """The plan's word on the scores (`extender.follow`; lock held)."""
        asg = follow.planned_units(self.store.state, plan.assignments, pod)
        if asg is not None:
            return follow.follow_scores(scores, names, asg.node, feasible=feasible)
        if pod.key in plan.assignments and self.shared.planner is not None:
            self.shared.planner.request_replan()  # its units are gone: the plan is stale
        return follow.follow_scores(scores, names, None, self.shared.planned_nodes(plan))

    def _host_prefixes(self, idx: np.ndarray, names: list[str]) -> np.ndarray:
        """`wire.host_prefix` of each requested node: per state row, built once per node set (lock held)."""
        key = (self.store.node_set_version, len(self.store.state))
        if self._prefix_key != key:
            self._prefix_table = np.array([wire.host_prefix(n) for n in self.store.state.node_names] or [b""],
                                          dtype=object)
            self._prefix_key = key
        out = self._prefix_table[np.where(idx >= 0, idx, 0)]
        for k in np.flatnonzero(idx < 0).tolist():
            out[k] = wire.host_prefix(names[k])  # a node vramfit does not know: still answered, score 0
        return out


def scale_scores(scores: np.ndarray, feasible: np.ndarray, idx: np.ndarray) -> list[int]:
    """Policy scores of the requested nodes -> integers 0..10 (extender/v1 MaxExtenderPriority).

    Min-max over the feasible requested nodes; the best node(s) get 10 and every other node at most 9, so the
    policy's pick is strictly preferred by this extender. Unknown or infeasible nodes get 0."""
    return _scaled(scores, feasible, idx).tolist()


def _scaled(scores: np.ndarray, feasible: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`scale_scores` as an int64 array."""
    out = np.zeros(idx.shape[0], dtype=np.int64)
    ok = idx >= 0
    ok[ok] = feasible[idx[ok]]
    if not ok.any():
        return out
    big = np.finfo(np.float64).max / 4
    s = np.nan_to_num(scores[idx[ok]].astype(np.float64), nan=-big, posinf=big, neginf=-big)
    lo, hi = float(s.min()), float(s.max())
    if hi > lo:
        scaled = np.floor((s - lo) / (hi - lo) * (wire.MAX_EXTENDER_PRIORITY - 1)).astype(np.int64)
        out[ok] = np.where(s == hi, wire.MAX_EXTENDER_PRIORITY, np.clip(scaled, wire.MIN_EXTENDER_PRIORITY,
                                                                        wire.MAX_EXTENDER_PRIORITY - 1))
    else:
        out[ok] = wire.MAX_EXTENDER_PRIORITY
    return out
