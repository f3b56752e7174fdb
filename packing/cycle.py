"""One scheduling cycle: filter -> score -> choose -> commit, with one rule for "choose found nothing".

`place.schedule_one` (what-if, demo, the trace replay's general step) and the replay's trace step run this
cycle; they differ only in the filter they hand it (`fit.feasible`'s mask, or the replay's specialised
`trace_feasible`, which equals it on replay states).

The rule when a node's choice fails: the policy's own unit choice first; where it has none (a policy
written for another resource model, e.g. the trace's milli-GPUs on a MIG node) the core's best fit
(`fit.choose_units`); where `allocate` still refuses, the next node in the ranking, up to
`MAX_CANDIDATES` nodes. The best node nearly always works.
"""

from __future__ import annotations

import numpy as np

from packing import fit
from packing.model import Assignment, PodDemand
from packing.policies.base import Policy
from packing.state import ClusterState, PlacementError

MAX_CANDIDATES = 8  # nodes tried, best first, before the pod is reported as not placed


def rank(state: ClusterState, pod: PodDemand, policy: Policy, now: np.ndarray) -> np.ndarray:
    """Indices of the nodes in `now` (the filter's [N] mask), best first (ties: lowest index, cluster order)."""
    idx = np.flatnonzero(now)
    if idx.size == 0:
        return idx
    scores = np.asarray(policy.score(state, pod, now), dtype=np.float64)[idx]
    order = np.lexsort((idx, -scores))  # stable: highest score, then lowest index
    return idx[order]


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


def place(state: ClusterState, pod: PodDemand, policy: Policy, now: np.ndarray, *, commit: bool = True,
          reserved: bool = False) -> Assignment | None:
    """Score the nodes the filter passed (`now`), then choose and commit on the best that takes the pod.
    The caller has shown the pod to the policy (`observe`) and filtered."""
    if not now.any():
        return None
    for i in rank(state, pod, policy, now)[:MAX_CANDIDATES]:
        assignment = choose_and_commit(state, pod, policy, int(i), commit=commit, reserved=reserved)
        if assignment is not None:
            return assignment
    return None
