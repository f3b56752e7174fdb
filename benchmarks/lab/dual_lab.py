"""Replay `frag-dual` variants (packing/policies/frag_dual.py) through the project harness, one run at a time.

    python -m benchmarks.lab.dual_lab --trace default --seeds 42,43 --param combine='"weighted"' --param lam=1 \
        --json benchmarks/results/dual_weighted_l1.json

Each run is `benchmarks.replay.replay(..., policy_params=params)` on the registry's `frag-dual`; with
`--policy vramfit` it replays the default policy instead (to re-check the baseline on the same code).
The delta vs paper:fgd is against the harness's stored runs (`benchmarks/results/paper_<trace>.json`),
matched seed by seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lab.policy_lab import TRACES, parse_seeds
from benchmarks.trace import DEFAULT_NODES_CSV, load_nodes, load_tasks
from packing.model import PodDemand
from packing.state import ClusterState

RESULTS = Path(__file__).resolve().parent.parent / "results"


class EndState:
    """`replay`'s on_step hook: where the free GPU capacity sits when arrivals first reach 100 %."""

    def __init__(self, capacity_milli: int) -> None:
        self.cap = capacity_milli
        self.arrived = 0
        self.failed: dict[str, list[int]] = {}  # kind -> [tasks, milli] failed before 100 %
        self.snapshot: dict[str, Any] | None = None

    def __call__(self, state: ClusterState, pod: PodDemand, node: str | None) -> None:
        if self.snapshot is not None:
            return
        self.arrived += pod.vram_mib * pod.gpu_count
        if node is None and pod.gpu_count:
            kind = "share" if pod.gpu_count == 1 and pod.vram_mib < 1000 else f"{pod.gpu_count}-gpu"
            f = self.failed.setdefault(kind, [0, 0])
            f[0] += 1
            f[1] += pod.vram_mib * pod.gpu_count
        if self.arrived >= self.cap:
            free = np.where(state.present, state.pool_free, 0)
            partial = state.present & (free > 0) & (free < state.vram)
            idle = state.present & (free == state.vram)
            starved = idle & (state.cpu_free < 4000)[:, None]  # nodes that cannot take a typical whole-GPU task
            self.snapshot = {"free_gpus": round(float(free.sum()) / 1000, 1),
                             "sliver_gpus": round(float(free[partial].sum()) / 1000, 1),
                             "partial_gpus": int(partial.sum()), "idle_gpus": int(idle.sum()),
                             "idle_gpus_cpu_below_4_cores": int(starved.sum()),
                             "failed_before_100": {k: {"tasks": v[0], "gpus": round(v[1] / 1000, 1)}
                                                   for k, v in sorted(self.failed.items())}}


def paper_fgd(trace: str) -> dict[int, float]:
    """seed -> paper:fgd's unallocated % at 100 % arrival from the harness's stored runs (may be empty)."""
    path = RESULTS / f"paper_{trace}.json"
    if not path.exists():
        return {}
    out: dict[int, float] = {}
    for r in json.loads(path.read_text())["runs"]:
        if r["policy"] == "paper:fgd":
            for p in r["curve"]:
                if p["arrived_pct"] == 100:
                    out[int(r["seed"])] = round(100.0 - float(p["alloc_pct"]), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks import replay as harness

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="frag-dual")
    ap.add_argument("--trace", action="append", default=None)
    ap.add_argument("--seeds", default="42,43")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--param", action="append", default=[], help="policy parameter key=value (JSON value)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--diag", action="store_true", help="record where free GPU capacity sits at 100 %% arrival")
    args = ap.parse_args(argv)
    params: dict[str, Any] = {k: json.loads(v) for k, v in (p.split("=", 1) for p in args.param)}
    nodes = load_nodes(DEFAULT_NODES_CSV)
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for tr in args.trace or ["default"]:
        tasks = load_tasks(TRACES.get(tr, tr))
        fgd = paper_fgd(tr)
        rows: list[dict[str, Any]] = []
        for seed in parse_seeds(args.seeds):
            end = EndState(1000 * sum(n.gpu_count for n in nodes)) if args.diag else None
            res = harness.replay(nodes, tasks, args.policy, seed, args.tune, step="fast", on_step=end,
                                 policy_params=params or None)
            u100 = res.unallocated_at(100)
            u130 = res.unallocated_at(130)
            row = {"trace": tr, "seed": seed, "unalloc_100": u100, "unalloc_130": u130,
                   "paper_fgd_100": fgd.get(seed), "failed_by_kind": res.failed_by_kind,
                   "seconds": round(res.wall_s, 1)}
            if end is not None:
                row["at_100"] = end.snapshot
                print(f"  at 100 %: {json.dumps(end.snapshot)}", flush=True)
            rows.append(row)
            print(f"{tr} seed {seed}: {u100:.2f} % @100 (paper:fgd {fgd.get(seed)}), {u130:.2f} % @130, "
                  f"{res.wall_s:.0f} s", flush=True)
        runs += rows
        mean = sum(r["unalloc_100"] for r in rows) / len(rows)
        paired = [r["paper_fgd_100"] for r in rows if r["paper_fgd_100"] is not None]
        fgd_mean = sum(paired) / len(paired) if len(paired) == len(rows) else None
        summary[tr] = {"unallocated_pct_at_100": round(mean, 3),
                       "unallocated_pct_at_130": round(sum(r["unalloc_130"] for r in rows) / len(rows), 3),
                       "paper_fgd_same_seeds": None if fgd_mean is None else round(fgd_mean, 3),
                       "delta_vs_paper_fgd": None if fgd_mean is None else round(mean - fgd_mean, 3),
                       "seeds": len(rows)}
        print(f"{tr} {args.policy} {json.dumps(params)}: {json.dumps(summary[tr])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"policy": args.policy, "params": params, "summary": summary,
                                               "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
