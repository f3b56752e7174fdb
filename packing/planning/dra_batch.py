"""A batch of gated pods' claims planned together: each pod as the demand the DRA allocator ranks nodes by
(`Allocator.probe`: its devices as GPUs of the smallest size they ask), planned by the queue planner (CP-SAT where
it pays, the online policy otherwise); the plan's node is each pod's first try (`Allocator.allocate(prefer=)`),
so a burst is packed as a whole, while every device is still chosen and booked by the allocator."""

from __future__ import annotations

from collections.abc import Sequence

from packing.dra.allocate import Allocator, PodClaims, Unallocated
from packing.planning.queue_plan import QueuedPod, plan_queue


def plan_claims(allocator: Allocator, pods: Sequence[PodClaims], budget_s: float = 0.2) -> dict[str, str]:
    """pod key -> the node the plan gives it (pods fixed to a node, and a lone pod, are left to the allocator)."""
    queue = []
    for pod in pods:
        if pod.node is not None or not pod.claims:
            continue
        wanted = allocator.wanted(pod)
        if isinstance(wanted, Unallocated):
            continue
        queue.append(QueuedPod(allocator.probe(pod, wanted), pod.created))
    if len(queue) < 2:
        return {}
    plan = plan_queue(allocator.state, queue, time_limit_s=budget_s, policy=allocator.policy.name)
    return {key: a.node for key, a in plan.assignments.items()}
