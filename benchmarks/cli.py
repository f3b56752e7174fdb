"""The trace replay bench: replay a GPU-sharing trace with the FGD paper's protocol for several policies and seeds.

Run from the source tree as `python -m benchmarks` (benchmarks/__main__.py); the wheel does not ship it. It
needs the `bench` extra (`pip install -e ".[bench]"`: matplotlib, tqdm). Kept import-light: the replay
machinery is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.trace import DEFAULT_NODES_CSV, DEFAULT_PODS_CSV

PROG = "python -m benchmarks"
# Only the bench needs these; they come with the `bench` extra, not with the service.
BENCH_MODULES = ("matplotlib", "tqdm")
PAPER_POLICIES = ("paper:random", "paper:dotprod", "paper:clustering", "paper:packing", "paper:bestfit",
                  "paper:fgd")
DEFAULT_SEEDS = "42-51"


def parse_seeds(text: str) -> list[int]:
    """'42,43,44' or '42-51' or a mix ('42-45,50'); seeds are non-negative integers."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seed list {text!r}: use e.g. 42,43,44 or 42-51") from None
        if a < 0 or b < a:
            raise argparse.ArgumentTypeError(f"bad seed range {part!r} in {text!r}")
        seeds.extend(range(a, b + 1))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Replay a trace in the Alibaba GPU-sharing schema through vramfit's placement core with "
                    "the FGD paper's protocol (shuffle, inflate to --tune x GPU capacity, one attempt per task) "
                    "and report unallocated GPU and fragmentation against arrived workload.")
    p.add_argument("--nodes", default=str(DEFAULT_NODES_CSV), help="node list CSV (default: shipped openb nodes)")
    p.add_argument("--pods", default=str(DEFAULT_PODS_CSV), help="pod list CSV (default: shipped default trace)")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help="policy from the registry (repeatable; default: the six paper:* policies and vramfit)")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds(DEFAULT_SEEDS),
                   help=f"seeds, e.g. 42,43,44 or 42-51 (default {DEFAULT_SEEDS})")
    p.add_argument("--tune", type=float, default=1.3, help="inflate the workload to this x GPU capacity (1.3)")
    p.add_argument("--json", metavar="OUT.json", help="write summary and per-run curves here")
    p.add_argument("--plot", metavar="OUT.png", help="write the plots here")
    p.add_argument("--results-md", metavar="PATH", help="write the Markdown table into this file (e.g. "
                   "benchmarks/RESULTS.md), replacing its generated block")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes); 0 = all CPUs")
    p.add_argument("--step", choices=("core", "fast"), default="core",
                   help="core: packing.place.schedule_one (default); fast: the replay filter (trace_feasible) + the same score/choose/allocate, identical placements")
    p.add_argument("--timing", action="store_true", help="print wall seconds per run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_bench(args, argv)
    except ModuleNotFoundError as err:
        if err.name not in BENCH_MODULES:
            raise
        print(f"{PROG}: needs {err.name}, which comes with the bench extra: pip install -e '.[bench]'",
              file=sys.stderr)
        return 2


def _one(job: tuple[str, str, str, int, float, str], progress: Any = None) -> Any:
    from benchmarks.replay import run

    nodes, pods, policy, seed, tune, step = job
    return run(nodes, pods, policy, seed, tune, progress=progress, step=step)


def _run_all(jobs: list[tuple[str, str, str, int, float, str]], n_jobs: int, progress: bool) -> list[Any]:
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), unit="run", disable=not progress, file=sys.stderr)
    results: list[Any] = [None] * len(jobs)
    try:
        if n_jobs <= 1:
            # In-process runs also get a per-task bar (one run of the default trace takes seconds).
            inner = tqdm(total=0, unit="task", leave=False, disable=not progress, file=sys.stderr)

            def tick(done: int, total: int) -> None:
                inner.total = total
                inner.n = done
                inner.refresh()

            try:
                for i, job in enumerate(jobs):
                    bar.set_postfix_str(f"{job[2]} seed {job[3]}")
                    inner.reset()
                    results[i] = _one(job, tick)
                    bar.update(1)
            finally:
                inner.close()
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=n_jobs) as pool:
                futures = {pool.submit(_one, job): i for i, job in enumerate(jobs)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update(1)
    finally:
        bar.close()
    return results


def command_line(argv: Iterable[str] | None = None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([PROG, *(shlex.quote(a) for a in args)])


def run_bench(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """The bench as `argv` (None: the process's arguments) asked for it, already parsed into `args`."""
    from benchmarks import report
    from benchmarks.trace import load_nodes, load_tasks
    from packing.model import InputError
    from packing.policies import policy_names

    try:  # fail fast, with the file/row/column, before any worker starts
        load_nodes(args.nodes)
        load_tasks(args.pods)
    except InputError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    policies = args.policy or [*PAPER_POLICIES, "vramfit"]
    known = set(policy_names())
    unknown = [p for p in policies if p not in known]
    if unknown:
        print(f"{PROG}: unknown policy {', '.join(unknown)}; known: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    n_jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
    jobs = [(str(args.nodes), str(args.pods), pol, seed, args.tune, args.step)
            for pol in policies for seed in args.seeds]
    runs = _run_all(jobs, n_jobs, progress=not args.no_progress)

    rows = report.summarise(runs)
    print(f"{'policy':<20}{'seeds':>6}{'unalloc@100':>13}{'@130':>8}{'frag rate@90':>14}{'s/run':>8}")
    for s in rows:
        u100 = "-" if s.unalloc_100 is None else f"{s.unalloc_100:.2f}"
        u130 = "-" if s.unalloc_130 is None else f"{s.unalloc_130:.2f}"
        fr = "-" if s.frag_rate_90 is None else f"{s.frag_rate_90:.1f}"
        print(f"{s.policy:<20}{s.seeds:>6}{u100:>13}{u130:>8}{fr:>14}{s.wall_s:>8.1f}")
    if args.timing:
        for r in runs:
            print(f"timing: {r.policy} seed {r.seed}: {r.tasks} tasks, {r.nodes} nodes, {r.wall_s:.2f} s")
    if args.json:
        report.write_json(runs, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(runs, args.plot, title=f"{Path(args.pods).name}, tune {args.tune}")
        print(f"wrote {args.plot}")
    if args.results_md:
        label = f"`{Path(args.pods).name}` on `{Path(args.nodes).name}`, tune {args.tune}"
        report.write_results_md(args.results_md, report.markdown_table(runs, command_line(argv), label))
        print(f"wrote {args.results_md}")
    return 0
