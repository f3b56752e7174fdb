"""Speed of one replay: one policy x one seed over the inflated default trace.

    .venv/bin/python -m benchmarks.bench_replay_speed [--policy paper:fgd ...] [--seed 42] [--step fast|core]
        [--repeat 1] [--out benchmarks/results/replay_speed.json]

A policy may carry parameters as in `benchmarks.bench_variants` (`--policy vramfit@homes=0`).

Prints wall seconds and process CPU seconds per run (trace loading included, as `benchmarks.replay.run`
does it) and writes them to a JSON file. On a shared machine the CPU seconds are the figure to read: wall
time then includes waiting for the other processes. Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from benchmarks.bench_variants import parse_spec
from benchmarks.replay import run
from benchmarks.trace import DEFAULT_NODES_CSV, DEFAULT_PODS_CSV

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "replay_speed.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--step", choices=("core", "fast"), default="core")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--nodes", default=str(DEFAULT_NODES_CSV))
    ap.add_argument("--pods", default=str(DEFAULT_PODS_CSV))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the first run")
    args = ap.parse_args(argv)
    policies = args.policy or ["paper:bestfit", "paper:fgd"]
    rows = []
    for name in policies:
        policy, params = parse_spec(name)
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            c0 = time.process_time()
            if args.profile and rep == 0:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                res = prof.runcall(run, args.nodes, args.pods, policy, args.seed, 1.3, None, args.step, params or None)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            else:
                res = run(args.nodes, args.pods, policy, args.seed, step=args.step, policy_params=params or None)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            print(f"{name:18s} seed {args.seed} step {args.step}: {res.tasks} tasks on {res.nodes} nodes "
                  f"in {wall:.2f} s wall, {cpu:.2f} s CPU "
                  f"({res.unallocated_at(100):.2f} % unallocated at 100 % arrival)")
            rows.append({"policy": name, "seed": args.seed, "step": args.step, "tasks": res.tasks,
                         "nodes": res.nodes, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load_avg_1min": load},
                               "runs": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
