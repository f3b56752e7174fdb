"""One online scheduling step: filter -> score -> pick -> choose units -> allocate.

The extender's bind, `vramfit whatif`, `vramfit demo` and the trace benchmark all place pods through
`schedule_one`, so they can never disagree about where a pod goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packing import fit
from packing.model import Assignment, PodDemand
from packing.policies import Policy
from packing.state import ClusterState, PlacementError

MAX_REASONS = 6


@dataclass(frozen=True)
class Decision:
    pod: PodDemand
    node: str | None
    assignment: Assignment | None
    reason: str | None


def ranked_nodes(state: ClusterState, pod: PodDemand, policy: Policy,
                 mask: fit.FeasibleMask | None = None) -> np.ndarray:
    """Feasible node indices, best first (ties: lowest index, i.e. cluster order)."""
    mask = mask or fit.feasible(state, pod, policy.whole_gpu)
    idx = np.flatnonzero(mask.now)
    if idx.size == 0:
        return idx
    scores = np.asarray(policy.score(state, pod, mask.now), dtype=np.float64)[idx]
    order = np.lexsort((idx, -scores))  # stable: highest score, then lowest index
    return idx[order]


def schedule_one(state: ClusterState, pod: PodDemand, policy: Policy, *, commit: bool = True,
                 explain_failures: bool = True, reserved: bool = False) -> Decision:
    """Place one pod with `policy`. commit=False only decides; explain_failures=False skips reason text."""
    policy.observe(pod)
    mask = fit.feasible(state, pod, policy.whole_gpu)
    if mask.now.any():
        candidates = ranked_nodes(state, pod, policy, mask)
        # The best node nearly always works; a policy whose own unit choice refuses falls through.
        for i in candidates[:8]:
            # The policy's own unit choice first; where it has none (a policy written for another
            # resource model, e.g. the trace's milli-GPUs on a MIG node) the core's best fit.
            for attempt in range(2):
                node = int(i)
                assignment = (policy.choose(state, node, pod) if attempt == 0 else
                              fit.choose_units(state, state.node_at(node).name, pod, policy.whole_gpu))
                if assignment is None:
                    continue
                if commit:
                    try:
                        state.allocate(pod, assignment, reserved=reserved)
                    except PlacementError:
                        continue
                return Decision(pod, assignment.node, assignment, None)
    reason = unplaced_reason(state, pod, policy.whole_gpu, mask) if explain_failures else "does not fit"
    return Decision(pod, None, None, reason)


def unplaced_reason(state: ClusterState, pod: PodDemand, whole_gpu: bool,
                    mask: fit.FeasibleMask | None = None) -> str:
    """Why no node takes the pod, in words an operator acts on; 'never fits' and 'full now' apart."""
    if len(state) == 0:
        return "the cluster has no nodes"
    mask = mask or fit.feasible(state, pod, whole_gpu)
    names = state.node_names
    never = [names[i] for i in np.flatnonzero(mask.never)]
    full = [names[i] for i in np.flatnonzero(~mask.never & ~mask.now)]
    parts: list[str] = []
    shown = 0
    for label, group in (("full now", full), ("never fits", never)):
        if not group:
            continue
        details = []
        for name in group[: max(1, MAX_REASONS - shown)]:
            details.append(f"{name}: {fit.explain(state, name, pod, whole_gpu).reason}")
            shown += 1
        more = f" (+{len(group) - len(details)} more)" if len(group) > len(details) else ""
        parts.append(f"{len(group)} {label} [" + "; ".join(details) + more + "]")
    return f"0/{len(names)} nodes fit: " + ", ".join(parts)


def place_all(state: ClusterState, pods: list[PodDemand], policy: Policy,
              explain_failures: bool = True) -> list[Decision]:
    """Place pods in order (what-if, demo). Mutates `state`."""
    return [schedule_one(state, p, policy, explain_failures=explain_failures) for p in pods]
