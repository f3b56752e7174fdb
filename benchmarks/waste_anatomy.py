"""Where the unallocated GPU sits at 100 % arrival, and how far below it any packing of the same pods could go.

At 100 % arrival the unallocated GPU is the free capacity left: slivers of partly used GPUs plus idle GPUs.
For each run this replays the trace (the harness's own `benchmarks.replay.replay`, step fast) and stops the
books at the bound's 100 % point (`benchmarks.lp_bound.prefix`, the same seeded order), then reports:

- the free capacity by where it sits: idle GPUs, and slivers by what the GPU holds (e.g. one 810 alone);
- the LP bound of `benchmarks/lp_bound.py` and the sizes its optimum leaves out (on the default trace: only
  810-milli tasks, 237 of 1,102 on seed 42);
- the **conditional bound**: the same LP forced to hold at least as many of those sizes as the policy placed.
  The unconditional bound reaches its figure by failing pods that arrive while GPUs stand idle; a scheduler
  that places every pod that fits cannot. Given the pods the policy did place, no packing of the rest (no CPU,
  no nodes, the whole order known) leaves less than the conditional bound free.

    python -m benchmarks.waste_anatomy --variant default --policies vramfit,vramfit-measure,paper:fgd \\
        --seeds 42-51 --out benchmarks/results/waste_default
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import lp_bound
from benchmarks.bench_variants import parse_spec, variant_tasks
from benchmarks.cli import parse_seeds
from benchmarks.replay import replay
from benchmarks.trace import MILLI
from benchmarks.variants import default_nodes, variant
from packing.model import PodDemand
from packing.state import ClusterState

TOP_SHAPES = 8  # GPU contents listed per run, by waste


def run_one(job: tuple[str, str, int, float]) -> dict[str, Any]:
    """One (variant, policy spec, seed): the end state's free capacity by place, and both bounds."""
    vname, spec, seed, tune = job
    nodes, tasks = default_nodes(), variant_tasks(variant(vname))
    pre = lp_bound.prefix(nodes, tasks, seed, tune)
    name, params = parse_spec(spec)
    placed: Counter[int] = Counter()  # gpu_milli -> sharing pods placed within the prefix
    held: dict[tuple[int, int], list[int]] = {}  # (node row, GPU index) -> sharing sizes on it
    end: dict[str, Any] = {}
    step = [0]

    def on_step(state: ClusterState, pod: PodDemand, node: str | None) -> None:
        step[0] += 1
        if step[0] > pre.tasks:
            return
        if node is not None and pod.gpu_count == 1 and 0 < pod.vram_mib < MILLI:
            placed[pod.vram_mib] += 1
            row = state.index_of(node)
            grant = next(g for g in state.usage(node).gpus if pod.key in g.grants).gpu.index
            held.setdefault((row, grant), []).append(pod.vram_mib)
        if step[0] == pre.tasks:  # the bound's 100 % point: freeze the books
            pf = np.where(state.present, np.clip(state.pool_free, 0, MILLI), 0)
            end["free"] = int(pf.sum())
            end["idle_gpus"] = int(((pf == MILLI) & state.present).sum())
            waste: Counter[str] = Counter()
            for (row, j), sizes in held.items():
                f = int(pf[row, j])  # a trace GPU's index is its column
                if 0 < f < MILLI:
                    waste["+".join(str(s) for s in sorted(sizes, reverse=True))] += f
            end["waste_by_contents"] = dict(waste.most_common(TOP_SHAPES))
            end["sliver"] = int(pf[(pf > 0) & (pf < MILLI)].sum())

    r = replay(nodes, tasks, name, seed, tune=tune, step="fast", on_step=on_step, policy_params=params)
    free_lp = lp_bound.packing_lp(pre.sharing, pre.bins)
    dropped = _drops(pre.sharing, free_lp)
    floor = Counter({s: min(placed[s], pre.sharing[s]) for s in dropped})
    cond = lp_bound.packing_lp(pre.sharing, pre.bins, at_least=floor)
    # What the conditional optimum leaves out instead: items a work-conserving scheduler would place too, so the
    # conditional bound is loose wherever this is not empty.
    cond_dropped = _drops(pre.sharing, cond)
    unplaced = pre.arrived - pre.whole_gpus * MILLI  # the sharing demand, as `lp_bound.bound_on` counts it

    def pct(milli: float) -> float:
        return 100.0 * milli / pre.cap

    return {"variant": vname, "policy": spec, "seed": seed, "tune": tune,
            "unalloc_100": r.unallocated_at(100), "free_at_stop_pct": pct(end["free"]),
            "idle_gpus": end["idle_gpus"], "sliver_pct": pct(end["sliver"]),
            "waste_by_contents_gpus": {k: v / MILLI for k, v in end["waste_by_contents"].items()},
            "lp_bound_pct": pct(unplaced - free_lp.packed),
            "lp_drops": {str(s): round(n, 1) for s, n in dropped.items()},
            "conditional_drops": {str(s): round(n, 1) for s, n in cond_dropped.items()},
            "arrived": {str(s): pre.sharing[s] for s in dropped}, "placed": {str(s): placed[s] for s in dropped},
            "conditional_bound_pct": pct(unplaced - cond.packed)}


