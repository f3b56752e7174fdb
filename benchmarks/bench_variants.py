"""Replay the variant suite (`benchmarks.variants`) for several policies and seeds, plus the LP bound (issue 14).

    python -m benchmarks.bench_variants --suite tuning|held-out|all --seeds 3 \
        [--policies vramfit,vramfit-measure,paper:fgd,paper:bestfit] [--jobs 2] [--no-resume]

`--seeds N` takes replay seeds 42..42+N-1 (or a list such as 42-51). Each run is the project's own replay
(`benchmarks.replay.replay`, step "fast") on the variant's tasks; the LP bound is `benchmarks.lp_bound`'s on the
same shuffled and inflated stream. Metric: unallocated GPU % at 100 % arrival, mean ± sd over seeds.

Incremental: finished runs are written to `benchmarks/results/variants_<suite>.json` as they come, and runs
already in any `variants_*.json` (same variant, generator version, policy, seed, tune) are reused, so an
interrupted command picks up where it stopped. Writes `variants_<suite>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path
from typing import Any

from benchmarks.cli import parse_seeds
from benchmarks.trace import TraceNode, TraceTask
from benchmarks.variants import (
    FRESH,
    FRESH8,
    GENERATOR_VERSION,
    HELD_OUT,
    SUITES,
    Variant,
    default_nodes,
    default_tasks,
    suite,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_POLICIES = ("vramfit", "vramfit-measure", "paper:fgd", "paper:bestfit")
LP = "lp-bound"
HELD_OUT_NAMES = {v.name for v in HELD_OUT}
FRESH_NAMES = {v.name for v in FRESH}
FRESH8_NAMES = {v.name for v in FRESH8}


def set_of(v: Variant) -> str:
    """Which part of the suite a row is in: tuning (twins included), held-out, fresh (held out, session 7) or
    fresh8 (held out, session 8)."""
    if v.name in HELD_OUT_NAMES:
        return "held-out"
    return "fresh" if v.name in FRESH_NAMES else "fresh8" if v.name in FRESH8_NAMES else "tuning"



@lru_cache(maxsize=4)
def variant_tasks(v: Variant) -> tuple[TraceTask, ...]:
    """The variant's task list, generated once per process."""
    return tuple(v.tasks(default_tasks()))


def lp_bound_tasks(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], seed: int, tune: float = 1.3) -> float:
    """`benchmarks.lp_bound.bound_on`: lower bound on unallocated GPU % at 100 % arrival (it ignores CPU,
    memory, node boundaries and GPU-model constraints)."""
    from benchmarks.lp_bound import bound_on

    return bound_on(nodes, tasks, seed, tune)["unallocated_pct_lower_bound"]


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """"NAME" or "NAME@key=value@key=value" (values as JSON where they parse, Python's True / False as booleans,
    else strings): a registry policy with parameters for an ablation, e.g. `vramfit@fgd_share=0.5@scarcity=models`.
    The spec is the run's policy label, so runs with different parameters are cached apart."""
    name, *pairs = spec.split("@")
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"policy spec {spec!r}: expected key=value after '@', got {pair!r}")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            # "False" would otherwise pass as a non-empty, truthy string.
            params[key] = {"True": True, "False": False}.get(raw, raw)
    return name, params


def run_one(job: tuple[Variant, str, int, float]) -> dict[str, Any]:
    v, policy, seed, tune = job
    tasks = variant_tasks(v)
    t0 = time.perf_counter()
    if policy == LP:
        u100: float | None = lp_bound_tasks(default_nodes(), tasks, seed, tune)
        u130 = None
        n_tasks = len(tasks)
        failed: dict[str, int] = {}
    else:
        from benchmarks.replay import replay

        name, params = parse_spec(policy)
        r = replay(default_nodes(), tasks, name, seed, tune, step="fast", policy_params=params or None)
        u100, u130, n_tasks, failed = r.unallocated_at(100), r.unallocated_at(130), r.tasks, r.failed_by_kind
    return {"variant": v.name, "family": v.family, "pct": v.pct, "gen_seed": v.gen_seed,
            "generator_version": GENERATOR_VERSION, "policy": policy, "seed": seed, "tune": tune,
            "unalloc_100": u100, "unalloc_130": u130, "tasks": n_tasks, "failed_by_kind": failed,
            "wall_s": round(time.perf_counter() - t0, 3)}


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["variant"], r["generator_version"], r["policy"], r["seed"], r["tune"])


