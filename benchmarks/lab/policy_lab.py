"""A small, fast replay driver for exploring placement policies on the Alibaba trace.

It follows the FGD protocol (fgd-benchmark.md §2) closely enough to compare policies with each other:
shuffle by seed, inflate by resampling with replacement to 130 % of GPU capacity, one attempt per task,
no deletions, nodes ordered by a seeded permutation (the simulator's tie-break). Python's RNG replaces Go's
`math/rand`, so individual seeds differ from the paper's; the means are what we compare. Placement goes
through `packing.place.schedule_one` only. The project's official harness is `benchmarks/replay.py`; this
driver exists so the policy can be tuned without waiting on it, and `--harness` runs the official one.

    python -m benchmarks.lab.policy_lab --policy vramfit --policy paper:fgd --seeds 42-51 --jobs 10
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.trace import DATA_DIR, DEFAULT_NODES_CSV, TraceNode, TraceTask, load_nodes, load_tasks
from packing.model import Gpu, Mode, Node, PodDemand

MILLI = 1000
TRACES = {
    "default": DATA_DIR / "openb_pod_list_default.csv",
    "gpushare100": DATA_DIR / "openb_pod_list_gpushare100.csv",
    "multigpu20": DATA_DIR / "openb_pod_list_multigpu20.csv",
    "gpuspec10": DATA_DIR / "openb_pod_list_gpuspec10.csv",
}


def trace_node(n: TraceNode, prefix: int) -> Node:
    """A trace node as the core sees it: milli-GPU time-sliced GPUs, one tenant, CPU and memory tracked."""
    gpus = tuple(Gpu(index=j, memory_mib=MILLI, mode=Mode.TIMESLICE, product=n.model, model=n.model)
                 for j in range(n.gpu_count))
    return Node(name=f"{prefix:04d}-{n.name}", gpus=gpus, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib)


def trace_pod(t: TraceTask, key: str) -> PodDemand:
    models = frozenset(m.lower() for m in t.gpu_spec) or None
    return PodDemand(key=key, vram_mib=t.gpu_milli, gpu_count=t.num_gpu, cpu_milli=t.cpu_milli,
                     memory_mib=t.memory_mib, models=models)


def arrivals(tasks: Sequence[TraceTask], capacity_milli: int, seed: int, tune: float) -> list[TraceTask]:
    """Shuffled originals, then resampled copies until the total GPU request reaches tune x capacity."""
    rng = random.Random(seed)
    order = sorted(tasks, key=lambda t: t.name)
    rng.shuffle(order)
    total = sum(t.total_gpu_milli for t in order)
    out = list(order)
    target = tune * capacity_milli
    while total < target:
        t = order[rng.randrange(len(order))]
        if total + t.gpu_milli > target:  # the simulator's quirk: the test adds the per-GPU milli
            break
        total += t.total_gpu_milli
        out.append(t)
    return out


def kind(t: TraceTask) -> str:
    if t.num_gpu == 0:
        return "cpu"
    if t.num_gpu == 1:
        return "share" if t.gpu_milli < MILLI else "1gpu"
    return f"{t.num_gpu}gpu"


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    trace: str
    unalloc_100: float
    unalloc_130: float
    failed_by_kind_100: dict[str, int]
    failed_milli_by_kind_100: dict[str, int]
    seconds: float


def run_one(trace: str, pods_csv: str, nodes_csv: str, policy_name: str, seed: int, tune: float = 1.3,
            params: dict[str, Any] | None = None) -> RunResult:
    """One (policy, seed) run through the project's harness (`benchmarks.replay.replay`).

    With `params`, the run uses `packing.policies.frag_aware.FragAware(**params)` registered under a private name in this
    process, so variants of vramfit's policy can be compared without touching the registry's defaults.
    """
    from benchmarks import replay as harness
    from packing.policies import register
    from packing.policies.frag_aware import FragAware

    name = policy_name
    if params is not None:
        name = "lab:variant"
        fixed = dict(params)

        def make(**kw: Any) -> FragAware:
            return FragAware(name=policy_name, **{**kw, **fixed})

        register(name, make)
    nodes = load_nodes(nodes_csv)
    tasks = load_tasks(pods_csv)
    res = harness.replay(nodes, tasks, name, seed, tune)
    at = {p.arrived_pct: p.alloc_pct for p in res.curve}
    return RunResult(policy_name, seed, trace, 100.0 - at.get(100, 0.0), 100.0 - at.get(130, 0.0),
                     dict(res.failed_by_kind), {}, res.wall_s)


def _star(args: tuple[Any, ...]) -> RunResult:
    return run_one(*args)


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append", required=True)
    ap.add_argument("--trace", action="append", default=None, help=f"one of {', '.join(TRACES)} or a CSV path")
    ap.add_argument("--nodes", default=str(DEFAULT_NODES_CSV))
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--param", action="append", default=[], help="policy parameter key=value (JSON value)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--variant", action="store_true", help="run vramfit through the lab factory even without --param")
    args = ap.parse_args(argv)
    params = {k: json.loads(v) for k, v in (p.split("=", 1) for p in args.param)}
    traces = args.trace or ["default"]
    seeds = parse_seeds(args.seeds)
    jobs = [(tr, str(TRACES.get(tr, tr)), args.nodes, pol, s, args.tune,
             params if (params or args.variant) and pol.startswith(("vramfit", "frag")) else None)
            for tr in traces for pol in args.policy for s in seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        results = list(ex.map(_star, jobs))
    summary: dict[str, Any] = {}
    for tr in traces:
        for pol in args.policy:
            rs = [r for r in results if r.trace == tr and r.policy == pol]
            fk: Counter[str] = Counter()
            for r in rs:
                fk.update(r.failed_by_kind_100)
            row = {
                "unallocated_pct_at_100": round(sum(r.unalloc_100 for r in rs) / len(rs), 3),
                "unallocated_pct_at_130": round(sum(r.unalloc_130 for r in rs) / len(rs), 3),
                "failed_tasks_by_kind": {k: round(v / len(rs), 1) for k, v in sorted(fk.items())},
                "seconds_per_run": round(sum(r.seconds for r in rs) / len(rs), 2),
                "seeds": len(rs),
            }
            summary[f"{tr}/{pol}"] = row
            print(f"{tr:12s} {pol:10s} {json.dumps(params) if pol.startswith(('vramfit', 'frag')) else ''} unalloc@100={row['unallocated_pct_at_100']:6.3f}% "
                  f"@130={row['unallocated_pct_at_130']:6.3f}%  failed tasks {row['failed_tasks_by_kind']} "
                  f"{row['seconds_per_run']}s/run", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"params": params, "summary": summary,
                                               "runs": [r.__dict__ for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
