"""Issue 13: the pending queue planned with CP-SAT (`packing.planning.queue_plan.plan_queue`) vs the online policy.

    nice -n 10 .venv/bin/python -m benchmarks.bench_queue [--parts a,b,c] [--seeds 42] [--batches 16,64]
        [--limit 0.5] [--trace-limit 0.25]

(a) bursts on the multi-tenant queue (the issue's 10-pod queue) and the VRAM scenarios (benchmarks.vram_scenarios:
    24 nodes / 152 GPUs, inference and trace demands): pods arrive in bursts of 16; "online" places each pod with
    vramfit as it comes; "planned" plans each burst with plan_queue on the current state, commits the plan, and
    sends the pods it leaves out through the online policy; "optimum" is solve_optimal on the whole set at once
    (a batch that saw every pod: an upper reference, proven where it says so).
(b) the burst trace: benchmarks.replay's protocol (openb default trace, seeded node order, shuffle, inflation to
    130 %), arrivals grouped into batches of B; each batch is planned on the current state and committed as in (a);
    unallocated GPU % at 100 % arrival beside the online vramfit run of the same seed.
(c) plan time on 5,000 nodes x 8 GPUs (benchmarks.bench_scoring.mixed_cluster) with 200 pending pods.

Writes benchmarks/results/queue.json and queue.md. Figures, not asserts: a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import replay as rp
from benchmarks.trace import DEFAULT_NODES_CSV, DEFAULT_PODS_CSV, MILLI, load_nodes, load_tasks
from benchmarks.vram_scenarios import DEMANDS, modern_cluster
from packing.catalog import load_catalog
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.planning.queue_plan import QueuedPod, plan_queue
from packing.policies import Policy, get_policy
from packing.solvers.optimal import solve_optimal
from packing.state import ClusterState

RESULTS = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------------------- (a) bursts
def multi_tenant() -> tuple[list[Node], list[PodDemand]]:
    """The issue's queue: an any-GPU pod takes the only T4 before a T4-only pod; two 1-GPU pods take the only
    2-GPU node's GPUs one by one before a 2-GPU pod (tests/packing/test_queue_plan.py uses it)."""
    cat = load_catalog()
    t4m, a100m = cat.get("T4"), cat.get("A100-80GB")
    assert t4m is not None and a100m is not None

    def t4(i: int) -> Gpu:
        return Gpu(i, 15360, Mode.EXCLUSIVE, "Tesla-T4", "T4")

    def a100(i: int, mode: Mode = Mode.EXCLUSIVE, replicas: int | None = None) -> Gpu:
        return Gpu(i, 81920, mode, "NVIDIA-A100-SXM4-80GB", "A100-80GB", replicas=replicas)

    def h100(i: int) -> Gpu:
        return Gpu(i, 81559, Mode.EXCLUSIVE, "NVIDIA-H100-80GB-HBM3", "H100-80GB")

    nodes = [Node("t4-0", (t4(0),)), Node("a100-0", (a100(0),)), Node("h100-0", (h100(0), h100(1))),
             Node("h100-1", (h100(0),)), Node("h100-2", (h100(0),)), Node("mps-0", (a100(0, Mode.MPS, 4),))]
    hw, proc = Isolation.HARDWARE, Isolation.PROCESS
    pods = [
        PodDemand("search/any-10g", 10240, tenant="search", isolation=hw),
        PodDemand("ads/t4-only", 12288, tenant="ads", isolation=hw, models=frozenset({"t4"})),
        PodDemand("research/one-a", 30720, tenant="research", isolation=hw),
        PodDemand("research/one-b", 30720, tenant="research", isolation=hw),
        PodDemand("vision/two-gpu", 40960, gpu_count=2, tenant="vision", isolation=hw),
        PodDemand("speech/s1", 9000, tenant="speech", isolation=proc),
        PodDemand("speech/s2", 9000, tenant="speech", isolation=proc),
        PodDemand("platform/p1", 9000, tenant="platform", isolation=proc),
        PodDemand("speech/s3", 9000, tenant="speech", isolation=proc),
        PodDemand("speech/s4", 9000, tenant="speech", isolation=proc),
    ]
    return nodes, pods


