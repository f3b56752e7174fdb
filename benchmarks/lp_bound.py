"""A lower bound on unallocated GPU % at 100 % arrival on a trace, for any policy, online or offline.

At 100 % arrival the arrived GPU demand equals the cluster's GPU capacity, so unallocated GPU = the demand of
the tasks that failed. Relax everything but GPU capacity: no CPU or memory limits, no node boundaries, every
task's arrival order known. Whole-GPU tasks then cost nothing beyond their GPUs; the sharing tasks
(gpu_milli < 1000) must be packed into the remaining GPUs (bins of 1000). The most sharing demand that fits
is the LP relaxation of an arc-flow bin-packing model (Valerio de Carvalho 1999; all trace sizes are
multiples of 10), solved with OR-Tools GLOP by the same code that prices GPU gaps for the default `vramfit`. Anything it cannot place is unallocated for every policy.

    python -m benchmarks.lp_bound [--pods CSV ...] [--seeds 42,43]

Same shuffle / inflation as the harness (`benchmarks.replay`), so the bound is per seed.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import replay as harness
from benchmarks.trace import (
    DEFAULT_NODES_CSV,
    DEFAULT_PODS_CSV,
    MILLI,
    TraceNode,
    TraceTask,
    load_nodes,
    load_tasks,
)
from packing.policies.frag_dual import DualSolution, solve_duals

STEP = 10  # milli-GPU grid of the arc-flow graph


def packing_lp(sizes: Counter[int], bins: int, at_least: Counter[int] | None = None) -> DualSolution:
    """The arc-flow LP over `bins` idle GPUs of 1000 (the core's, `packing.policies.frag_dual.solve_duals`, no
    tie-breaking perturbation): `.packed` is the most milli of these sharing items they can hold, `.used` the
    items of each size (in cells of STEP) that optimum packs. at_least: sizes (milli) the packing must hold at
    least that many of."""
    expected = {s // STEP: float(n) for s, n in sizes.items()}
    floor = {s // STEP: float(n) for s, n in (at_least or Counter()).items()}
    return solve_duals(expected, {0: float(bins)}, MILLI // STEP, STEP, perturb=0.0, at_least=floor, primal=True)


def sharing_packable_milli(sizes: Counter[int], bins: int) -> float:
    """LP optimum: most milli of these sharing items that `bins` GPUs of 1000 can hold."""
    return packing_lp(sizes, bins).packed


@dataclass(frozen=True)
class Prefix:
    """The tasks of one seeded run up to 100 % arrival: the first `tasks` of the harness's inflated order whose
    GPU demand fits in the capacity (the bound's stopping rule)."""

    cap: int  # cluster GPU capacity, milli
    tasks: int  # tasks in the prefix
    arrived: int  # their GPU demand, milli
    whole_gpus: int  # GPUs asked by whole-GPU tasks
    sharing: Counter[int]  # gpu_milli -> sharing tasks

    @property
    def bins(self) -> int:
        """GPUs left for the sharing tasks once every whole-GPU task has its own."""
        return self.cap // MILLI - self.whole_gpus


def prefix(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], seed: int, tune: float = 1.3) -> Prefix:
    rng = np.random.default_rng(seed)
    harness.node_order(nodes, rng)  # consume the RNG exactly as the harness does
    cap = MILLI * sum(n.gpu_count for n in nodes)
    run = harness.inflate(harness.arrival_order(tasks, rng), tasks, tune, cap, rng)
    arrived = whole_gpus = n = 0
    sharing: Counter[int] = Counter()
    for _, t in run:
        if arrived + t.total_gpu_milli > cap:
            break
        n += 1
        arrived += t.total_gpu_milli
        if t.num_gpu == 0 or t.gpu_milli == 0:
            continue
        if t.gpu_milli == MILLI:
            whole_gpus += t.num_gpu
        else:
            sharing[t.gpu_milli] += 1
    if any(s % STEP for s in sharing):
        raise ValueError(f"sizes not on the {STEP}-milli grid")
    return Prefix(cap=cap, tasks=n, arrived=arrived, whole_gpus=whole_gpus, sharing=sharing)


def bound(pods_csv: str | Path, seed: int, tune: float = 1.3) -> dict[str, float]:
    return bound_on(load_nodes(DEFAULT_NODES_CSV), load_tasks(pods_csv), seed, tune)


def bound_on(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], seed: int, tune: float = 1.3) -> dict[str, float]:
    """The bound on in-memory records (the trace's own, or a generated variant's)."""
    p = prefix(nodes, tasks, seed, tune)
    placed = sharing_packable_milli(p.sharing, p.bins) if p.sharing else 0.0
    return {"arrived_pct": 100.0 * p.arrived / p.cap, "unallocated_pct_lower_bound":
            100.0 * (p.arrived - p.whole_gpus * MILLI - placed) / p.cap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", action="append", default=None)
    ap.add_argument("--seeds", default="42,43")
    args = ap.parse_args()
    for csv in args.pods or [str(DEFAULT_PODS_CSV)]:
        for seed in (int(s) for s in args.seeds.split(",")):
            b = bound(csv, seed)
            print(f"{Path(csv).name} seed {seed}: arrived {b['arrived_pct']:.2f} %, unallocated GPU >= "
                  f"{b['unallocated_pct_lower_bound']:.3f} %")


if __name__ == "__main__":
    main()
