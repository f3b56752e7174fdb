"""VRAM scenarios: modern GPU clusters (A100-80GB, H100-80GB, H200, T4, L40S under MIG / MPS / time-slicing /
whole GPUs) fed with VRAM demands from several tenants, placed by `whole-gpu` (plain Kubernetes) and by
vramfit's policies, one pod at a time through `packing.place.schedule_one`.

    python -m benchmarks.vram_scenarios [--seeds 1,2,3] [--out benchmarks/results/vram]

Demands:
- `inference`: a realistic inference mix. VRAM = weights (params x bytes/param: FP16 2, INT8 1) + 20 %
  headroom for activations / KV cache / CUDA context (gpu-facts.md §7 gives +20-40 %; we take the low end and
  say so), rounded up to MiB. 70B models are split over 2 (INT8) or 4 (FP16) GPUs (tensor parallel).
- `trace`: the Alibaba trace's tasks (benchmarks/data/openb_pod_list_default.csv) with
  VRAM = gpu_milli / 1000 x 81920 MiB (the memory of an A100-80GB / H100-80GB), per GPU; CPU as in the trace.

Every pod has a tenant and an isolation level; a pod "turned away by trust rules" is one that found no
node, but would have with tenancy relaxed and isolation `none` (the VRAM was there, the rules said no).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.trace import DEFAULT_PODS_CSV, load_tasks
from packing import fit
from packing.catalog import GpuModel, load_catalog, named_layout
from packing.model import Gpu, Isolation, MigInstance, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy
from packing.state import ClusterState
from vramfit.stock import POLICY_NAME as STOCK
from vramfit.stock import simulate_stock

POLICIES = ("whole-gpu", "device-plugin", "first-fit", "best-fit", "spread", "vramfit")
HEADROOM = 1.20  # on top of the weights (gpu-facts.md §7: +20-40 %)
MIB = 1 << 20
TRACE_GPU_MIB = 81920  # trace gpu_milli is scaled to an 80 GB GPU


def weights_mib(params_b: float, bytes_per_param: float) -> int:
    """VRAM of a model's weights plus headroom, MiB (params in billions)."""
    return -(-int(params_b * 1e9 * bytes_per_param * HEADROOM) // MIB)


# ----------------------------------------------------------------------------------------------- cluster
def _mig_gpu(model: GpuModel, index: int, config: str) -> Gpu:
    layout = named_layout(model, config) or []
    assert model.mig is not None
    inst = tuple(MigInstance(profile=p.profile, start=p.start,
                             memory_slices=model.mig.profiles[p.profile].memory_slices,
                             compute_slices=model.mig.profiles[p.profile].compute_slices,
                             memory_mib=model.mig.profiles[p.profile].memory_mib) for p in layout)
    return Gpu(index=index, memory_mib=model.memory_mib, mode=Mode.MIG, product=model.name, model=model.name,
               mig=inst)


def _gpus(model: GpuModel, n: int, mode: Mode, replicas: int | None = None, mig: str = "") -> tuple[Gpu, ...]:
    if mode is Mode.MIG:
        return tuple(_mig_gpu(model, j, mig) for j in range(n))
    return tuple(Gpu(index=j, memory_mib=model.memory_mib, mode=mode, product=model.name, model=model.name,
                     replicas=replicas) for j in range(n))


def modern_cluster() -> list[Node]:
    """24 nodes, 152 GPUs: every sharing mode on current data-centre GPUs."""
    cat = load_catalog()

    def m(name: str) -> GpuModel:
        model = cat.get(name)
        assert model is not None, name
        return model

    a100, h100, h200, t4, l40s = m("A100-80GB"), m("H100-80GB"), m("H200-141GB"), m("T4"), m("L40S")
    spec: list[tuple[str, GpuModel, int, Mode, int | None, str, int]] = [
        # name prefix, model, GPUs, mode, replicas, MIG config, count of such nodes
        ("a100-mig-bal", a100, 8, Mode.MIG, None, "all-balanced", 2),
        ("a100-mig-1g", a100, 8, Mode.MIG, None, "all-1g.10gb", 1),
        ("a100-ts", a100, 8, Mode.TIMESLICE, 8, "", 2),
        ("a100-excl", a100, 8, Mode.EXCLUSIVE, None, "", 2),
        ("h100-mps", h100, 8, Mode.MPS, 4, "", 2),
        ("h100-excl", h100, 8, Mode.EXCLUSIVE, None, "", 2),
        ("h200-mig-3g", h200, 8, Mode.MIG, None, "all-3g.71gb", 1),
        ("h200-ts", h200, 8, Mode.TIMESLICE, 8, "", 2),
        ("t4-ts", t4, 4, Mode.TIMESLICE, 4, "", 4),
        ("l40s-mps", l40s, 4, Mode.MPS, None, "", 2),  # MPS with per-pod pinned limits
        ("l40s-excl", l40s, 4, Mode.EXCLUSIVE, None, "", 4),
    ]
    nodes: list[Node] = []
    for prefix, model, n_gpu, mode, replicas, mig, count in spec:
        for i in range(count):
            nodes.append(Node(name=f"{prefix}-{i}", gpus=_gpus(model, n_gpu, mode, replicas, mig),
                              cpu_milli=32000 * n_gpu, memory_mib=None))
    return nodes


# ----------------------------------------------------------------------------------------------- demands
@dataclass(frozen=True)
class Template:
    what: str
    vram_mib: int
    gpus: int
    weight: float
    cpu_milli: int


INFERENCE: tuple[Template, ...] = (
    Template("7B FP16 inference", weights_mib(7, 2), 1, 30, 4000),
    Template("7B INT8 inference", weights_mib(7, 1), 1, 15, 4000),
    Template("13B FP16 inference", weights_mib(13, 2), 1, 12, 6000),
    Template("13B INT8 inference", weights_mib(13, 1), 1, 10, 6000),
    Template("70B INT8 inference (2-way TP)", weights_mib(70, 1) // 2 + 1, 2, 4, 16000),
    Template("70B FP16 inference (4-way TP)", weights_mib(70, 2) // 4 + 1, 4, 2, 32000),
    Template("embedding model (0.3B FP16 + runtime)", 3072, 1, 20, 2000),
    Template("7B LoRA fine-tune", 40960, 1, 5, 8000),
)

# tenant -> isolation its pods ask for (several trust levels side by side)
TENANTS: dict[str, Isolation] = {"search": Isolation.NONE, "chat": Isolation.NONE, "ads": Isolation.PROCESS,
                                 "finance": Isolation.HARDWARE}


def inference_pods(rng: random.Random, budget_mib: int) -> list[PodDemand]:
    names = list(TENANTS)
    out: list[PodDemand] = []
    total = 0
    i = 0
    while total < budget_mib:
        i += 1
        t = rng.choices(INFERENCE, weights=[x.weight for x in INFERENCE])[0]
        tenant = rng.choice(names)
        iso = TENANTS[tenant]
        if t.what.endswith("fine-tune"):
            iso = Isolation.HARDWARE  # training jobs get their own failure domain
        out.append(PodDemand(key=f"{tenant}/inf-{i}", vram_mib=t.vram_mib, gpu_count=t.gpus, tenant=tenant,
                             isolation=iso, cpu_milli=t.cpu_milli))
        total += t.vram_mib * t.gpus
    return out


def trace_pods(rng: random.Random, budget_mib: int) -> list[PodDemand]:
    tasks = [t for t in load_tasks(DEFAULT_PODS_CSV) if t.num_gpu > 0 and t.gpu_milli > 0]
    names = list(TENANTS)
    out: list[PodDemand] = []
    total = 0
    i = 0
    while total < budget_mib:
        i += 1
        t = rng.choice(tasks)
        tenant = rng.choice(names)
        vram = -(-t.gpu_milli * TRACE_GPU_MIB // 1000)
        out.append(PodDemand(key=f"{tenant}/trace-{i}", vram_mib=vram, gpu_count=t.num_gpu, tenant=tenant,
                             isolation=TENANTS[tenant], cpu_milli=min(t.cpu_milli, 16000 * t.num_gpu)))
        total += vram * t.num_gpu
    return out


DEMANDS: dict[str, Callable[[random.Random, int], list[PodDemand]]] = {"inference": inference_pods,
                                                                        "trace": trace_pods}


# ----------------------------------------------------------------------------------------------- run
@dataclass(frozen=True)
class Outcome:
    scenario: str
    load: float
    policy: str
    seed: int
    pods: int
    placed: int
    vram_placed_gib: float
    gpus_used: int
    stranded_gib: float
    turned_away_by_trust: int
    seconds: float
    over_commits: int = 0  # pods on a replica smaller than their VRAM (only the stock device plugin does this)
    tenant_mixes: int = 0  # shared GPUs holding two tenants (idem)


def turned_away_by_trust(state: ClusterState, pod: PodDemand, whole_gpu: bool) -> bool:
    """The pod found no node, but would have if tenancy and isolation did not apply."""
    relaxed = replace(pod, isolation=Isolation.NONE)
    before = state.relax_tenancy
    state.relax_tenancy = True
    try:
        return bool(fit.feasible(state, relaxed, whole_gpu).now.any())
    finally:
        state.relax_tenancy = before


def build_state(nodes: Sequence[Node]) -> ClusterState:
    return ClusterState(nodes)


def run(scenario: str, load: float, policy_name: str, seed: int,
        vramfit_params: dict[str, Any] | None = None) -> Outcome:
    rng = random.Random(seed)
    nodes = modern_cluster()
    pods = DEMANDS[scenario](rng, int(load * sum(g.memory_mib for n in nodes for g in n.gpus)))
    state = build_state(nodes)
    if policy_name == STOCK:
        t0 = time.perf_counter()
        doc = simulate_stock(state, pods)
        s = doc["summary"]
        return Outcome(scenario, load, policy_name, seed, len(pods), s["placed"], round(s["requested_vram_mib"] / 1024, 1),
                       s["gpus_used"], round(s["stranded_vram_mib"] / 1024, 1), 0, round(time.perf_counter() - t0, 2),
                       s["over_commits"], s["tenant_mixes"])
    policy = get_policy(policy_name, **((vramfit_params or {}) if policy_name == "vramfit" else {}))
    placed = trust = 0
    vram = 0
    t0 = time.perf_counter()
    for p in pods:
        d = schedule_one(state, p, policy, explain_failures=False)
        if d.node is not None:
            placed += 1
            vram += p.vram_mib * p.gpu_count
        elif p.gpu_count and turned_away_by_trust(state, p, policy.whole_gpu):
            trust += 1
    return Outcome(scenario, load, policy_name, seed, len(pods), placed, round(vram / 1024, 1), state.gpus_used(),
                   round(state.stranded_mib() / 1024, 1), trust, round(time.perf_counter() - t0, 2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="VRAM scenarios: whole-GPU vs vramfit's policies")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--loads", default="0.7,1.0,1.3", help="VRAM offered, as a share of the cluster's VRAM")
    ap.add_argument("--out", default="benchmarks/results/vram")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="a parameter of the vramfit policy (an ablation; value as JSON where it parses)")
    args = ap.parse_args(argv)
    from benchmarks.bench_variants import parse_spec

    vramfit_params = parse_spec("vramfit@" + "@".join(args.param))[1] if args.param else {}
    seeds = [int(s) for s in args.seeds.split(",") if s]
    loads = [float(x) for x in args.loads.split(",") if x]
    nodes = modern_cluster()
    n_gpus = sum(len(n.gpus) for n in nodes)
    total_gib = sum(g.memory_mib for n in nodes for g in n.gpus) / 1024
    rows: list[Outcome] = [run(sc, ld, pol, s, vramfit_params) for sc in DEMANDS for ld in loads for pol in POLICIES
                           for s in seeds]
    summary: dict[str, dict[str, Any]] = {}
    for sc in DEMANDS:
        for ld in loads:
            for pol in POLICIES:
                rs = [r for r in rows if r.scenario == sc and r.policy == pol and r.load == ld]
                summary[f"{sc}/{ld:g}/{pol}"] = {k: round(sum(float(getattr(r, k)) for r in rs) / len(rs), 1)
                                                 for k in ("pods", "placed", "vram_placed_gib", "gpus_used",
                                                           "stranded_gib", "turned_away_by_trust", "seconds",
                                                           "over_commits", "tenant_mixes")}
    lines = [
        "# VRAM scenarios: whole-GPU and the stock device plugin vs vramfit's policies",
        "",
        f"Command: `python -m benchmarks.vram_scenarios --seeds {args.seeds} --loads {args.loads}"
        + "".join(f" --param {p}" for p in args.param)
        + (f" --out {args.out}" if args.out != "benchmarks/results/vram" else "") + "` "
        f"(means over seeds {args.seeds}).",
        "",
        f"Cluster: {len(nodes)} nodes, {n_gpus} GPUs, {total_gib:.0f} GiB VRAM — A100-80GB (MIG all-balanced, "
        "MIG all-1g.10gb, time-slicing x8, whole), H100-80GB (MPS 4 shares, whole), H200-141GB (MIG all-3g.71gb, "
        "time-slicing x8), T4 (time-slicing x4), L40S (pinned MPS, whole); 32 CPU cores per GPU (a DGX-class node).",
        "Tenants: search and chat (isolation none), ads (process: MPS, MIG or whole GPU), finance (hardware: MIG or "
        "whole GPU); fine-tunes always ask hardware isolation. One tenant per MPS / time-sliced GPU.",
        "",
        "- `inference`: pods drawn from: " + "; ".join(
            f"{t.what} {t.vram_mib} MiB x{t.gpus} GPU (weight {t.weight:g})" for t in INFERENCE)
        + ". VRAM = parameters x bytes/param (FP16 2, INT8 1) + 20 % headroom.",
        "- `trace`: GPU tasks of the Alibaba default trace, VRAM = gpu_milli/1000 x {TRACE_GPU_MIB} MiB "
        "per GPU (an 80 GB GPU), tenants assigned at random.",
        "- `load`: pods are drawn until their VRAM reaches that share of the cluster's VRAM.",
        "",
        "Pods arrive once, in a seeded random order; no departures. `stranded` = VRAM on GPUs in use that no pod holds "
        "and no new pod can get (`ClusterState.stranded_mib`). `trust` = pods turned away although the VRAM was free "
        "(they would have fit with tenancy relaxed and isolation none). `device-plugin` = what kube-scheduler with "
        "the stock NVIDIA device plugin does on the same nodes (`vramfit/stock.py`): a replica per pod whatever its "
        "VRAM, the smallest MIG profile a pod could name, whole GPUs; `over` = pods it put on a replica smaller than "
        "their VRAM, `mixed` = shared GPUs it gave to two tenants (vramfit's policies: 0 by construction).",
        "",
        "| scenario | load | policy | placed / offered | VRAM placed GiB | GPUs used | stranded GiB | trust | over | "
        "mixed | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, row in summary.items():
        sc, ld, pol = key.split("/")
        lines.append(f"| {sc} | {ld} | {pol} | {row['placed']:g} / {row['pods']:g} | {row['vram_placed_gib']:g} | "
                     f"{row['gpus_used']:g} | {row['stranded_gib']:g} | {row['turned_away_by_trust']:g} | "
                     f"{row['over_commits']:g} | {row['tenant_mixes']:g} | {row['seconds']:g} |")
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "runs": [r.__dict__ for r in rows]},
                                                   indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
