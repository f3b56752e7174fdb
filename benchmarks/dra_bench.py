"""The DRA arm of the benchmarks: vramfit's claim allocator (`packing.dra.allocate.Allocator`) beside an emulation
of kube-scheduler's first-fit DRA allocator (`benchmarks.dra_firstfit`), on NVIDIA-shaped ResourceSlices
(`benchmarks.dra_slices`).

    python -m benchmarks.dra_bench [--quick] [--parts a,b,c] [--out benchmarks/results/dra]

(a) scenarios: the VRAM scenarios' pods (`benchmarks.vram_scenarios`) as claims on a DRA cluster of the same
    models (static MIG, consumable-share, whole and partitionable GPUs): pods allocated by each.
(b) the openb trace as claims: the extender-mode replay's protocol and measure (`benchmarks.replay`: node order,
    arrival order, inflation, unallocated GPU % at 100 % arrival), every trace GPU a consumable-share GPU of
    1000 MiB (one MiB per milli-GPU, as the replay's time-sliced GPUs), a fractional task a claim of
    `memory: <gpu_milli>Mi`, an N-GPU task a claim of N GPUs (no memory request: a share takes the whole GPU);
    CPU-only tasks placed by the arm's scheduler; vramfit, first fit and FGD (as the Allocator's policy).
(c) gate-to-allocation latency: 5,000 nodes x 8 GPUs, 200 gated pods allocated in one batch, in-process.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.dra_firstfit import FirstFit, search_order
from benchmarks.dra_slices import (
    DYNAMIC_MIG,
    GPU_CLASS,
    MIG_CLASS,
    SHARES,
    STATIC_MIG,
    WHOLE,
    GpuSpec,
    claim_object,
    class_objects,
    node_slices,
)
from extender.dra.allocator import PLAN_BUDGET_S
from packing.catalog import Catalog, load_catalog, named_layout
from packing.dra.allocate import Allocator, PodAllocation, PodClaims
from packing.dra.index import EligibleIndex
from packing.dra.nodes import DraInventory, combine, dra_inventory, with_host
from packing.dra.objects import Claim
from packing.dra.parse import claim as parse_claim
from packing.dra.parse import device_class
from packing.model import Assignment, Isolation, Node, PodDemand
from packing.planning.dra_batch import plan_claims
from packing.policies import Policy, get_policy
from packing.state import ClusterState, PlacementError

PROG = "python -m benchmarks.dra_bench"
OUT = "benchmarks/results/dra"


# ------------------------------------------------------------------------------------------ shared pieces
def _book_host(state: ClusterState, pod: PodClaims, node: str, cpu: int, mem: int) -> None:
    if cpu or mem:
        state.allocate(PodDemand(key=pod.key, vram_mib=0, gpu_count=0, tenant=pod.tenant, cpu_milli=cpu,
                                 memory_mib=mem), Assignment(node, ()))


def _classes() -> dict[str, Any]:
    return {c.name: c for c in map(device_class, class_objects())}


@dataclass
class VramfitArm:
    """vramfit's side: the inventory's state, the Allocator with a policy."""

    inv: DraInventory
    state: ClusterState
    alloc: Allocator

    @classmethod
    def build(cls, slices: list[dict[str, Any]], catalog: Catalog, policy: Policy,
              hosts: dict[str, Node] | None = None) -> VramfitArm:
        inv = dra_inventory(slices, catalog)
        nodes = [with_host(d.node, (hosts or {}).get(n)) for n, d in inv.nodes.items()]
        state = ClusterState(nodes, max_gpus=max([8] + [len(n.gpus) for n in nodes]))
        return cls(inv, state, Allocator(state, inv.nodes, EligibleIndex(inv, _classes()), policy))

    def place(self, pod: PodClaims, cpu: int = 0, mem: int = 0, prefer: str | None = None) -> PodAllocation | None:
        pod = replace(pod, cpu_milli=cpu, memory_mib=mem)
        got = self.alloc.allocate(pod, prefer)
        if not isinstance(got, PodAllocation):
            return None
        try:
            _book_host(self.state, pod, got.node, cpu, mem)
        except PlacementError:
            # The node lacks CPU or memory: kube-scheduler's NodeResourcesFit would refuse it and clear the
            # allocation (PostFilter), so the pod is not placed.
            for c in got.claims:
                self.alloc.release_claim(c.claim.ref.key)
            return None
        return got


def _first_fit(slices: list[dict[str, Any]], hosts: dict[str, Node], seed: int) -> FirstFit:
    return FirstFit(search_order(slices), _classes(), {n: h.cpu_milli or 0 for n, h in hosts.items()},
                    {n: h.memory_mib for n, h in hosts.items()}, seed=seed)


# ------------------------------------------------------------------------------------------ (a) scenarios
def scenario_cluster(catalog: Catalog) -> list[tuple[str, list[GpuSpec], int]]:
    """(node, GPUs, CPU milli): the VRAM scenarios' models, as NVIDIA's DRA driver publishes them."""
    def mig(model: str, config: str) -> GpuSpec:
        m = catalog.get(model)
        assert m is not None
        return GpuSpec(model, STATIC_MIG, tuple((p.profile, p.start) for p in named_layout(m, config) or ()))
    spec: list[tuple[str, GpuSpec, int, int]] = [
        ("a100-mig-bal", mig("A100-80GB", "all-balanced"), 8, 2),
        ("a100-mig-1g", mig("A100-80GB", "all-1g.10gb"), 8, 1),
        ("a100-shares", GpuSpec("A100-80GB", SHARES), 8, 2),
        ("a100-whole", GpuSpec("A100-80GB", WHOLE), 8, 2),
        ("h100-dynmig", GpuSpec("H100-80GB", DYNAMIC_MIG), 8, 2),
        ("h100-whole", GpuSpec("H100-80GB", WHOLE), 8, 2),
        ("h200-mig-3g", mig("H200-141GB", "all-3g.71gb"), 8, 1),
        ("h200-shares", GpuSpec("H200-141GB", SHARES), 8, 2),
        ("l40s-shares", GpuSpec("L40S", SHARES), 4, 2),
        ("l40s-whole", GpuSpec("L40S", WHOLE), 4, 4),
    ]
    return [(f"{prefix}-{i}", [g] * n, 32000 * n) for prefix, g, n, count in spec for i in range(count)]


MIG_SHARE = 0.4  # of the pods whose VRAM a MIG profile holds, this share asks the MIG class


def scenario_pods(scenario: str, rng: random.Random, budget_mib: int) -> list[tuple[PodDemand, str]]:
    """The VRAM scenarios' pods, each with the class it asks (MIG for some single-GPU pods that fit 40 GiB)."""
    from benchmarks.vram_scenarios import DEMANDS

    pods = DEMANDS[scenario](rng, budget_mib)
    return [(p, MIG_CLASS if p.gpu_count == 1 and p.vram_mib <= 40192 and rng.random() < MIG_SHARE else GPU_CLASS)
            for p in pods]


