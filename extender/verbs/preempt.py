"""preempt: of the scheduler's victims per node, the fewest whose eviction lets the pod's GPUs fit there.

Nodes where no set of victims makes room are dropped; victims holding no GPU on the node are the
scheduler's call for its own resources and kept as they are. Eviction is simulated on a one-node copy of
the state, never on the live one.
"""

from __future__ import annotations

from typing import Any

from extender import wire
from extender.metrics import Metrics
from extender.verbs.shared import Shared
from extender.view import pause
from packing import fit
from packing.model import InputError, Node, PodDemand
from packing.state import ClusterState, PlacementError


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
                chosen = self._victims_on(node, pod, uids)
            pause()  # the event loop gets the interpreter lock between two nodes: verbs go in between
            if chosen is None:
                self.metrics.preemptions.labels("dropped").inc()
                continue
            self.metrics.preemptions.labels("kept").inc()
            kept[node] = (chosen, pdb)
        return wire.preemption_result_json(kept)

    def _victims_on(self, node_name: str, pod: PodDemand, uids: list[str]) -> list[str] | None:
        """The fewest of the scheduler's victims whose eviction lets the pod fit here, or None."""
        state = self.store.state
        if not state.has_node(node_name):
            return None
        holders = state.holders_on(node_name)
        by_uid = {h.pod.uid: h for h in holders if h.pod.uid}
        # Each once; the others hold no GPU here: the scheduler's call, kept as they are.
        gpu_victims = list(dict.fromkeys(u for u in uids if u in by_uid))
        sim = _node_copy(state, state.node(node_name), holders)
        whole = self.shared.policy.whole_gpu

        def fits() -> bool:
            return fit.explain(sim, node_name, pod, whole).fits

        removed: list[str] = []
        if not fits():
            # Lowest priority first, then the biggest VRAM holder: the order a scheduler would evict in.
            order = sorted(gpu_victims, key=lambda u: (by_uid[u].pod.priority,
                                                       -sum(g.vram_mib for g in by_uid[u].assignment.gpus)))
            for u in order:
                sim.release(by_uid[u].pod.key)
                removed.append(u)
                if fits():
                    break
            else:
                return None
            # Put back every victim the pod does not need gone (latest first): a minimal set.
            for u in reversed(list(removed)):
                h = by_uid[u]
                sim.allocate(h.pod, h.assignment, force=True)
                if fits():
                    removed.remove(u)
                else:
                    sim.release(h.pod.key)
        evicted = set(removed)  # sets: a call may name thousands of victims per node
        chosen = [u for u in uids if u not in by_uid or u in evicted]
        # Nothing GPU-side needs evicting: the scheduler's own victims are for its own resources.
        return chosen or list(uids) or None


def _uid_of(pod_obj: Any) -> str:
    meta = pod_obj.get("metadata") if isinstance(pod_obj, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else ""


def _node_copy(state: ClusterState, node: Node, holders: list[Any]) -> ClusterState:
    """A one-node ClusterState holding the same pods: preemption is simulated there, never on the live state."""
    sim = ClusterState([node], relax_tenancy=state.relax_tenancy)
    for h in holders:
        try:
            sim.allocate(h.pod, h.assignment, reserved=h.reserved, force=True)
        except PlacementError:
            continue
    return sim