def commit_burst(state: ClusterState, burst: Sequence[PodDemand], policy: Policy, limit: float,
                 t0: float, previous: Any = None, repack: bool = True) -> tuple[int, Any, float]:
    """Plan a burst on the current state with a fork of the live policy (as the extender's planner does), commit
    it, send what it leaves out through the online policy."""
    q = [QueuedPod(p, t0 + i) for i, p in enumerate(burst)]
    plan = plan_queue(state, q, time_limit_s=limit, previous=previous, policy=policy, repack=repack)
    placed = 0
    for p in burst:
        policy.observe(p)
    by_key = {p.key: p for p in burst}
    for key, asg in plan.assignments.items():
        state.allocate(by_key[key], asg)
        placed += 1
    for p in burst:
        if p.key not in plan.assignments and schedule_one(state, p, policy, explain_failures=False).node:
            placed += 1
    return placed, plan, plan.solve_s


def burst_case(name: str, nodes: Sequence[Node], pods: Sequence[PodDemand], burst: int, limit: float,
               opt_limit: float) -> dict[str, Any]:
    online = ClusterState(nodes)
    pol = get_policy("vramfit")
    on_placed = sum(1 for p in pods if schedule_one(online, p, pol, explain_failures=False).node is not None)
    runs: dict[bool, dict[str, Any]] = {}
    for repack in (True, False):
        planned = ClusterState(nodes)
        ppol = get_policy("vramfit")
        pl_placed = 0
        solve_s: list[float] = []
        statuses: dict[str, int] = {}
        for b in range(0, len(pods), burst):
            got, plan, s = commit_burst(planned, pods[b:b + burst], ppol, limit, float(b), repack=repack)
            pl_placed += got
            solve_s.append(s)
            statuses[plan.status] = statuses.get(plan.status, 0) + 1
        runs[repack] = {"placed": pl_placed, "stranded_mib": planned.stranded_mib(), "gpus_used": planned.gpus_used(),
                        "plan_s_max": round(max(solve_s), 3), "plan_s_mean": round(float(np.mean(solve_s)), 3),
                        "statuses": statuses}
    opt = solve_optimal(ClusterState(nodes), pods, time_limit=opt_limit)
    row = {
        "case": name, "pods": len(pods), "burst": burst,
        "online": {"placed": on_placed, "stranded_mib": online.stranded_mib(), "gpus_used": online.gpus_used()},
        "planned": runs[True], "planned_no_repack": runs[False],
        "optimum": {"placed": opt.placed, "stranded_mib": opt.stranded_vram_mib,
                    "gpus_used": opt.state.gpus_used() if opt.state is not None else None,
                    "proven": opt.optimal, "bound": opt.bound, "wall_s": round(opt.wall_s, 2)},
    }
    print(f"  {name}: online {on_placed}, planned {runs[True]['placed']} (no repack {runs[False]['placed']}), "
          f"optimum {opt.placed} (bound {opt.bound})", flush=True)
    return row


def part_a(seeds: Sequence[int], limit: float) -> list[dict[str, Any]]:
    rows = []
    nodes, pods = multi_tenant()
    rows.append(burst_case("multi-tenant 10-pod queue", nodes, pods, 16, limit, 10.0))
    cl = modern_cluster()
    total = sum(g.memory_mib for n in cl for g in n.gpus)
    for scenario in ("inference", "trace"):
        for seed in seeds:
            for load in (0.8, 1.0):
                pods = DEMANDS[scenario](random.Random(seed), int(load * total))
                rows.append(burst_case(f"vram {scenario} load {load} seed {seed}", cl, pods, 16, limit, 30.0))
    return rows