def _pod_claims(p: PodDemand, cls: str) -> PodClaims:
    ns, name = p.key.split("/", 1)
    obj = claim_object(ns, f"{name}-gpu", cls, memory_mib=p.vram_mib, count=max(1, p.gpu_count))
    return PodClaims(p.key, f"uid-{p.key}", p.tenant, p.isolation, (parse_claim(obj),))


def run_scenario(scenario: str, load: float, seed: int, catalog: Catalog) -> dict[str, Any]:
    rng = random.Random(seed)
    layout = scenario_cluster(catalog)
    slices = [s for name, gpus, _cpu in layout for s in node_slices(name, gpus, catalog, rng)]
    hosts = {name: Node(name, (), cpu_milli=cpu, memory_mib=None) for name, _g, cpu in layout}
    vf = VramfitArm.build(slices, catalog, get_policy("vramfit"), hosts)
    relaxed = VramfitArm.build(slices, catalog, get_policy("vramfit"), hosts)
    ff = _first_fit(slices, hosts, seed)
    budget = int(load * sum(g.memory_mib for d in vf.inv.nodes.values() for g in d.node.gpus))
    pods = scenario_pods(scenario, random.Random(seed * 7919 + 1), budget)
    placed_vf = placed_rx = placed_ff = 0
    t0 = time.perf_counter()
    for p, cls in pods:
        pc = _pod_claims(p, cls)
        placed_vf += vf.place(pc, p.cpu_milli) is not None
        # First fit knows no tenants: vramfit with one tenant and no isolation asked is the like-for-like arm.
        placed_rx += relaxed.place(replace(pc, tenant="all", isolation=Isolation.NONE), p.cpu_milli) is not None
        placed_ff += ff.place(pc.claims, p.cpu_milli) is not None
    return {"scenario": scenario, "load": load, "seed": seed, "pods": len(pods), "vramfit": placed_vf,
            "vramfit_no_trust": placed_rx, "first_fit": placed_ff,
            "mig_pods": sum(1 for _p, c in pods if c == MIG_CLASS),
            "seconds": round(time.perf_counter() - t0, 2)}


