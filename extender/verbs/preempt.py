"""preempt: of the scheduler's victims per node, the fewest whose eviction lets the pod's GPUs fit there (the
core's rule, `packing.preemption.fewest_victims`). Nodes where no set of victims makes room are dropped.
"""

from __future__ import annotations

from typing import Any

from extender import wire
from extender.metrics import Metrics
from extender.verbs.shared import Shared
from extender.view import pause
from packing.model import InputError
from packing.preemption import fewest_victims


class Preempt:
    """ExtenderPreemptionArgs -> ExtenderPreemptionResult, encoded: the candidate nodes kept, each with its
    minimal victims."""

    def __init__(self, shared: Shared, metrics: Metrics) -> None:
        self.shared = shared
        self.store = shared.store
        self.metrics = metrics

    def __call__(self, args: wire.ExtenderPreemptionArgs) -> bytes:
        candidates: dict[str, tuple[list[str], int]] = {}
        if args.NodeNameToMetaVictims is not None:
            for node, mv in args.NodeNameToMetaVictims.items():
                if mv is not None:
                    candidates[node] = ([p.UID for p in mv.Pods or []], mv.NumPDBViolations)
        elif args.NodeNameToVictims is not None:
            for node, v in args.NodeNameToVictims.items():
                if v is not None:
                    uids = [_uid_of(p) for p in v.Pods or []]
                    candidates[node] = ([u for u in uids if u], v.NumPDBViolations)
        try:
            pod = self.shared.demand(args.Pod)
        except InputError:
            self.metrics.preemptions.labels("dropped").inc(len(candidates))
            return wire.preemption_result_json({})  # the pod fits nowhere; preemption cannot change that
        if pod is None:  # not ours to judge; a node left with no victim known there is no candidate
            return wire.preemption_result_json({n: c for n, c in candidates.items() if c[0]})
        kept: dict[str, tuple[list[str], int]] = {}
        for node, (uids, pdb) in candidates.items():
            with self.store.lock:  # per node: a call naming thousands of nodes does not hold binds up meanwhile
                chosen = fewest_victims(self.store.state, node, pod, uids, self.shared.policy.whole_gpu)
            pause()  # the event loop gets the interpreter lock between two nodes: verbs go in between
            if chosen is None:
                self.metrics.preemptions.labels("dropped").inc()
                continue
            self.metrics.preemptions.labels("kept").inc()
            kept[node] = (chosen, pdb)
        return wire.preemption_result_json(kept)


def _uid_of(pod_obj: Any) -> str:
    meta = pod_obj.get("metadata") if isinstance(pod_obj, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else ""
