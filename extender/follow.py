"""Follow the queue plan, safely: the one rule the live extender (prioritize, bind) and `vramfit whatif --queue`
both use (issue 13).

- A pod the plan places gets its planned units when they are still good: the planned node is among the nodes
  the scheduler offers (`allowed`) and the units still pass `ClusterState.check` (no pod outside the plan took
  them, the plan is not stale). Prioritize then gives the planned node the top score and every other node its
  normal score capped one below; bind books exactly the planned units.
- Otherwise (not in the plan, or the planned units are no good any more) the pod goes by the online policy;
  a planned pod that could not follow counts as a fallback and asks for a re-plan.
- The online policy avoids units planned for other pods when it has an equal choice: among the nodes with the
  top score, those holding planned units of other queued pods drop one point when some top node holds none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from packing.model import Assignment, PodDemand
from packing.state import ClusterState, PlacementError

TOP = 10  # extender/v1 MaxExtenderPriority (wire.MAX_EXTENDER_PRIORITY)

BY_PLAN = "plan"  # bound on its planned units
FALLBACK = "fallback"  # in the plan, but its planned units were no good: the online policy
UNPLANNED = "unplanned"  # not in the plan: the online policy


def planned_units(state: ClusterState, assignments: Mapping[str, Assignment] | None, pod: PodDemand,
                  allowed: Collection[str] | None = None) -> Assignment | None:
    """The pod's planned units if they are still good now, else None (not planned, node not allowed, or the
    units no longer pass `ClusterState.check`). Read-only; call with the state's lock held."""
    if not assignments:
        return None
    asg = assignments.get(pod.key)
    if asg is None or (allowed is not None and asg.node not in allowed):
        return None
    try:
        state.check(pod, asg)
    except PlacementError:
        return None
    return asg


def planned_elsewhere(assignments: Mapping[str, Assignment] | None, key: str) -> set[str]:
    """Nodes holding planned units of pods other than `key`."""
    if not assignments:
        return set()
    return {a.node for k, a in assignments.items() if k != key}


def follow_scores(scores: np.ndarray, names: np.ndarray | list[str], planned_node: str | None,
                  reserved_nodes: Collection[str] = (), feasible: np.ndarray | None = None) -> np.ndarray:
    """Scores 0..TOP of the requested nodes (`names`, same order) adjusted by the rule above: with a planned node
    it alone gets TOP and the others at most TOP-1; without one, top-score nodes in `reserved_nodes` (planned
    for others) drop to TOP-1 when some top-score node is not among them. `feasible`: which requested nodes the pod
fits now (default: those scoring above 0; min-max scaling gives the worst feasible node 0); a planned node the
pod does not fit gets no word."""
    out = np.asarray(scores, dtype=np.int64).copy()
    if out.size == 0:
        return out
    ok = out > 0 if feasible is None else np.asarray(feasible, dtype=bool)
    if planned_node is not None:
        hit = (np.asarray(names, dtype=object) == planned_node) & ok
        if hit.any():
            out = np.minimum(out, TOP - 1)
            out[hit] = TOP
        return out
    if reserved_nodes:
        top = np.flatnonzero(out == TOP)
        held = np.array([names[i] in reserved_nodes for i in top.tolist()], dtype=bool)
        if held.any() and not held.all():
            out[top[held]] = TOP - 1
    return out