# ------------------------------------------------------------------------------------------ (b) trace
ARMS = ("vramfit", "first-fit", "paper:fgd")


def trace_run(arm: str, seed: int, tune: float = 1.3) -> dict[str, Any]:
    """One replay of the openb trace as claims; the same tasks, order and measure as `benchmarks.replay`."""
    from benchmarks import replay
    from benchmarks.trace import DEFAULT_NODES_CSV, DEFAULT_PODS_CSV, MILLI, load_nodes, load_tasks

    t0 = time.perf_counter()
    nodes, tasks = load_nodes(DEFAULT_NODES_CSV), load_tasks(DEFAULT_PODS_CSV)
    rng = np.random.default_rng(seed)
    ordered = replay.node_order(nodes, rng)
    cap = MILLI * sum(n.gpu_count for n in nodes)
    to_run = replay.inflate(replay.arrival_order(tasks, rng), tasks, tune, cap, rng)
    catalog = load_catalog()
    srng = random.Random(seed)
    slices = [s for name, n in ordered if n.gpu_count
              for s in node_slices(name, [GpuSpec("A100-80GB", SHARES, memory_mib=MILLI, product=n.model)]
                                   * n.gpu_count, catalog, srng)]
    hosts = {name: replay.to_node(name, n) for name, n in ordered}
    step = _trace_stepper(arm, seed, slices, hosts, catalog, replay.workload_of(tasks))
    arrived = np.zeros(len(to_run), dtype=np.int64)
    used = np.zeros(len(to_run), dtype=np.int64)
    a = u = placed = 0
    for e, (name, task) in enumerate(to_run):
        a += task.total_gpu_milli
        if step(f"trace/{name}", task):
            placed += 1
            u += task.total_gpu_milli
        arrived[e], used[e] = a, u
    zeros = np.zeros(len(to_run), dtype=np.int64)
    curve = replay.bin_curve(arrived, used, zeros, zeros, cap, 1)
    at100 = next((p.unallocated_pct for p in curve if p.arrived_pct == 100), None)
    return {"arm": arm, "seed": seed, "tasks": len(to_run), "placed": placed, "unallocated_100": at100,
            "seconds": round(time.perf_counter() - t0, 1)}