# ------------------------------------------------------------------------------------------- (b) burst trace
def burst_replay(seed: int, batch: int, limit: float, tune: float = 1.3, repack: bool = True) -> dict[str, Any]:
    """benchmarks.replay's protocol with arrivals in batches (no fragmentation measure: unallocated GPU only).
    `repack`: plan_queue's (False: a batch the greedy pass places whole is left to the online policy)."""
    nodes, tasks = load_nodes(DEFAULT_NODES_CSV), load_tasks(DEFAULT_PODS_CSV)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ordered = rp.node_order(nodes, rng)
    state = rp.build_state(ordered)
    cap = MILLI * sum(n.gpu_count for n in nodes)
    to_run = rp.inflate(rp.arrival_order(tasks, rng), tasks, tune, cap, rng)
    wl = rp.workload_of(tasks)
    policy = rp.make_policy("vramfit", seed, wl)
    n = len(to_run)
    ev_arrived = np.zeros(n, dtype=np.int64)
    ev_used = np.zeros(n, dtype=np.int64)
    arrived = used = placed = 0
    statuses: dict[str, int] = {}
    plan_s: list[float] = []
    previous = None
    for b in range(0, n, batch):
        chunk = [(e, rp.to_demand(task, f"{rp.TENANT}/{name}"), task) for e, (name, task) in
                 enumerate(to_run[b:b + batch], start=b)]
        pods = [p for _, p, _ in chunk]
        gpu_pods = [p for p in pods if p.gpu_count > 0]
        q = [QueuedPod(p, float(e)) for e, p, _ in chunk if p.gpu_count > 0]
        # The live policy itself: each of the plan's passes scores with a fork of it (its mix learnt so far), as
        # the extender's planner does.
        plan = (plan_queue(state, q, time_limit_s=limit, policy=policy, previous=previous, repack=repack)
                if q else None)
        if plan is not None:
            statuses[plan.status] = statuses.get(plan.status, 0) + 1
            plan_s.append(plan.solve_s)
        got: dict[str, bool] = {}
        by_key = {p.key: p for p in gpu_pods}
        for p in pods:
            policy.observe(p)
        if plan is not None:
            for key, asg in plan.assignments.items():
                state.allocate(by_key[key], asg)
                got[key] = True
        for e, p, task in chunk:
            if p.key not in got:
                got[p.key] = rp.cycle.place(state, p, policy, rp.trace_feasible(state, p)) is not None
            arrived += task.total_gpu_milli
            if got[p.key]:
                placed += 1
                used += p.vram_mib * p.gpu_count
            ev_arrived[e] = arrived
            ev_used[e] = used
        if (b // batch) % 100 == 0:
            print(f"    batch {b // batch} / {-(-n // batch)}, {time.perf_counter() - t0:.0f} s, {statuses}", flush=True)
    zeros = np.zeros(n, dtype=np.int64)
    curve = rp.bin_curve(ev_arrived, ev_used, zeros, zeros, cap, wl.kept)
    at100 = next((100.0 - p.alloc_pct for p in curve if p.arrived_pct == 100), None)
    return {"seed": seed, "batch": batch, "repack": repack, "limit_s": limit, "tasks": n, "placed": placed,
            "unallocated_pct_at_100": at100, "statuses": statuses,
            "plan_s_mean": round(float(np.mean(plan_s)), 3) if plan_s else None,
            "plan_s_max": round(float(np.max(plan_s)), 3) if plan_s else None,
            "wall_s": round(time.perf_counter() - t0, 1)}


def online_replay(seed: int) -> dict[str, Any]:
    res = rp.run(DEFAULT_NODES_CSV, DEFAULT_PODS_CSV, "vramfit", seed, 1.3)
    return {"seed": seed, "placed": res.placed, "unallocated_pct_at_100": res.unallocated_at(100),
            "wall_s": round(res.wall_s, 1)}


# ------------------------------------------------------------------------------------------- (c) plan time
def placement_quality(state: ClusterState, assignments: dict[str, Any], pods: Sequence[PodDemand]) -> dict[str, int]:
    """GPUs opened (idle before, in use after) and stranded VRAM added by `assignments` on top of `state`."""
    from packing.planning.working_copy import sub_state

    by_key = {p.key: p for p in pods}
    touched = sorted({a.node for a in assignments.values()})
    before = sub_state(state, touched)
    after = before.copy()
    for key, asg in assignments.items():
        after.allocate(by_key[key], asg)
    opened = sum(int(not a.grants and bool(b.grants)) for n in touched
                 for a, b in zip(before.usage(n).gpus, after.usage(n).gpus, strict=True))
    return {"placed": len(assignments), "gpus_opened": opened,
            "stranded_added_mib": sum(after.node_stranded_mib(n) - before.node_stranded_mib(n) for n in touched)}


def part_c(limit: float, rounds: int = 3) -> dict[str, Any]:
    """Plans at 5,000 nodes, `rounds` times each: cold, warm on the same queue (the previous plan still holds),
    and, after 10 planned pods bound and 10 new ones queued, warm (from the last plan before) and cold. The heap is frozen first, as `vramfit serve` does
    (extender/cli.py freeze_heap): without it a full collection walks the 5,000-node state inside some plan."""
    import gc

    from benchmarks.bench_scoring import mix_pod, mixed_cluster
    from packing.planning.working_copy import sub_state

    t = time.perf_counter()
    state = mixed_cluster(5000)
    build_s = time.perf_counter() - t
    running = len(state.holders())
    rng = np.random.default_rng(3)
    pods = [mix_pod(k, rng) for k in range(200)]
    # Reference: the online policy placing the queue in order on every node (what the extender does unplanned).
    t = time.perf_counter()
    ref = sub_state(state, state.node_names)
    pol = get_policy("vramfit")
    online = {}
    for p in pods:
        d = schedule_one(ref, p, pol, explain_failures=False)
        if d.assignment is not None:
            online[p.key] = d.assignment
    reference = placement_quality(state, online, pods) | {"wall_s": round(time.perf_counter() - t, 2)}
    print(f"  online on every node: {reference}", flush=True)
    del ref
    gc.collect()
    gc.freeze()
    runs = []

    def run(label: str, queue: list[PodDemand], previous: Any) -> Any:
        load = round(os.getloadavg()[0], 2)
        t = time.perf_counter()
        plan = plan_queue(state, [QueuedPod(p, float(i)) for i, p in enumerate(queue)], time_limit_s=limit,
                          previous=previous)
        wall = time.perf_counter() - t
        runs.append({"run": len(runs), "case": label, "warm": previous is not None, "wall_s": round(wall, 3),
                     "status": plan.status, "parts": plan.parts, "load_avg_1min": load,
                     **placement_quality(state, dict(plan.assignments), queue),
                     # planned units (the quality columns are theirs) and pods left to the online policy
                     "placed": plan.placed, "planned_units": len(plan.assignments), "left_online": len(plan.online)})
        print(f"  5000x8, {len(queue)} pods: {runs[-1]}", flush=True)
        return plan

    for _ in range(rounds):
        last = run("cold", pods, None)
        run("warm, same queue", pods, last)
    # 10 pods the plan places bind (on its units, or where the online policy put them in the reference, for
    # pods it left to the online policy), 10 new pods queue.
    units = {**online, **last.assignments}
    bound = [p for p in pods if p.key in last.assignments or p.key in last.online][:10]
    for p in bound:
        state.allocate(p, units[p.key])
    queue = [p for p in pods if p not in bound] + [mix_pod(k, rng) for k in range(200, 210)]
    for _ in range(rounds):
        run("warm, 10 bound + 10 new", queue, last)
        run("cold, 10 bound + 10 new", queue, None)
    gc.unfreeze()
    return {"nodes": 5000, "gpus": 40000, "pending": 200, "running": running,
            "cluster_build_s": round(build_s, 1), "limit_s": limit, "online_every_node": reference, "runs": runs}


# ------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", default="a,b,c")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--vram-seeds", default="1")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--limit", type=float, default=0.5, help="plan_queue budget in (a) and (c)")
    ap.add_argument("--trace-limit", type=float, default=0.25, help="plan_queue budget per trace batch in (b)")
    ap.add_argument("--no-repack", action="store_true",
                    help="(b): plan_queue(repack=False): batches the online placement places whole keep it")
    ap.add_argument("--out", default=str(RESULTS / "queue"))
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    command = "python -m benchmarks.bench_queue " + " ".join(argv if argv is not None else sys.argv[1:])
    produced: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                            "load_avg_1min": round(os.getloadavg()[0], 2)}}
    out.parent.mkdir(parents=True, exist_ok=True)
    if "a" in parts:
        print("(a) bursts", flush=True)
        produced["bursts"] = part_a([int(s) for s in args.vram_seeds.split(",")], args.limit)
    mine: dict[str, Any] = {"online": [], "planned": []}  # the trace rows this run made
    if "b" in parts:
        print("(b) burst trace", flush=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            mine["online"].append(online_replay(seed))
            print(f"  online seed {seed}: {mine['online'][-1]}", flush=True)
            for batch in [int(b) for b in args.batches.split(",")]:
                mine["planned"].append(burst_replay(seed, batch, args.trace_limit, repack=not args.no_repack))
                print(f"  planned seed {seed} batch {batch}: {mine['planned'][-1]}", flush=True)
                save(out, produced, mine, command)
    if "c" in parts:
        print("(c) plan time at 5,000 nodes", flush=True)
        produced["scale"] = part_c(args.limit)
    report = save(out, produced, mine, command)
    out.with_suffix(".md").write_text(render_md(report))
    print(render_md(report))
    return 0


def save(out: Path, produced: dict[str, Any], mine: dict[str, Any], command: str) -> dict[str, Any]:
    """Parts run separately (and at once: several seeds of (b) in parallel) accumulate in one JSON: what is on
    disk now, this run's parts over it, its trace rows replacing those of the same seed and batch."""
    path = out.with_suffix(".json")
    disk = json.loads(path.read_text()) if path.exists() else {}
    report = disk | produced
    old = disk.get("trace", {"online": [], "planned": []})
    seeds = {r["seed"] for r in mine["online"]}
    runs = {_run_key(r) for r in mine["planned"]}
    report["trace"] = {"online": [r for r in old["online"] if r["seed"] not in seeds] + mine["online"],
                       "planned": [r for r in old["planned"] if _run_key(r) not in runs] + mine["planned"]}
    if not report["trace"]["online"] and not report["trace"]["planned"]:
        del report["trace"]
    report["commands"] = list(dict.fromkeys([*disk.get("commands", [disk.get("command", "")]), command]))
    report.pop("command", None)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _batching(r: dict[str, Any]) -> tuple[int, bool]:
    """A trace row's batch size and repack (rows from before the flag were made with repack)."""
    return r["batch"], r.get("repack", True)


def _run_key(r: dict[str, Any]) -> tuple[int, int, bool]:
    return (r["seed"], *_batching(r))


def render_md(r: dict[str, Any]) -> str:
    cmds = r.get("commands") or [r.get("command", "")]
    lines = ["# Issue 13: the pending queue planned with CP-SAT (plan_queue) vs online", "",
             "Commands (each run adds its parts to the same JSON): " + "; ".join(f"`nice -n 10 .venv/bin/{c.strip()}`"
                                                                            for c in cmds if c),
             f"Machine: {r['machine']['cpus']} CPUs (shared), Python {r['machine']['python']}.", ""]
    if "bursts" in r:
        lines += ["## (a) Bursts of 16: pods placed / stranded VRAM", "",
                  "| case | pods | online placed | planned placed | no repack | optimum placed (proven) | "
                  "online stranded GiB | planned stranded GiB | no repack | optimum stranded GiB | plan s mean / max | "
                  "plan statuses |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for row in r["bursts"]:
            o, p, b = row["online"], row["planned"], row["optimum"]
            k = row.get("planned_no_repack") or {"placed": "-", "stranded_mib": float("nan")}
            lines.append(f"| {row['case']} | {row['pods']} | {o['placed']} | {p['placed']} | {k['placed']} | "
                         f"{b['placed']} ({'yes' if b['proven'] else 'no, bound ' + str(b['bound'])}) | "
                         f"{o['stranded_mib'] / 1024:.1f} | {p['stranded_mib'] / 1024:.1f} | "
                         f"{k['stranded_mib'] / 1024:.1f} | {b['stranded_mib'] / 1024:.1f} | {p['plan_s_mean']} / "
                         f"{p['plan_s_max']} | {p['statuses']} |")
        lines += ["", "The optimum sees every pod at once (no arrival order): an upper reference for any online "
                  "or burst placement.", ""]
    if "trace" in r:
        t = r["trace"]
        kinds = sorted({_batching(x) for x in t["planned"]}, key=lambda k: (not k[1], k[0]))

        def label(k: tuple[int, bool]) -> str:
            return f"planned, batches of {k[0]}" + ("" if k[1] else " (no repack)")
        lines += ["## (b) Burst trace: openb default, unallocated GPU % at 100 % arrival", "",
                  "| seed | online vramfit | " + " | ".join(label(k) for k in kinds) + " | plan s mean / max (16) |",
                  "|---:|---:|" + "---:|" * len(kinds) + "---:|"]
        for on in sorted(t["online"], key=lambda x: x["seed"]):
            by_k = {_batching(x): x for x in t["planned"] if x["seed"] == on["seed"]}

            def cell(k: tuple[int, bool], by_k: dict[tuple[int, bool], Any] = by_k) -> str:
                x = by_k.get(k)
                return "-" if x is None or x["unallocated_pct_at_100"] is None else f"{x['unallocated_pct_at_100']:.2f}"
            x16 = by_k.get((16, True))
            lines.append(f"| {on['seed']} | {on['unallocated_pct_at_100']:.2f} | "
                         + " | ".join(cell(k) for k in kinds)
                         + f" | {x16['plan_s_mean'] if x16 else '-'} / {x16['plan_s_max'] if x16 else '-'} |")
        for k in kinds:
            rows = [x for x in t["planned"] if _batching(x) == k
                    and x["unallocated_pct_at_100"] is not None]
            if rows:
                seeds = {x["seed"] for x in rows}
                online = [o["unallocated_pct_at_100"] for o in t["online"] if o["seed"] in seeds]
                lines.append(f"\nMean, {label(k)}: **{np.mean([x['unallocated_pct_at_100'] for x in rows]):.2f} %** "
                             f"over {len(rows)} seed(s); online vramfit over the same seeds: {np.mean(online):.2f} %.")
        lines += ["", "Issue targets for reference (10 seeds): online vramfit 4.50 %, FGD 4.77 %, target <= 4.0 % with "
                  "batches of 16. Statuses per batch are in queue.json.", ""]
    if "scale" in r:
        lines += _md_scale(r["scale"])
    return "\n".join(lines) + "\n"


def _md_scale(s: dict[str, Any]) -> list[str]:
    """Part (c): plan time at scale."""
    lines = [f"## (c) Plan time: {s['nodes']} nodes x 8 GPUs, {s['running']} pods running, {s['pending']} pending, "
              f"budget {s['limit_s']} s", "",
              "| run | case | wall s | status | parts solved | placed (planned units + left to online) | "
              "GPUs opened | stranded VRAM added GiB | load avg |", "|---:|---|---:|---|---:|---:|---:|---:|---:|"]
    for x in s["runs"]:
        split = f" ({x['planned_units']} + {x['left_online']})" if "left_online" in x else ""
        lines.append(f"| {x['run']} | {x.get('case', 'warm' if x['warm'] else 'cold')} | {x['wall_s']} | "
                     f"{x['status']} | {x['parts']} | {x['placed']}{split} | {x.get('gpus_opened', '-')} | "
                     f"{x['stranded_added_mib'] / 1024:.1f} | {x.get('load_avg_1min', '-')} |"
                     if "stranded_added_mib" in x else
                     f"| {x['run']} | {'warm' if x['warm'] else 'cold'} | {x['wall_s']} | {x['status']} | "
                     f"{x['parts']} | {x['placed']} | - | - | - |")
    walls = [x["wall_s"] for x in s["runs"]]
    statuses: dict[str, int] = {}
    for x in s["runs"]:
        statuses[x["status"]] = statuses.get(x["status"], 0) + 1
    lines += ["", f"Wall s: max {max(walls)}, mean {np.mean(walls):.3f} over {len(walls)} plans; statuses {statuses}."]
    ref = s.get("online_every_node")
    if ref:
        lines += ["", f"Reference, the online policy placing the same 200 pods in order on every node (what the "
                  f"extender does without a plan): placed {ref['placed']}, GPUs opened {ref['gpus_opened']}, "
                  f"stranded VRAM added {ref['stranded_added_mib'] / 1024:.1f} GiB ({ref['wall_s']} s)."]
    lines.append("")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
