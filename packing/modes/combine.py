"""How the units of one pod may combine: the hardware truths every placement obeys.

A pod's processes must be able to use all its units together, so one pod's units are all of one
`ModeRules.pod_group` (whole GPUs, MIG instances, MPS shares or time-slice replicas, never two), and the
group's `multi_gpu_group` bounds how many GPUs of it one pod may hold. Each mode states its own facts in
its module; these two functions are the one rule that `ClusterState.check`, `fit` and the solvers apply.
"""

from __future__ import annotations

from collections.abc import Sequence

from packing.modes.base import ModeRules

MULTI_GPU_GROUPS = ("any", "one", "per-process")


def group_allows(rules: ModeRules, count: int, per_process: bool) -> bool:
    """A pod may hold `count` GPUs of the rules' group (`per_process`: each of its processes picks its own)."""
    if count <= 1 or rules.multi_gpu_group == "any":
        return True
    return rules.multi_gpu_group == "per-process" and per_process


def combination_problem(units: Sequence[ModeRules], per_process: bool) -> str | None:
    """Why one pod may not hold units of these rules together (one entry per unit); None when it may."""
    groups = sorted({r.group_words for r in units})
    if len(groups) > 1:
        return (f"a pod's GPUs must all be of one kind (a process cannot use them together otherwise); "
                f"this mixes {' and '.join(groups)}")
    if units and not group_allows(units[0], len(units), per_process):
        return f"{len(units)} GPUs of {units[0].group_words} in one pod: {units[0].multi_gpu_why}"
    return None
