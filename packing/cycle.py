"""One scheduling cycle: filter -> score -> choose -> commit, with one rule for "choose found nothing".

`place.schedule_one` (what-if, demo, the trace replay's general step) and the replay's trace step run this
cycle; they differ only in the filter they hand it (`fit.feasible`'s mask, or the replay's specialised
`trace_feasible`, which equals it on replay states).

The rule when a node's choice fails: the policy's own unit choice first; where it has none (a policy
written for another resource model, e.g. the trace's milli-GPUs on a MIG node) the core's best fit
(`fit.choose_units`); where `allocate` still refuses, the next node in the ranking, up to
`MAX_CANDIDATES` nodes. The best node nearly always works. `rank` and `place_ranked` are the two halves of `place`, for
a caller that ranks by other scores (`best_first`: the extender's, scaled by `scale_scores`).
"""

from __future__ import annotations

import numpy as np

from packing import fit
from packing.model import Assignment, PodDemand
from packing.policies.base import Policy
from packing.state import ClusterState, PlacementError

MAX_CANDIDATES = 8  # nodes tried, best first, before the pod is reported as not placed
MAX_PRIORITY = 10  # kube-scheduler's score range for an extender's node: extender/v1 MaxExtenderPriority


def best_first(scores: np.ndarray, now: np.ndarray) -> np.ndarray:
    """Indices of the nodes in `now` (the filter's [N] mask), best first by `scores` ([N]; ties: lowest index,
    cluster order, as kube-scheduler's first pick)."""
    idx = np.flatnonzero(now)
    if idx.size == 0:
        return idx
    order = np.lexsort((idx, -np.asarray(scores)[idx]))  # stable: highest score, then lowest index
    return idx[order]


def rank(state: ClusterState, pod: PodDemand, policy: Policy, now: np.ndarray) -> np.ndarray:
    """Indices of the nodes in `now` (the filter's [N] mask), best first by the policy's score."""
    if not now.any():
        return np.flatnonzero(now)
    return best_first(np.asarray(policy.score(state, pod, now), dtype=np.float64), now)


def choose_and_commit(state: ClusterState, pod: PodDemand, policy: Policy, node_index: int, *,
                      commit: bool = True, reserved: bool = False) -> Assignment | None:
    """The pod's units on one node by the rule above, booked when `commit`; None when the node takes none."""
    for attempt in range(2):
        assignment = (policy.choose(state, node_index, pod) if attempt == 0 else
                      fit.choose_units(state, state.node_at(node_index).name, pod, policy.whole_gpu))
        if assignment is None:
            continue
        if commit:
            try:
                state.allocate(pod, assignment, reserved=reserved)
            except PlacementError:
                continue
        return assignment
    return None


def place_ranked(state: ClusterState, pod: PodDemand, policy: Policy, ranked: np.ndarray, *, commit: bool = True,
                 reserved: bool = False) -> Assignment | None:
    """Choose and commit on the first of `ranked` (node indices, best first) that takes the pod, trying at most
    `MAX_CANDIDATES` of them."""
    for i in ranked[:MAX_CANDIDATES].tolist():
        assignment = choose_and_commit(state, pod, policy, int(i), commit=commit, reserved=reserved)
        if assignment is not None:
            return assignment
    return None


def place(state: ClusterState, pod: PodDemand, policy: Policy, now: np.ndarray, *, commit: bool = True,
          reserved: bool = False) -> Assignment | None:
    """Score the nodes the filter passed (`now`), then choose and commit on the best that takes the pod.
    The caller has shown the pod to the policy (`observe`) and filtered."""
    if not now.any():
        return None
    return place_ranked(state, pod, policy, rank(state, pod, policy, now), commit=commit, reserved=reserved)


def scale_scores(scores: np.ndarray, feasible: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Policy scores ([N], per state row) of the requested nodes (`idx`: their rows, -1 for a node the state does
    not know) -> integers 0..MAX_PRIORITY, as an int64 array in request order.

    Min-max over the feasible requested nodes; the best node(s) get MAX_PRIORITY and every other node at most one
    below, so the policy's pick is strictly preferred by the extender. Unknown or infeasible nodes get 0."""
    out = np.zeros(idx.shape[0], dtype=np.int64)
    ok = idx >= 0
    ok[ok] = feasible[idx[ok]]
    if not ok.any():
        return out
    big = np.finfo(np.float64).max / 4
    s = np.nan_to_num(scores[idx[ok]].astype(np.float64), nan=-big, posinf=big, neginf=-big)
    lo, hi = float(s.min()), float(s.max())
    if hi > lo:
        scaled = np.floor((s - lo) / (hi - lo) * (MAX_PRIORITY - 1)).astype(np.int64)
        out[ok] = np.where(s == hi, MAX_PRIORITY, np.clip(scaled, 0, MAX_PRIORITY - 1))
    else:
        out[ok] = MAX_PRIORITY
    return out
