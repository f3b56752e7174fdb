"""prioritize: the policy's score of each requested node, scaled to kube-scheduler's 0..10.

The answer holds one entry per requested node (thousands), so it is assembled from cached per-node JSON
fragments instead of dicts; the scores come from the verdict filter computed for the same pod shape.
"""

from __future__ import annotations

import numpy as np

from extender import wire
from extender.planning import verbs as planning
from extender.verbs.shared import Shared, requested
from packing.cycle import scale_scores
from packing.model import InputError


class Prioritize:
    """ExtenderArgs -> HostPriorityList, encoded: the policy's pick gets 10, unknown or infeasible nodes 0."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store = shared.store
        self._prefix_key: tuple[int, int] | None = None
        self._prefix_table = np.zeros(0, dtype=object)

    def __call__(self, args: wire.ExtenderArgs) -> bytes:
        _, names = requested(args)
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
                scores = scale_scores(ev.scores, ev.mask.now, idx)
                scores = planning.prioritize(self.shared, plan, pod, scores, as_array, idx, ev.mask.now)
        return wire.host_priorities_json(prefixes, scores)

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