def _trace_stepper(arm: str, seed: int, slices: list[dict[str, Any]], hosts: dict[str, Node], catalog: Catalog,
                   workload: Any) -> Callable[[str, Any], bool]:
    from benchmarks import replay
    from packing.place import schedule_one

    if arm == "first-fit":
        ff = _first_fit(slices, hosts, seed)

        def ff_step(key: str, task: Any) -> bool:
            claims = (_trace_claim(key, task),) if task.num_gpu and task.gpu_milli else ()
            return ff.place(claims, task.cpu_milli, task.memory_mib) is not None
        return ff_step
    policy = replay.make_policy(arm, seed, workload)
    vf = VramfitArm.build(slices, catalog, policy, hosts)
    # CPU-only nodes (no slices) join the state so CPU-only tasks can land there, as in the replay.
    for name, h in hosts.items():
        if not vf.state.has_node(name):
            vf.state = vf.alloc.state = _with_node(vf.state, h)

    def vf_step(key: str, task: Any) -> bool:
        if not (task.num_gpu and task.gpu_milli):
            demand = PodDemand(key=key, vram_mib=0, gpu_count=0, tenant=replay.TENANT, cpu_milli=task.cpu_milli,
                               memory_mib=task.memory_mib)
            return schedule_one(vf.state, demand, policy, explain_failures=False).node is not None
        pod = PodClaims(key, f"uid-{key}", replay.TENANT, Isolation.NONE, (_trace_claim(key, task),))
        return vf.place(pod, task.cpu_milli, task.memory_mib) is not None
    return vf_step


def _with_node(state: ClusterState, node: Node) -> ClusterState:
    raise ValueError(f"node {node.name} has no GPU: the DRA trace bench expects every trace node to have GPUs")


def _trace_claim(key: str, task: Any) -> Claim:
    name = key.split("/", 1)[1].replace("_", "-").lower()
    if task.num_gpu == 1 and task.gpu_milli < 1000:
        return parse_claim(claim_object("trace", f"{name}-gpu", GPU_CLASS, memory_mib=task.gpu_milli))
    return parse_claim(claim_object("trace", f"{name}-gpu", GPU_CLASS, count=task.num_gpu))


def extender_mode(seed: int) -> float | None:
    """vramfit's extender-mode figure for the same seed (`benchmarks.replay`, fast step: identical placements)."""
    from benchmarks import replay

    return replay.run(policy_name="vramfit", seed=seed, step="fast").unallocated_at(100)


# ------------------------------------------------------------------------------------------ (c) latency
def latency(nodes: int, pods: int, catalog: Catalog) -> dict[str, Any]:
    rng = random.Random(0)
    t0 = time.perf_counter()
    slices = [s for i in range(nodes) for s in node_slices(f"node-{i:05d}", [GpuSpec("H100-80GB", SHARES)] * 8,
                                                            catalog, rng)]
    t_slices = time.perf_counter() - t0
    t0 = time.perf_counter()
    vf = VramfitArm.build(slices, catalog, get_policy("vramfit"))
    t_inventory = time.perf_counter() - t0
    shapes = [(16384, 1), (24576, 1), (40960, 1), (81559, 1), (8192, 2)]
    batch = [PodClaims(f"team-{i % 4}/p{i}", f"uid-{i}", f"team-{i % 4}", Isolation.NONE,
                       (parse_claim(claim_object(f"team-{i % 4}", f"p{i}-gpu", GPU_CLASS, memory_mib=m, count=c)),))
             for i, (m, c) in enumerate(shapes[i % len(shapes)] for i in range(pods))]
    t0 = time.perf_counter()
    vf.alloc.index.eligible(batch[0].claims[0].requests[0].alternatives[0])
    t_index = time.perf_counter() - t0
    done: list[float] = []
    placed = 0
    start = time.perf_counter()
    prefer = plan_claims(vf.alloc, batch, PLAN_BUDGET_S)  # as the live allocator takes a batch
    t_plan = time.perf_counter() - start
    for pod in batch:
        placed += vf.place(pod, prefer=prefer.get(pod.key)) is not None
        done.append(time.perf_counter() - start)
    # One slice changes (a new generation of one node's pool): the inventory and the index again.
    # As the live store does (extender/dra/book.py): only the changed node's slices are read again, then joined.
    changed = node_slices("node-00000", [GpuSpec("H100-80GB", SHARES)] * 8, catalog, rng, generation=2)
    rest = DraInventory({n: d for n, d in vf.inv.nodes.items() if n != "node-00000"},
                        {k: v for k, v in vf.inv.devices.items() if k.pool != "node-00000"}, (), ())
    t0 = time.perf_counter()
    inv2 = combine([rest, dra_inventory(changed, catalog)])
    t_inventory2 = time.perf_counter() - t0
    t0 = time.perf_counter()
    vf.alloc.index.rebase(inv2, vf.alloc.index.classes)
    vf.alloc.index.eligible(batch[0].claims[0].requests[0].alternatives[0])
    t_index2 = time.perf_counter() - t0
    q = statistics.quantiles(done, n=100)
    return {"nodes": nodes, "gpus": nodes * 8, "pods": pods, "placed": placed,
            "p50_s": round(q[49], 4), "p99_s": round(q[98], 4), "batch_s": round(done[-1], 3),
            "plan_s": round(t_plan, 3), "planned": len(prefer),
            "build_slices_s": round(t_slices, 2), "inventory_s": round(t_inventory, 2),
            "index_first_shape_s": round(t_index, 2), "inventory_after_change_s": round(t_inventory2, 2),
            "index_after_change_s": round(t_index2, 2)}


