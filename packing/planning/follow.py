"""Follow the queue plan, safely: the one rule the live extender (prioritize, bind: through
extender.planning.verbs) and `vramfit whatif --queue` (`place_one`) both use.

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

from packing import cycle, fit
from packing.model import Assignment, PodDemand
from packing.policies import Policy
from packing.state import ClusterState, PlacementError

TOP = cycle.MAX_PRIORITY  # the planned node's score

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


def plan_scores(state: ClusterState, assignments: Mapping[str, Assignment], pod: PodDemand, scores: np.ndarray,
                names: np.ndarray | list[str], feasible: np.ndarray, reserved_nodes: Collection[str]
                ) -> tuple[np.ndarray, bool]:
    """Prioritize's scores (0..TOP, of the requested nodes `names`) with the plan's word, by the rule above, and
    whether the plan is stale for this pod (it is planned, but its units are no good any more: plan again).
    `feasible`: which requested nodes the pod fits now; `reserved_nodes`: the nodes holding planned units."""
    asg = planned_units(state, assignments, pod)
    if asg is not None:
        return follow_scores(scores, names, asg.node, feasible=feasible), False
    return follow_scores(scores, names, None, reserved_nodes), pod.key in assignments


def place_one(state: ClusterState, pod: PodDemand, policy: Policy,
              assignments: Mapping[str, Assignment] | None) -> tuple[Assignment | None, str]:
    """One extender cycle offline (`vramfit whatif --queue`), by the rule above: filter (the core's mask), the
    planned units when still good, else prioritize's scores (`cycle.scale_scores`, the tie rule above) and the
    cycle's unit choice on the best node that takes the pod (`cycle.best_first`, `cycle.place_ranked`). Commits
    to `state`; -> (units or None, BY_PLAN | FALLBACK | UNPLANNED)."""
    policy.observe(pod)
    planned = bool(assignments) and pod.key in assignments  # type: ignore[operator]
    via = FALLBACK if planned else UNPLANNED
    mask = fit.feasible(state, pod, policy.whole_gpu).now
    if not mask.any():
        return None, via
    names = state.node_names
    asg = planned_units(state, assignments, pod, {names[i] for i in np.flatnonzero(mask).tolist()})
    if asg is not None:
        state.allocate(pod, asg)
        return asg, BY_PLAN
    idx = np.arange(len(state), dtype=np.int64)
    raw = np.asarray(policy.score(state, pod, mask), dtype=np.float64)
    scores = follow_scores(cycle.scale_scores(raw, mask, idx), names, None,
                           {a.node for a in (assignments or {}).values()}, feasible=mask)
    return cycle.place_ranked(state, pod, policy, cycle.best_first(scores, mask)), via
