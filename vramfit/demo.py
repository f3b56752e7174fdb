"""`vramfit demo`: the embedded cluster and queue: whole-GPU, the stock device plugin, and vramfit."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kubeio.files import CliError, load_snapshot
from nodeagent.allocate import AllocateRefused, AnswerSettings, answer_for_node
from nodeagent.config import AgentConfig
from packing.model import GpuGrant, Node
from packing.modes import mode_rules
from packing.policies import DEFAULT_POLICY
from packing.state import ClusterState
from vramfit.stock import POLICY_NAME, simulate_stock
from vramfit.whatif import format_table, load_catalog_arg, load_cluster, load_pending, place_dra, simulate

DATA = Path(__file__).parent / "data"
DEMO_CLUSTER = DATA / "demo-cluster.yaml"
DEMO_PODS = DATA / "demo-pods.yaml"
DEMO_DRA = DATA / "demo-dra.yaml"  # a DRA node and pods waiting for their ResourceClaims
BASELINE = "whole-gpu"
STOCK = POLICY_NAME  # "device-plugin": what the stock NVIDIA device plugin does on the demo's nodes


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="run the embedded demo: whole-GPU, the stock device plugin, and vramfit",
                       description="Place the embedded queue of pods on the embedded cluster three times - one "
                                   "pod per whole GPU, as the stock NVIDIA device plugin does on these nodes "
                                   "(a replica per pod whatever its VRAM, the MIG profile it would name), and "
                                   "with vramfit - and compare.")
    p.add_argument("--policy", default=DEFAULT_POLICY, help="vramfit policy to compare with whole-GPU")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--online", action="store_true",
                   help="vramfit places with its online policy alone (`vramfit serve` with planning: false); "
                        "default: it plans the queue and follows the plan, as serve does by default")
    p.add_argument("--show-files", action="store_true", help="print the paths of the embedded cluster and pods")
    p.set_defaults(func=run)
    return p


def compare(policy: str, planning: bool = True) -> dict[str, Any]:
    """The three runs; vramfit's answers what `vramfit serve` would do (with its default config: the queue
    planned, then followed, unless `planning` is False)."""
    catalog = load_catalog_arg(None)
    runs: dict[str, Any] = {}
    for name in (BASELINE, STOCK, policy):
        state, warnings = load_cluster(str(DEMO_CLUSTER), catalog)
        pending = load_pending(str(DEMO_PODS), catalog=catalog, state=state)
        runs[name] = (simulate_stock(state, pending) if name == STOCK else
                      simulate(state, pending, name, planning=planning and name == policy))
        # vramfit's core never over-commits a unit or mixes tenants on a shared GPU (nor does whole-GPU).
        runs[name]["summary"].setdefault("over_commits", 0)
        runs[name]["summary"].setdefault("tenant_mixes", 0)
        runs[name]["warnings"] = warnings
    add_containers(runs[policy], load_cluster(str(DEMO_CLUSTER), catalog)[0])
    runs[policy]["dra"] = dra_part(policy)
    return runs


def dra_part(policy: str) -> dict[str, Any]:
    """vramfit allocating the demo's ResourceClaims on its DRA node, as its live allocator would."""
    snap = load_snapshot(str(DEMO_DRA), load_catalog_arg(None))
    assert snap.dra is not None
    return place_dra(snap.state, snap.dra, snap.ledger, policy)


def add_containers(run: dict[str, Any], state: ClusterState) -> None:
    """Each placed pod's container environment, as the node agent's Allocate would answer it (vramfit's
    placements only: the whole-GPU baseline's pods would get NVIDIA's device plugin answer instead)."""
    config = AgentConfig()
    settings = AnswerSettings(strategy=config.device_list_strategy, cdi_kind=config.cdi_kind,
                              mps_thread_percentage=config.mps.active_thread_percentage)
    for p in run["placements"]:
        if not p["node"]:
            continue
        grants = tuple(GpuGrant(index=g["index"], vram_mib=g["vram_mib"], mig=g["mig"]) for g in p["gpus"])
        try:
            answer = answer_for_node(state.node(p["node"]), p["pod"], grants, settings, config.mps.root)
        except AllocateRefused as err:
            p["container"] = {"refused": str(err)}
            continue
        p["container"] = {"env": answer.envs,
                          "mounts": [{"container_path": m.container_path, "host_path": m.host_path}
                                     for m in answer.mounts],
                          "memory_limit": [memory_limit(state.node(p["node"]), g) for g in grants]}


def memory_limit(node: Node, grant: GpuGrant) -> str:
    """What bounds the container's VRAM on one unit, and who enforces it."""
    gpu = next(g for g in node.gpus if g.index == grant.index)
    if grant.mig is not None:
        inst = gpu.instance(grant.mig)
        return f"{inst.memory_mib if inst else '?'} MiB (MIG instance, hardware)"
    rules = mode_rules(gpu.mode)
    if rules.client_limited:  # the daemon pins each client's limit
        return f"{grant.vram_mib} MiB (MPS pinned limit)"
    if rules.shared:  # shared without a daemon: nothing caps a replica
        return f"{grant.vram_mib} MiB (advisory: time-slicing enforces nothing without HAMi-core, docs/hami-core.md)"
    return f"{gpu.memory_mib} MiB (whole GPU)"


def format_containers(run: dict[str, Any]) -> str:
    rows = [("POD", "MEMORY LIMIT", "CONTAINER RECEIVES (the node agent's Allocate answer)")]
    for p in run["placements"]:
        c = p.get("container")
        if c is None:
            continue
        text = c.get("refused") or " ".join(f"{k}={v}" for k, v in sorted(c["env"].items()))
        rows.append((p["pod"], "; ".join(c.get("memory_limit", [])), text))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows)


def format_comparison(runs: dict[str, Any]) -> str:
    names = list(runs)
    rows = [("", *names)]
    for label, key in (("pods placed", "placed"), ("pods pending", "unplaced"), ("GPUs used", "gpus_used"),
                       ("VRAM stranded (MiB)", "stranded_vram_mib"), ("VRAM still free (MiB)", "free_vram_mib"),
                       ("pods over their replica", "over_commits"), ("GPUs with 2 tenants", "tenant_mixes")):
        rows.append((label, *(str(runs[n]["summary"][key]) for n in names)))
    total = runs[names[0]]["summary"]["placed"] + runs[names[0]]["summary"]["unplaced"]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"vramfit demo: {total} pods from 5 tenants onto 8x A100-80GB (MIG), 2x H100 (MPS x4), 2x T4 "
           "(time-sliced x4)", ""]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    for name in names:
        out += ["", f"== {name} ==", format_table(runs[name])]
        if any("container" in p for p in runs[name]["placements"]):
            out += ["", format_containers(runs[name])]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if args.show_files:
        print(DEMO_CLUSTER)
        print(DEMO_PODS)
        print(DEMO_DRA)
        return 0
    try:
        runs = compare(args.policy, planning=not args.online)
    except CliError as err:
        print(f"vramfit demo: {err}", file=sys.stderr)
        return 2
    if args.format != "json":
        # Both runs read the same files: their warnings are the same, said once.
        for w in runs[args.policy].get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(runs, indent=2) if args.format == "json" else format_comparison(runs))
    return 0