# ------------------------------------------------------------------------------------------ report
def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.fmean(vals), 2) if vals else None


def _sd(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.stdev(vals), 2) if len(vals) > 1 else 0.0


def render(doc: dict[str, Any]) -> str:
    lines = ["# DRA: vramfit's claim allocator vs kube-scheduler's first fit", "",
             f"Command: `{doc['command']}`", "", f"Machine: {doc['machine']}", ""]
    lines += _render_a(doc.get("scenarios"))
    lines += _render_b(doc.get("trace"))
    lines += _render_c(doc.get("latency"))
    return "\n".join(lines) + "\n"


def _render_a(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    out = ["## (a) Scenarios: pods allocated", "",
           "The VRAM scenarios' pods (`benchmarks/vram_scenarios.py`) as claims of `memory: <VRAM>` (N devices for "
           f"N-GPU pods); {int(MIG_SHARE * 100)} % of the single-GPU pods that a 40 GiB MIG profile holds ask "
           "`mig.nvidia.com`, the rest `gpu.nvidia.com`. Cluster: " + part["cluster"] + ". vramfit honours tenants "
           "and isolation; first fit ignores them. Means over seeds.", "",
           "`vramfit, one tenant` gives every pod one tenant and no isolation: the like-for-like arm.", "",
           "| scenario | load | pods | MIG-class pods | vramfit | vramfit, one tenant | first fit |",
           "|---|---|---|---|---|---|---|"]
    for row in part["summary"]:
        out.append(f"| {row['scenario']} | {row['load']:g} | {row['pods']} | {row['mig_pods']} | {row['vramfit']} | "
                   f"{row['vramfit_no_trust']} | {row['first_fit']} |")
    return out + [""]


def _render_b(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    out = ["## (b) openb trace as claims: unallocated GPU % at 100 % arrival", "",
           "Default trace, tune 1.3, seeds " + ", ".join(map(str, part["seeds"])) + "; every trace GPU a "
           "consumable-share GPU of 1000 MiB, fractional tasks `memory: <milli>Mi`, N-GPU tasks N devices. "
           "`extender mode` is `benchmarks.replay` (fast step) on the same seeds.", "",
           "| arm | unallocated @100 % (mean ± sd) | s/run |", "|---|---|---|"]
    for arm, row in part["summary"].items():
        out.append(f"| {arm} | {row['mean']} ± {row['sd']} | {row['seconds']} |")
    return out + [""]


def _render_c(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    return ["## (c) Gate-to-allocation latency (in-process, one batch)", "",
            *([f"Command for this part: `{part['command']}`.", ""] if part.get("command") else []),
            f"{part['nodes']} nodes x 8 consumable-share H100s ({part['gpus']} devices), {part['pods']} gated pods "
            f"(memory 16/24/40 GiB, a whole GPU, 2 x 8 GiB), planned as one batch (packing/planning/dra_batch.py) "
            f"and allocated one after another from batch start, as the live allocator takes a round: "
            f"p50 {part['p50_s']} s, p99 {part['p99_s']} s, whole batch {part['batch_s']} s "
            f"({part['placed']} placed).", "",
            f"Inventory from the slices: {part['inventory_s']} s; the eligibility index for the first shape: "
            f"{part['index_first_shape_s']} s. After one node's slice changes (that node read again and joined, as "
            f"the live store does): inventory {part['inventory_after_change_s']} s, index (rebase + first shape) "
            f"{part['index_after_change_s']} s.", ""]


def _machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="2 trace seeds, 1 scenario seed, 500 nodes for latency")
    ap.add_argument("--parts", default="a,b,c", help="which parts: a (scenarios), b (trace), c (latency)")
    ap.add_argument("--seeds", default=None, help="trace seeds (default 42-51; --quick 42,43)")
    ap.add_argument("--nodes", type=int, default=None, help="latency nodes (default 5000; --quick 500)")
    ap.add_argument("--no-extender", action="store_true", help="skip the extender-mode replay of (b)")
    ap.add_argument("--out", default=OUT, help=f"output stem (default {OUT}: .json and .md)")
    args = ap.parse_args(argv)
    from benchmarks.cli import parse_seeds

    parts = set(args.parts.split(","))
    seeds = parse_seeds(args.seeds or ("42,43" if args.quick else "42-51"))
    catalog = load_catalog()
    cmd = " ".join([PROG, *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    doc: dict[str, Any] = {"command": cmd, "machine": _machine()}
    if "a" in parts:
        doc["scenarios"] = part_a([1] if args.quick else [1, 2, 3], [1.0] if args.quick else [0.7, 1.0], catalog)
    if "b" in parts:
        doc["trace"] = part_b(seeds, not args.no_extender)
    if "c" in parts:
        doc["latency"] = latency(args.nodes or (500 if args.quick else 5000), 200, catalog)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    text = render(doc)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


def part_a(seeds: list[int], loads: list[float], catalog: Catalog) -> dict[str, Any]:
    runs = [run_scenario(sc, ld, s, catalog) for sc in ("inference", "trace") for ld in loads for s in seeds]
    summary = []
    for sc in ("inference", "trace"):
        for ld in loads:
            rs = [r for r in runs if r["scenario"] == sc and r["load"] == ld]
            summary.append({"scenario": sc, "load": ld, **{k: round(statistics.fmean(r[k] for r in rs), 1)
                                                          for k in ("pods", "mig_pods", "vramfit", "vramfit_no_trust", "first_fit")}})
    layout = scenario_cluster(catalog)
    forms = sorted({f"{g[0].model} {g[0].form}" for _n, g, _c in layout})
    return {"cluster": f"{len(layout)} nodes, {sum(len(g) for _n, g, _c in layout)} GPUs ({', '.join(forms)})",
            "seeds": seeds, "summary": summary, "runs": runs}


def part_b(seeds: list[int], extender: bool) -> dict[str, Any]:
    runs = [trace_run(arm, s) for arm in ARMS for s in seeds]
    summary: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        summary[arm] = {"mean": _mean([r["unallocated_100"] for r in rs]),
                        "sd": _sd([r["unallocated_100"] for r in rs]),
                        "seconds": round(statistics.fmean(r["seconds"] for r in rs), 1)}
    if extender:
        t0 = time.perf_counter()
        ext = [extender_mode(s) for s in seeds]
        summary["vramfit (extender mode)"] = {"mean": _mean(ext), "sd": _sd(ext),
                                              "seconds": round((time.perf_counter() - t0) / len(seeds), 1)}
    return {"seeds": seeds, "summary": summary, "runs": runs}


if __name__ == "__main__":
    sys.exit(main())
