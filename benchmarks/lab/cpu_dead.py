"""Where the free GPU capacity sits at the 100 % point, by whether a pod could still use it (issue 14).

    python -m benchmarks.lab.cpu_dead --variant default --variant multigpu50-g1404 --policy vramfit \
        --policy vramfit@cpu_gap=False --policy paper:fgd --seeds 42

Each GPU's free capacity, in GPUs, falls into one of four classes:
- *idle*: the whole GPU is free;
- *fillable*: some 1-GPU shape of the trace fits it, with the CPU and memory its node has left;
- *CPU-dead*: a shape is small enough for it, but its node lacks the CPU or memory for every such shape;
- *too small*: no shape of the trace is that small.

POLICY_NOTES.md, "The dual cost sees CPU", reads the CPU-dead column.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks import lp_bound
from benchmarks.bench_variants import parse_spec, variant_tasks
from benchmarks.cli import parse_seeds
from benchmarks.replay import replay
from benchmarks.trace import MILLI, TraceTask
from benchmarks.variants import default_nodes, variant
from packing.model import PodDemand
from packing.state import ClusterState

CLASSES = ("idle", "fillable", "cpu-dead", "too-small")


@dataclass(frozen=True)
class Shapes:
    """The trace's 1-GPU shapes as columns: per-GPU milli, CPU milli, memory MiB."""

    milli: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.int64]
    mem: npt.NDArray[np.int64]

    @staticmethod
    def of(tasks: Sequence[TraceTask]) -> Shapes:
        rows = sorted({(t.gpu_milli, t.cpu_milli, t.memory_mib) for t in tasks if t.num_gpu == 1 and t.gpu_milli})
        a = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return Shapes(milli=a[:, 0], cpu=a[:, 1], mem=a[:, 2])


def classify(state: ClusterState, shapes: Shapes) -> dict[str, float]:
    """Free capacity of the state in GPUs (1,000 milli each) by class (module docstring)."""
    out = dict.fromkeys(CLASSES, 0.0)
    for i in range(len(state)):
        nu = state.usage(state.node_at(i).name)
        cpu = nu.node.cpu_milli - nu.cpu_used
        mem = nu.node.memory_mib - nu.mem_used
        room = (shapes.cpu <= cpu) & (shapes.mem <= mem)
        for gu in nu.gpus:
            free = gu.gpu.memory_mib - gu.used_mib
            if free <= 0:
                continue
            if free >= gu.gpu.memory_mib:
                cls = "idle"
            elif (room & (shapes.milli <= free)).any():
                cls = "fillable"
            elif (shapes.milli <= free).any():
                cls = "cpu-dead"
            else:
                cls = "too-small"
            out[cls] += free / MILLI
    return out


def at_full_arrival(variant_name: str, spec: str, seed: int, tune: float = 1.3) -> tuple[float | None, dict[str, float]]:
    """(unallocated % at 100 %, the classes at the 100 % point). The point is `lp_bound.prefix`'s, as in
    `benchmarks.waste_anatomy`: after the last task whose GPU demand still fits in the capacity."""
    nodes = default_nodes()
    tasks = variant_tasks(variant(variant_name))
    shapes = Shapes.of(tasks)
    stop = lp_bound.prefix(nodes, tasks, seed, tune).tasks
    step = 0
    found: dict[str, float] = {}

    def on_step(state: ClusterState, pod: PodDemand, node: str | None) -> None:
        nonlocal step
        step += 1
        if step == stop:
            found.update(classify(state, shapes))

    name, params = parse_spec(spec)
    run = replay(nodes, tasks, name, seed, tune=tune, step="fast", on_step=on_step, policy_params=params)
    return run.unallocated_at(100), found


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="a suite variant name, e.g. default")
    ap.add_argument("--policy", action="append", required=True, help="NAME or NAME@key=value@...")
    ap.add_argument("--seeds", default="42", help="replay seeds: 42,43 or 42-51")
    args = ap.parse_args(argv)
    for v in args.variant:
        try:
            variant(v)
        except KeyError as e:
            ap.error(e.args[0])
    print("| variant | policy | seed | unallocated @100 | " + " | ".join(f"{c} (GPUs)" for c in CLASSES) + " |")
    print("|---|---|---|---|" + "---|" * len(CLASSES))
    for v in args.variant:
        for spec in args.policy:
            for seed in parse_seeds(args.seeds):
                unalloc, classes = at_full_arrival(v, spec, seed)
                cells = " | ".join(f"{classes.get(c, 0.0):.1f}" for c in CLASSES)
                print(f"| `{v}` | `{spec}` | {seed} | {unalloc if unalloc is None else round(unalloc, 2)} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
