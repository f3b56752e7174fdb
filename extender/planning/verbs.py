"""The verbs' one door to the queue plan: prioritize's scores and bind's units, by the follow rule
(packing.planning.follow). With planning off (no planner, or no plan yet) both answer as if there were no plan."""

from __future__ import annotations

from typing import Any

import numpy as np

from extender.store import NoFit
from extender.verbs.shared import Shared
from packing.model import Assignment, PodDemand
from packing.planning import follow


def prioritize(shared: Shared, plan: Any, pod: PodDemand, scores: np.ndarray, names: np.ndarray, idx: np.ndarray,
               now: np.ndarray) -> np.ndarray:
    """Prioritize's scores (0..10 of the requested nodes `names`, state rows `idx`, -1 unknown) with the plan's
    word; `now`: the filter's mask over the state's rows. A stale plan asks for a re-plan. Lock held."""
    if plan is None or not plan.assignments:
        return scores
    feasible = idx >= 0
    feasible[feasible] = now[idx[feasible]]
    out, stale = follow.plan_scores(shared.store.state, plan.assignments, pod, scores, names, feasible,
                                    shared.planned_nodes(plan))
    if stale and shared.planner is not None:
        shared.planner.request_replan()  # its units are gone
    return out


def bind(shared: Shared, pod: PodDemand, node: str) -> tuple[Assignment | None, str | None]:
    """(the plan's units booked for the pod on `node`, how it goes). (None, how) when the online policy chooses:
    not in the plan, or its planned units are no good here (a re-plan is asked for); (None, None) with planning
    off."""
    plan = shared.plan()
    if plan is None:
        return None, None
    if pod.key not in plan.assignments:
        return None, follow.UNPLANNED
    store = shared.store
    with store.lock:
        asg = follow.planned_units(store.state, plan.assignments, pod, allowed=(node,))
        if asg is not None:
            try:
                return store.reserve_assignment(pod, asg), follow.BY_PLAN
            except NoFit:
                pass
    if shared.planner is not None:
        shared.planner.request_replan()
    return None, follow.FALLBACK