def load_cache(results_dir: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in sorted(results_dir.glob("variants_*.json")):
        try:
            for r in json.loads(p.read_text()).get("runs", []):
                cache[_key(r)] = r
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return cache


def _stats(vals: Sequence[float | None]) -> tuple[float | None, float | None]:
    xs = [x for x in vals if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarise(runs: Sequence[dict[str, Any]], variants: Sequence[Variant], policies: Sequence[str],
              seeds: Sequence[int]) -> list[dict[str, Any]]:
    idx = {(r["variant"], r["policy"], r["seed"]): r for r in runs}
    rows = []
    for v in variants:
        row: dict[str, Any] = {"variant": v.name, "family": v.family, "pct": v.pct, "gen_seed": v.gen_seed,
                               "set": set_of(v)}
        for pol in [*policies, LP]:
            rs = [idx[(v.name, pol, s)] for s in seeds if (v.name, pol, s) in idx]
            mean, sd = _stats([r["unalloc_100"] for r in rs])
            row[pol] = {"mean": mean, "sd": sd, "n": len(rs),
                        "wall_s": statistics.fmean(r["wall_s"] for r in rs) if rs else None}
        if "vramfit" in policies and "paper:fgd" in policies:
            per_seed = [idx[(v.name, "vramfit", s)]["unalloc_100"] - idx[(v.name, "paper:fgd", s)]["unalloc_100"]
                        for s in seeds if (v.name, "vramfit", s) in idx and (v.name, "paper:fgd", s) in idx]
            d, dsd = _stats(per_seed)
            row["vramfit_minus_fgd"] = {"mean": d, "sd": dsd, "n": len(per_seed)}
        rows.append(row)
    return rows


def _fmt(cell: dict[str, Any]) -> str:
    if cell.get("mean") is None:
        return "–"
    return f"{cell['mean']:.2f} ± {cell['sd']:.2f}"


def markdown(rows: Sequence[dict[str, Any]], policies: Sequence[str], seeds: Sequence[int], command: str) -> str:
    out = [f"Command: `{command}`", "",
           f"Unallocated GPU % at 100 % arrival, mean ± sd over replay seeds {seeds[0]}–{seeds[-1]} "
           f"({len(seeds)}); FGD protocol, tune 1.3, `benchmarks.replay` step fast; generator version "
           f"{GENERATOR_VERSION} (`benchmarks/variants.py`). Target: vramfit <= paper:fgd − 0.3.", ""]
    titles = {"tuning": "tuning set", "held-out": "held-out set (never tuned on)",
              "fresh": "fresh held-out set (session 7: held-out settings, new generator seeds; never tuned on)",
              "fresh8": "second fresh set (session 8: held-out settings, generator seeds 4401-4408, drawn after "
                        "the homes term was chosen; never tuned on)"}
    for label in ("tuning", "held-out", "fresh", "fresh8"):
        sel = [r for r in rows if r["set"] == label]
        if not sel:
            continue
        out += [f"### {titles[label]}", ""]
        head = ["variant", *policies, "LP bound", "vramfit − fgd", "target", "s/run " + " / ".join(policies)]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in sel:
            d = r.get("vramfit_minus_fgd", {})
            met = "–" if d.get("mean") is None else ("met" if d["mean"] <= -0.3 else "missed")
            dtxt = "–" if d.get("mean") is None else f"{d['mean']:+.2f} ± {d['sd']:.2f}"
            walls = " / ".join("–" if r[p]["wall_s"] is None else f"{r[p]['wall_s']:.1f}" for p in policies)
            out.append("| " + " | ".join([f"`{r['variant']}`", *[_fmt(r[p]) for p in policies], _fmt(r[LP]),
                                          dtxt, met, walls]) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="tuning", choices=tuple(SUITES))
    ap.add_argument("--seeds", default="3", help="N (seeds 42..42+N-1) or a list such as 42-51")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                    help="comma-separated registry names, each optionally with parameters: NAME@key=value@...")
    ap.add_argument("--variants", default=None, help="comma-separated variant names (a subset of the suite)")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (at most 2 on the shared box)")
    ap.add_argument("--no-lp", action="store_true", help="skip the LP bound")
    ap.add_argument("--no-resume", action="store_true", help="ignore runs cached in results/variants_*.json")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)

    seeds = list(range(42, 42 + int(args.seeds))) if args.seeds.isdigit() else parse_seeds(args.seeds)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    import benchmarks.replay  # noqa: F401  (registers the paper:* peers)
    from packing.policies import policy_names

    try:
        names = {parse_spec(p)[0] for p in policies}
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    unknown = sorted(names - set(policy_names()))
    if unknown:
        print(f"unknown policy {', '.join(unknown)}; known: {', '.join(policy_names())}", file=sys.stderr)
        return 2
    variants = list(suite(args.suite))
    if args.variants:
        wanted = set(args.variants.split(","))
        variants = [v for v in variants if v.name in wanted]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = {} if args.no_resume else load_cache(out_dir)
    jobs = [(v, p, s, args.tune) for v in variants for p in [*policies, *([] if args.no_lp else [LP])]
            for s in seeds]
    runs: list[dict[str, Any]] = []
    todo = []
    for j in jobs:
        k = (j[0].name, GENERATOR_VERSION, j[1], j[2], j[3])
        (runs.append(cache[k]) if k in cache else todo.append(j))
    # Longest first: the default (the LP-pricing policy) and the big multigpu variants.
    todo.sort(key=lambda j: (j[1] != "vramfit", j[1] == LP, -len(variant_tasks(j[0]))))
    json_path = out_dir / f"variants_{args.suite}.json"
    md_path = out_dir / f"variants_{args.suite}.md"
    command = "python -m benchmarks.bench_variants " + " ".join(sys.argv[1:] if argv is None else argv)

    def write() -> None:
        rows = summarise(runs, variants, policies, seeds)
        json_path.write_text(json.dumps({"command": command, "suite": args.suite, "seeds": seeds,
                                         "policies": policies, "generator_version": GENERATOR_VERSION,
                                         "variants": [{"name": v.name, "family": v.family, "pct": v.pct,
                                                       "gen_seed": v.gen_seed,
                                                       "set": set_of(v)} for v in variants],
                                         "summary": rows, "runs": runs}, indent=1) + "\n")
        md_path.write_text(f"# Variant suite `{args.suite}` (issue 14)\n\n"
                           + markdown(rows, policies, seeds, command) + "\n")

    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} cached, {len(todo)} to do", file=sys.stderr)
    t0 = time.perf_counter()
    n_jobs = max(1, min(args.jobs, os.cpu_count() or 1))
    if todo:
        with ProcessPoolExecutor(max_workers=n_jobs) as pool:
            futs = {pool.submit(run_one, j): j for j in todo}
            for i, fut in enumerate(as_completed(futs), 1):
                r = fut.result()
                runs.append(r)
                u = "–" if r["unalloc_100"] is None else f"{r['unalloc_100']:.2f}"
                print(f"[{i}/{len(todo)} {time.perf_counter() - t0:.0f}s] {r['variant']} {r['policy']} "
                      f"seed {r['seed']}: {u} ({r['wall_s']:.1f} s)", file=sys.stderr, flush=True)
                write()
    write()
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