def _drops(sizes: Counter[int], sol: Any) -> dict[int, float]:
    """gpu_milli -> items of that size the LP solution leaves unpacked (more than half an item)."""
    return {s: n - sol.used.get(s // lp_bound.STEP, 0.0) for s, n in sizes.items()
            if n - sol.used.get(s // lp_bound.STEP, 0.0) > 0.5}


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def markdown(runs: Sequence[dict[str, Any]], command: str) -> str:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["variant"], r["policy"]), []).append(r)
    out = [f"Command: `{command}`", "",
           "Means over the seeds. Free at stop: free GPU capacity at the bound's 100 % point (the replay's "
           "unallocated figure bins the events around it); LP: `benchmarks/lp_bound.py`; conditional: the same LP "
           "holding at least as many of the sizes the LP drops as the policy placed.", "",
           "| variant | policy | seeds | unallocated @100 | free at stop | idle GPUs | slivers | LP bound | "
           "LP drops (size: items) | policy placed of them / arrived | conditional bound | conditional LP drops |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (v, p), rows in sorted(by.items()):
        drops = ", ".join(f"{s}: {np.mean([r['lp_drops'].get(s, 0) for r in rows]):.0f}" for s in rows[0]["lp_drops"])
        placed = ", ".join(f"{s}: {np.mean([r['placed'][s] for r in rows]):.0f} / "
                           f"{np.mean([r['arrived'][s] for r in rows]):.0f}" for s in rows[0]["placed"])
        sizes = sorted({s for r in rows for s in r["conditional_drops"]}, key=int)
        cdrops = ", ".join(f"{s}: {np.mean([r['conditional_drops'].get(s, 0) for r in rows]):.0f}" for s in sizes)
        out.append(f"| `{v}` | `{p}` | {len(rows)} | {_mean(rows, 'unalloc_100'):.2f} | "
                   f"{_mean(rows, 'free_at_stop_pct'):.2f} | {_mean(rows, 'idle_gpus'):.1f} | "
                   f"{_mean(rows, 'sliver_pct'):.2f} | {_mean(rows, 'lp_bound_pct'):.2f} | {drops} | {placed} | "
                   f"**{_mean(rows, 'conditional_bound_pct'):.2f}** | {cdrops or '-'} |")
    out += ["", "Free capacity at the stop by what the GPU holds (GPUs, summed over the seeds, the heaviest "
            f"{TOP_SHAPES} per run):", ""]
    for (v, p), rows in sorted(by.items()):
        tot: Counter[str] = Counter()
        for r in rows:
            tot.update(r["waste_by_contents_gpus"])
        top = ", ".join(f"{k} alone: {w:.0f}" if "+" not in k else f"{k}: {w:.0f}" for k, w in tot.most_common(6))
        out.append(f"- `{v}` `{p}`: {top}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=None, help="suite variant name (default: default)")
    ap.add_argument("--policies", default="vramfit,paper:fgd")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    jobs = [(v, p, s, args.tune) for v in (args.variant or ["default"]) for p in args.policies.split(",")
            for s in parse_seeds(args.seeds)]
    for v in {j[0] for j in jobs}:
        try:
            variant(v)
        except KeyError as e:
            raise SystemExit(e.args[0]) from None
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(run_one, jobs))
    command = "python -m benchmarks.waste_anatomy " + " ".join(sys.argv[1:] if argv is None else argv)
    md = markdown(runs, command)
    print(md)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
        Path(f"{args.out}.md").write_text("# Where the unallocated GPU sits (issue 14)\n\n" + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
