"""Preemption's victim rule: of the scheduler's victims on one node, the fewest whose eviction lets a pod's GPUs
fit there. Eviction is simulated on a one-node copy of the state, never on the given one.

Victims holding no GPU on the node are the scheduler's call for its own resources and are kept as they are."""

from __future__ import annotations

from collections.abc import Sequence

from packing import fit
from packing.model import Holder, Node, PodDemand
from packing.state import ClusterState, PlacementError


def fewest_victims(state: ClusterState, node_name: str, pod: PodDemand, uids: Sequence[str],
                   whole_gpu: bool) -> list[str] | None:
    """Of `uids` (the scheduler's victims on `node_name`, by pod UID), those to evict: the fewest GPU holders whose
    eviction lets `pod` fit (lowest priority first, then the biggest VRAM holder, the order a scheduler would evict
    in; then every one the pod does not need gone put back, latest first), with every victim that holds no GPU
    here. None when no set of them makes room, or the node is unknown. Read-only on `state`."""
    if not state.has_node(node_name):
        return None
    holders = state.holders_on(node_name)
    by_uid = {h.pod.uid: h for h in holders if h.pod.uid}
    gpu_victims = list(dict.fromkeys(u for u in uids if u in by_uid))  # each once
    sim = node_copy(state, state.node(node_name), holders)

    def fits() -> bool:
        return fit.explain(sim, node_name, pod, whole_gpu).fits

    removed: list[str] = []
    if not fits():
        order = sorted(gpu_victims, key=lambda u: (by_uid[u].pod.priority,
                                                   -sum(g.vram_mib for g in by_uid[u].assignment.gpus)))
        for u in order:
            sim.release(by_uid[u].pod.key)
            removed.append(u)
            if fits():
                break
        else:
            return None
        for u in reversed(list(removed)):  # a minimal set
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


def node_copy(state: ClusterState, node: Node, holders: Sequence[Holder]) -> ClusterState:
    """A one-node ClusterState holding the same pods (preemption is simulated there)."""
    sim = ClusterState([node], relax_tenancy=state.relax_tenancy)
    for h in holders:
        try:
            sim.allocate(h.pod, h.assignment, reserved=h.reserved, force=True)
        except PlacementError:
            continue
    return sim
