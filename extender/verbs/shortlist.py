"""Filter's shortlist: of the requested nodes a pod fits, the best K by the policy's score, so prioritize and
kube-scheduler's own scoring work on K names instead of thousands (config `shortlist_k`; 0 = off).

The node prioritize would rank first over every fitting node is always on the list, so the pick does not move:
- the policy's best: the K are taken best first by score, ties by lowest state row (`packing.cycle.best_first`),
  and prioritize's min-max scaling (`cycle.scale_scores`) gives the highest score on the list MAX_PRIORITY
  whatever the list's lowest is;
- the plan's node (packing.planning.follow): prioritize gives it the top score wherever it ranks, so it is kept;
- the follow rule's tie break: a top-score node holding units planned for other pods drops one point when some
  top-score node holds none, so the lowest-row such free node is kept when the top ties run past K.
A pod that fits few nodes (at most 2 K) gets the full list: cutting a short list saves nothing worth a change.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from extender.verbs.shared import Shared
from packing.model import PodDemand
from packing.planning import follow

FEW_FACTOR = 2  # a pod fitting at most FEW_FACTOR * K of the requested nodes gets them all


def applies(k: int, fitting: int) -> bool:
    """Whether a pod fitting `fitting` of the requested nodes is cut to a shortlist of `k`."""
    return k > 0 and fitting > FEW_FACTOR * k


def best_k(scores: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Positions into `rows` (state rows of the fitting requested nodes) of the best `k` by `scores[rows]`, ties
    by lowest row (`cycle.best_first`'s order; a NaN ranks as -inf), as a boolean mask over `rows`. O(len(rows))."""
    keep = np.zeros(rows.size, dtype=bool)
    if k >= rows.size:
        keep[:] = True
        return keep
    if k <= 0:
        return keep
    s = _ranked(scores, rows)
    kth = np.partition(s, s.size - k)[s.size - k]  # the k-th highest score
    keep[s > kth] = True
    ties = np.flatnonzero(s == kth)
    keep[ties[np.argsort(rows[ties], kind="stable")][: k - int(keep.sum())]] = True
    return keep


def keep_for_plan(keep: np.ndarray, scores: np.ndarray, rows: np.ndarray, names: np.ndarray,
                  planned_node: str | None, reserved: Collection[str]) -> None:
    """Add to `keep` (mask over `rows`, the fitting requested nodes; `names` theirs) the nodes the follow rule
    makes prioritize's first choice: the plan's node for the pod, else the lowest-row top-score node holding no
    units planned for other pods (`reserved`) when another top-score node holds some."""
    if planned_node is not None:
        keep |= names == planned_node
        return
    if not reserved or rows.size == 0:
        return
    s = _ranked(scores, rows)
    top = np.flatnonzero(s == s.max())
    if keep[top].all():
        return  # every top-score node is on the list: prioritize sees the same tie
    for pos in top[np.argsort(rows[top], kind="stable")].tolist():
        if names[pos] not in reserved:
            keep[pos] = True
            return


def plan_word(shared: Shared, plan: Any, pod: PodDemand) -> tuple[str | None, Collection[str]]:
    """(the plan's node for the pod while its planned units are still good, the nodes holding planned units when
    it has none): what prioritize's follow rule (extender.planning.verbs.prioritize) reads. Lock held."""
    if plan is None or not plan.assignments:
        return None, ()
    asg = follow.planned_units(shared.store.state, plan.assignments, pod)
    if asg is not None:
        return asg.node, ()
    return None, shared.planned_nodes(plan)


def _ranked(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)[rows]
    return np.where(np.isnan(s), -np.inf, s)
