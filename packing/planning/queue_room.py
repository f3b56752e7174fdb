"""Whether a pending queue is roomy: every pod fits now on more nodes than there are pods ahead of it, so any
policy that puts each pod on some node it fits places them all (`room`); and whether that still holds after some
node rows changed (`still_roomy`, `roomy_in_any_order`, `extend_room`), so the planner (`extender.planning.planner`) can
republish a roomy plan without planning again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from packing import fit
from packing.model import PodDemand
from packing.state import ClusterState

Shape = tuple[object, ...]  # PodDemand.shape: what decides a pod's fit


def room(state: ClusterState, pods: Sequence[PodDemand], whole_gpu: bool) -> dict[Shape, int] | None:
    """Whether any policy that puts each pod, in this order, on some node it fits places every one of `pods`: the
    r-th pod (from 0) fits now on more than r nodes. Why that suffices: a placement changes only the node it lands
    on, so the r pods before it make at most r of those nodes unfit. One vectorised filter per pod shape, where a
    greedy pass scores every pod (about 1 ms a pod on a large cluster). Returns the nodes each shape fits now
    (`still_roomy` reuses them), or None when the queue is not roomy."""
    last = _last_ranks(pods)
    counts: dict[Shape, int] = {}
    for shape, (r, p) in last.items():
        counts[shape] = int(np.count_nonzero(fit.feasible(state, p, whole_gpu).now))
        if counts[shape] <= r:
            return None
    return counts


def still_roomy(counts: Mapping[Shape, int], pods: Sequence[PodDemand], moved_rows: int) -> bool:
    """Whether `pods` (queue order) are roomy on a state whose `room` counts were `counts`, `moved_rows` node rows
    ago: a changed row turns at most one node unfit, so each shape still fits at least its count minus that many.
    A shape not counted then is not known: False (plan again)."""
    return all(shape in counts and counts[shape] - moved_rows > r for shape, (r, _) in _last_ranks(pods).items())


def roomy_in_any_order(counts: Mapping[Shape, int], shapes: Iterable[Shape], n: int, moved_rows: int) -> bool:
    """`still_roomy` for a queue known only by its pod shapes and its size `n` (at most `n` pods, in any order): a
    pod's rank is below `n`, so each shape fitting more than `n - 1` nodes after `moved_rows` changed rows is
    enough. It needs no queue order, so the planner answers it in time per shape, not per pod."""
    return all(shape in counts and counts[shape] - moved_rows > n - 1 for shape in shapes)


def extend_room(state: ClusterState, counts: Mapping[Shape, int], pods: Iterable[PodDemand], moved_rows: int,
                whole_gpu: bool) -> dict[Shape, int]:
    """`counts` (taken `moved_rows` row changes ago) with the shapes of `pods` it lacks counted on `state` now,
    each plus `moved_rows`: so every entry keeps one meaning, a shape fits at least its entry minus the rows that
    moved since the first counts (a newcomer of a new shape costs one vectorised filter, not a plan)."""
    out = dict(counts)
    for p in pods:
        shape = p.shape
        if shape not in out:
            out[shape] = int(np.count_nonzero(fit.feasible(state, p, whole_gpu).now)) + moved_rows
    return out


def _last_ranks(pods: Sequence[PodDemand]) -> dict[Shape, tuple[int, PodDemand]]:
    last: dict[Shape, tuple[int, PodDemand]] = {}
    for r, p in enumerate(pods):
        last[p.shape] = (r, p)  # the shape's latest pod is its tightest test
    return last
