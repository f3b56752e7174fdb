"""One online scheduling step with the core's filter: `schedule_one` runs `packing.cycle` (filter -> score ->
choose -> commit) after `fit.feasible`, and says why a pod that fits nowhere does not.

`vramfit whatif --online`, `vramfit demo --online` and the trace benchmark place pods through it (the
replay's trace step runs the same cycle with its own filter); the extender's verbs run the same cycle split
across filter, prioritize and bind. Given one state, pod and policy they choose alike; the decision digest
(`benchmarks/decision_digest.py`) replays all of them to show it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packing import cycle, fit
from packing.model import Assignment, PodDemand
from packing.policies import Policy
from packing.state import ClusterState

MAX_REASONS = 6


@dataclass(frozen=True)
class Decision:
    pod: PodDemand
    node: str | None
    assignment: Assignment | None
    reason: str | None


def schedule_one(state: ClusterState, pod: PodDemand, policy: Policy, *, commit: bool = True,
                 explain_failures: bool = True, reserved: bool = False) -> Decision:
    """Place one pod with `policy` through `packing.cycle` (the core's filter). commit=False only decides;
    explain_failures=False skips reason text."""
    policy.observe(pod)
    mask = fit.feasible(state, pod, policy.whole_gpu)
    assignment = cycle.place(state, pod, policy, mask.now, commit=commit, reserved=reserved)
    if assignment is not None:
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
