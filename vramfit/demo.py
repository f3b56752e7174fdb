"""`vramfit demo`: the embedded cluster and queue, whole-GPU allocation beside vramfit."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from packing.policies import DEFAULT_POLICY
from vramfit.files import CliError
from vramfit.whatif import format_table, load_catalog_arg, load_cluster, load_pending, simulate

DATA = Path(__file__).parent / "data"
DEMO_CLUSTER = DATA / "demo-cluster.yaml"
DEMO_PODS = DATA / "demo-pods.yaml"
BASELINE = "whole-gpu"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="run the embedded demo: whole-GPU allocation vs vramfit",
                       description="Place the embedded queue of pods on the embedded cluster twice - as plain "
                                   "Kubernetes does (one pod per whole GPU) and with vramfit - and compare.")
    p.add_argument("--policy", default=DEFAULT_POLICY, help="vramfit policy to compare with whole-GPU")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--show-files", action="store_true", help="print the paths of the embedded cluster and pods")
    p.set_defaults(func=run)
    return p


def compare(policy: str) -> dict[str, Any]:
    catalog = load_catalog_arg(None)
    runs: dict[str, Any] = {}
    for name in (BASELINE, policy):
        state, warnings = load_cluster(str(DEMO_CLUSTER), catalog)
        pending = load_pending(str(DEMO_PODS))
        runs[name] = simulate(state, pending, name)
        runs[name]["warnings"] = warnings
    return runs


def format_comparison(runs: dict[str, Any]) -> str:
    names = list(runs)
    rows = [("", *names)]
    for label, key in (("pods placed", "placed"), ("pods pending", "unplaced"), ("GPUs used", "gpus_used"),
                       ("VRAM stranded (MiB)", "stranded_vram_mib"), ("VRAM still free (MiB)", "free_vram_mib")):
        rows.append((label, *(str(runs[n]["summary"][key]) for n in names)))
    total = runs[names[0]]["summary"]["placed"] + runs[names[0]]["summary"]["unplaced"]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"vramfit demo: {total} pods from 5 tenants onto 8x A100-80GB (MIG), 2x H100 (MPS x4), 2x T4 "
           "(time-sliced x4)", ""]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    for name in names:
        out += ["", f"== {name} ==", format_table(runs[name])]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if args.show_files:
        print(DEMO_CLUSTER)
        print(DEMO_PODS)
        return 0
    try:
        runs = compare(args.policy)
    except CliError as err:
        print(f"vramfit demo: {err}", file=sys.stderr)
        return 2
    print(json.dumps(runs, indent=2) if args.format == "json" else format_comparison(runs))
    return 0
