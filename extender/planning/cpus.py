"""CPUs of their own for the queue planner's worker (config `plan_cpus`).

Why: on CPUs the worker shares with the server, a solve delays the verbs' tail even at nice +10: with the queue kept
full, filter p99 rose from 4.2 to 6.3 ms and bind p99 from 1.4 to 4.6 ms on a 2-CPU box, while the verbs' own time
inside the server did not move (an earlier round, in git history). With the worker on a CPU the server does not
use, the tail is back within noise (benchmarks/results/extender_plan_inline40.md, `--plan-cpus 1`).

So `plan_cpus: N` gives the worker the N highest-numbered CPUs this process may use, and moves the server's
threads to the others. A count, not CPU numbers: under the kubelet's static CPU manager policy (a Guaranteed pod
with an integer CPU request) the container's CPUs are exclusive but which ones is known only at run time. 0 (the
default) pins nothing.
"""

from __future__ import annotations

import os
from collections.abc import Collection


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on now (its affinity mask: the container's cpuset)."""
    return frozenset(os.sched_getaffinity(0))


def split_cpus(count: int, allowed: Collection[int]) -> tuple[frozenset[int], frozenset[int]]:
    """-> (the worker's CPUs: the `count` highest-numbered of `allowed`, the server's: the rest); ValueError saying
    what is wrong when none would be left to the server."""
    ordered = sorted(allowed)
    if count < 1:
        raise ValueError(f"plan_cpus: {count}: give the worker at least one CPU (0 pins nothing)")
    if count >= len(ordered):
        raise ValueError(f"plan_cpus: {count} of the {len(ordered)} CPUs this process may use "
                         f"({', '.join(map(str, ordered))}) would leave none to the server")
    return frozenset(ordered[-count:]), frozenset(ordered[:-count])


def pin_this_process(cpus: Collection[int]) -> None:
    """Every thread of this process onto `cpus` (a thread started later inherits its starter's mask, so the
    verbs' thread pool follows). Linux only: /proc/self/task lists the threads."""
    mask = set(cpus)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
