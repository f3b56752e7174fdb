"""What the default policy's deferred work costs: every LP refresh and mix rebuild, timed step by step.

The bench's cluster and pod stream (`benchmarks.bench_extender`), the live policy as the served extender runs
it (`FragDual.go_live`), no HTTP: each pod is scored, placed and bound through the core, and whenever work
falls due its refresh steps (`FragDual.refresh_steps`, what `extender/refresh.py` runs between requests) are run
at once and timed. Per refresh: what it did, its total time, its steps and its longest step (how long a request
may wait behind it). In a closed loop with no idle time (`bench_extender`) this work costs cycles; on a live
cluster it fills the gaps between kube-scheduler's calls.

    .venv/bin/python -m benchmarks.refresh_cost --nodes 5000 --pods 600

Not a test: nothing is asserted. The figures of record are in benchmarks/results/request_path.md.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.bench_extender import BENCH_NAMESPACE, make_node, make_pod
from extender.store import Store
from packing import fit
from packing.catalog import load_catalog
from packing.k8s.demand import pod_demand
from packing.policies import get_policy
from packing.policies.frag_dual import FragDual


@dataclass
class Refresh:
    pods: int  # pods placed when it fell due
    work: str  # "lp", "mix" or both
    total_ms: float
    steps: int
    longest_ms: float


def run(n_nodes: int, n_pods: int, seed: int) -> list[Refresh]:
    store = Store.from_objects([make_node(k) for k in range(n_nodes)] + [BENCH_NAMESPACE], load_catalog())
    state = store.state
    policy = get_policy("vramfit")
    assert isinstance(policy, FragDual)
    policy.go_live(lambda: None)
    rng = random.Random(seed)
    out: list[Refresh] = []
    gc.collect()
    gc.freeze()
    for j in range(n_pods):
        pod = pod_demand(make_pod(j, rng), store.tenancy)
        assert pod is not None
        policy.observe(pod)
        scores = policy.score(state, pod, fit.feasible(state, pod).now)
        chosen = policy.choose(state, int(np.argmax(scores)), pod)
        if chosen is not None:
            state.allocate(pod, chosen)
        if policy.refresh_due():
            out.append(_timed(policy, state, j + 1))
    gc.unfreeze()
    return out


def _timed(policy: FragDual, state: object, pods: int) -> Refresh:
    work = "+".join(sorted(policy._due))  # noqa: SLF001 - what fell due, before the steps clear it
    steps = policy.refresh_steps(state)  # type: ignore[arg-type]
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        try:
            next(steps)
        except StopIteration:
            times.append(time.perf_counter() - t0)
            break
        times.append(time.perf_counter() - t0)
    return Refresh(pods, work, 1000 * sum(times), len(times) - 1, 1000 * max(times))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=600)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    refreshes = run(args.nodes, args.pods, args.seed)
    print("| pods placed | work | total ms | steps | longest step ms |")
    print("|---:|---|---:|---:|---:|")
    for r in refreshes:
        print(f"| {r.pods} | {r.work} | {r.total_ms:.1f} | {r.steps} | {r.longest_ms:.2f} |")
    for work in sorted({r.work for r in refreshes}):
        mine = [r.total_ms for r in refreshes if r.work == work]
        print(f"{work}: {len(mine)} refreshes, {sum(mine):.1f} ms in all, median {statistics.median(mine):.1f} ms")
    total = sum(r.total_ms for r in refreshes)
    print(f"all: {total:.1f} ms over {args.pods} pods = {total / args.pods:.3f} ms a pod")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
