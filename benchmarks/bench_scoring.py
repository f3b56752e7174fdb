"""Speed of the core's hot path: filter + score one pod against 5,000 nodes x 8 GPUs (issue 2 target: <= 2 ms).

Run: python -m benchmarks.bench_scoring [--nodes 5000] [--repeat 200]
Writes benchmarks/results/scoring.json and .md. Figures, not asserts: this machine is shared and noisy.

Policies that learn the workload mix from `observe` (vramfit, frag-aware) first learn one (`learn_mix`):
without it they would score against an empty mix, which costs nothing and says nothing.
`benchmarks.bench_frag` times vramfit alone in more detail (first build, new shapes, mix refreshes).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import research_policies
from packing import fit
from packing.catalog import load_catalog, named_layout
from packing.model import Gpu, Isolation, MigInstance, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import Policy, get_policy, policy_names
from packing.policies.frag_aware import FragAware
from packing.state import ClusterState

RESULTS = Path(__file__).parent / "results"
# Per-GPU VRAM of the learned mix's pods (MiB): 12 sizes, 3 tenants, 3 isolation levels, 4 CPU sizes.
MIX_SIZES = (3072, 8011, 9000, 14336, 14878, 16022, 18000, 20000, 29755, 30000, 40055, 40960)


def mixed_cluster(n_nodes: int, seed: int = 7) -> ClusterState:
    """A100/H100 nodes in MIG (balanced / all-2g / all-3g), MPS x4, time-slicing x4 and exclusive mode."""
    catalog = load_catalog()
    rng = np.random.default_rng(seed)
    a100 = catalog.get("A100-80GB")
    assert a100 is not None and a100.mig is not None
    geo = a100.mig
    layouts = []
    for name in ("all-balanced", "all-2g.20gb", "all-3g.40gb", "all-1g.10gb"):
        placements = named_layout(a100, name) or []
        layouts.append(tuple(MigInstance(p.profile, p.start, geo.profiles[p.profile].memory_slices,
                                         geo.profiles[p.profile].compute_slices,
                                         geo.profiles[p.profile].memory_mib) for p in placements))
    nodes = []
    for n in range(n_nodes):
        kind = n % 4
        gpus = []
        for i in range(8):
            if kind == 0:
                gpus.append(Gpu(i, 81920, Mode.MIG, product="NVIDIA-A100-SXM4-80GB", model="A100-80GB",
                                mig=layouts[int(rng.integers(len(layouts)))]))
            elif kind == 1:
                gpus.append(Gpu(i, 81559, Mode.MPS, product="NVIDIA-H100-80GB-HBM3", model="H100-80GB", replicas=4))
            elif kind == 2:
                gpus.append(Gpu(i, 81920, Mode.TIMESLICE, product="NVIDIA-A100-SXM4-80GB", model="A100-80GB",
                                replicas=4))
            else:
                gpus.append(Gpu(i, 81559, Mode.EXCLUSIVE, product="NVIDIA-H100-80GB-HBM3", model="H100-80GB"))
        nodes.append(Node(f"node-{n:05d}", tuple(gpus), cpu_milli=128000, memory_mib=1 << 20))
    state = ClusterState(nodes)
    # Warm it up: a third of the capacity in use by several tenants.
    policy = get_policy("first-fit")
    for k in range(n_nodes * 3):
        pod = PodDemand(f"warm/p{k}", int(rng.choice([3072, 9000, 14336, 18000, 30000])),
                        tenant=f"t{k % 5}", cpu_milli=1000)
        schedule_one(state, pod, policy, explain_failures=False)
    return state


def mix_pod(k: int, rng: np.random.Generator) -> PodDemand:
    """The k-th pod of the workload a learning policy observes (several tenants, isolation levels, CPU sizes)."""
    isos = list(Isolation)
    return PodDemand(f"mix/p{k}", int(rng.choice(MIX_SIZES)), tenant=f"t{k % 3}", isolation=isos[k % 3],
                     cpu_milli=1000 * int(rng.integers(1, 5)))


def learn_mix(policy: Policy, pods: int = 4096, seed: int = 3) -> np.random.Generator:
    """Let the policy observe `pods` pods (vramfit's snapshot refreshes at 1, 2, 4, ..., 2048, 4096 pods).

    Returns the generator, to draw further pods of the same workload from."""
    rng = np.random.default_rng(seed)
    for k in range(pods):
        policy.observe(mix_pod(k, rng))
    return rng


def step(state: ClusterState, policy: Policy, pod: PodDemand, placed: list[str]) -> float:
    """One scheduler cycle: filter + score every node (timed, ms), then, untimed, place the pod on the best
    node (one node changes, as in a real cycle) and free the oldest of the last 50 placed."""
    t0 = time.perf_counter()
    mask = fit.feasible(state, pod, policy.whole_gpu)
    scores = policy.score(state, pod, mask.now)
    best = int(np.argmax(np.where(mask.now, scores, -np.inf)))
    elapsed = (time.perf_counter() - t0) * 1000
    if mask.now[best]:
        choice = policy.choose(state, best, pod)
        if choice is not None:
            state.allocate(pod, choice)
            placed.append(pod.key)
    if len(placed) > 50:
        state.release(placed.pop(0))
    return elapsed


def time_policy(state: ClusterState, name: str, repeat: int) -> dict[str, float]:
    policy = get_policy(name)
    learn_mix(policy)  # a no-op for the policies that learn nothing
    pods = [PodDemand(f"bench/p{i}", v, tenant="t1", isolation=iso)
            for i, (v, iso) in enumerate([(14336, Isolation.NONE), (3072, Isolation.PROCESS),
                                          (30000, Isolation.HARDWARE), (9000, Isolation.NONE)])]
    samples = []
    first_ms = cold_ms = 0.0
    placed: list[str] = []
    for r in range(repeat):
        pod = PodDemand(f"bench/p{r}", pods[r % len(pods)].vram_mib, tenant="t1",
                        isolation=pods[r % len(pods)].isolation)
        elapsed = step(state, policy, pod, placed)
        if r == 0:
            first_ms = elapsed  # the policy's first call: whatever it builds once per cluster, and a new shape
        elif r < len(pods):
            cold_ms = max(cold_ms, elapsed)  # first sight of a pod shape: per-shape caches are cold
        else:
            samples.append(elapsed)
    for key in placed:
        state.release(key)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(0.99 * (len(samples) - 1))],
            "mean_ms": statistics.fmean(samples), "cold_max_ms": cold_ms, "first_ms": first_ms,
            "mix_shapes": len(policy.current_mix()) if isinstance(policy, FragAware) else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--policy", action="append", help="policies to time (default: all but paper:*)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    state = mixed_cluster(args.nodes)
    build_s = time.perf_counter() - t0
    research_policies.register()  # frag-aware and the other research variants are timed too
    names = args.policy or [p for p in policy_names() if not p.startswith("paper:")]
    results = {name: time_policy(state, name, args.repeat) for name in names}
    doc = {"command": f"python -m benchmarks.bench_scoring --nodes {args.nodes} --repeat {args.repeat}",
           "nodes": args.nodes, "gpus": int(state.present.sum()), "build_and_warm_s": round(build_s, 2),
           "machine": f"{platform.machine()} {platform.python_version()}", "target_ms": 2.0,
           "policies": results}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scoring.json").write_text(json.dumps(doc, indent=2))
    lines = [f"# Filter + score one pod: {args.nodes} nodes x 8 GPUs ({doc['gpus']} GPUs, mixed modes)", "",
             f"Command: `{doc['command']}` (target: <= 2 ms per pod)", "",
             "Each timed call filters and scores one pod over every node; between calls the pod is placed",
             "(untimed), so one node changes per cycle as in a live scheduler. `first` is the policy's first",
             "call (what it builds once per cluster, plus a new shape); `cold` the worst first call for each of",
             "the next new pod shapes (per-shape caches empty). Every policy first observes 4,096 pods; vramfit",
             "and frag-aware learn their mix from them (`mix` shapes, each scored under both measures).",
             "`python -m benchmarks.bench_frag` breaks vramfit down further (mix refreshes included).", "",
             "| policy | mix | p50 ms | p99 ms | mean ms | first ms | cold ms |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['mix_shapes'] or '-'} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{r['mean_ms']:.3f} | {r['first_ms']:.3f} | {r['cold_max_ms']:.3f} |")
        print(f"{name:<16} p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms")
    (RESULTS / "scoring.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
