"""Speed of vramfit's policy with a learned workload mix: score one pod against 5,000 nodes x 8 GPUs.

`benchmarks.bench_scoring` times every policy without ever calling `observe`, so the fragmentation-aware
policy runs there with an empty mix. This script first lets the policy learn a mix (pods of 12 shapes,
several tenants and isolation levels), then times filter + score:
- `cold`: a pod shape seen for the first time (every node evaluated),
- `warm`: a shape scored before, one node changed since (what a scheduler does pod after pod).

    python -m benchmarks.bench_frag [--nodes 5000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.bench_scoring import mixed_cluster
from packing import fit
from packing.frag import FragAware
from packing.model import Isolation, PodDemand
from packing.policies import get_policy

SIZES = (3072, 8011, 9000, 14336, 14878, 16022, 18000, 20000, 29755, 30000, 40055, 40960)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    state = mixed_cluster(args.nodes)
    build = time.perf_counter() - t0
    policy = get_policy("vramfit")
    assert isinstance(policy, FragAware)
    rng = np.random.default_rng(3)
    isos = list(Isolation)
    for k in range(4096):  # learn the mix (the snapshot refreshes at 16, 32, ..., 2048, 4096 pods)
        policy.observe(PodDemand(f"mix/p{k}", int(rng.choice(SIZES)), tenant=f"t{k % 3}",
                                 isolation=isos[k % 3], cpu_milli=1000 * int(rng.integers(1, 5))))
    cold: list[float] = []
    warm: list[float] = []
    placed: list[str] = []
    for r in range(args.repeat):
        v = SIZES[r % len(SIZES)]
        pod = PodDemand(f"bench/p{r}", v, tenant="t1", isolation=isos[r % 3], cpu_milli=1000)
        t1 = time.perf_counter()
        mask = fit.feasible(state, pod, policy.whole_gpu)
        scores = policy.score(state, pod, mask.now)
        best = int(np.argmax(np.where(mask.now, scores, -np.inf)))
        ms = (time.perf_counter() - t1) * 1000
        (cold if r < len(SIZES) * 3 else warm).append(ms)
        if mask.now[best]:
            choice = policy.choose(state, best, pod)
            if choice is not None:
                state.allocate(pod, choice)
                placed.append(pod.key)
        if len(placed) > 50:
            state.release(placed.pop(0))
    warm.sort()
    print(f"{args.nodes} nodes x 8 GPUs ({int(state.present.sum())} GPUs), mix of {len(policy.current_mix())} "
          f"shapes; build+warm {build:.1f} s")
    print(f"vramfit filter+score: cold (first sight of a shape) mean {statistics.fmean(cold[:len(SIZES)]):.2f} ms; "
          f"warm p50 {statistics.median(warm):.3f} ms, p99 {warm[int(0.99 * (len(warm) - 1))]:.3f} ms, "
          f"mean {statistics.fmean(warm):.3f} ms")


if __name__ == "__main__":
    main()
