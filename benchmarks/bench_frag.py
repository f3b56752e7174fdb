"""Speed of vramfit's policy with a learned workload mix: score one pod against 5,000 nodes x 8 GPUs.

The policy first learns a mix (`bench_scoring.learn_mix`: 4,096 pods of 12 sizes, 3 tenants, 3 isolation
levels, 4 CPU sizes; 64 shapes kept, each scored under both measures: 128 columns). Then it times
filter + score of one pod over every node:
- `first`: the policy's first call on this cluster (it interns every GPU and node, then scores a new shape),
- `new shape`: first sight of each further pod shape (every feasible node evaluated for it),
- `warm`: a shape scored before, one node changed since (what a scheduler does pod after pod),
- `after refresh`: the first call per shape after the learned mix was re-snapshotted (observe() does it at
  1, 2, 4, ..., 2048 pods, then every 2048): the first of them carries the tables over to the new mix.

    python -m benchmarks.bench_frag [--nodes 5000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.bench_scoring import MIX_SIZES, learn_mix, mix_pod, mixed_cluster, step
from packing.model import Isolation, PodDemand
from packing.policies import get_policy
from packing.policies.frag_aware import FragAware

ISOS = list(Isolation)
SHAPES = len(MIX_SIZES)  # the timed pods' distinct shapes


def timed_pod(r: int) -> PodDemand:
    """The r-th timed pod: 12 shapes in turn (size r mod 12, isolation r mod 3), tenant t1."""
    return PodDemand(f"bench/p{r}", MIX_SIZES[r % len(MIX_SIZES)], tenant="t1", isolation=ISOS[r % len(ISOS)],
                     cpu_milli=1000)


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
    rng = learn_mix(policy)
    observed = 4096
    first = 0.0
    new_shape: list[float] = []
    warm: list[float] = []
    placed: list[str] = []
    for r in range(SHAPES + args.repeat):
        ms = step(state, policy, timed_pod(r), placed)
        if r == 0:
            first = ms
        else:
            (new_shape if r < SHAPES else warm).append(ms)
    # Observe the same workload until the snapshot moves on, then score each shape once again.
    before = policy.current_mix()
    while policy.current_mix() == before:
        policy.observe(mix_pod(observed, rng))
        observed += 1
    kept = len({s for s, _ in policy.current_mix()} & {s for s, _ in before})
    refresh = [step(state, policy, timed_pod(r), placed) for r in range(len(MIX_SIZES))]
    warm.sort()
    print(f"{args.nodes} nodes x 8 GPUs ({int(state.present.sum())} GPUs), mix of {len(before)} shapes; "
          f"cluster build {build:.1f} s")
    print(f"vramfit filter+score: first call {first:.1f} ms; new shape mean {statistics.fmean(new_shape):.2f} ms, "
          f"max {max(new_shape):.2f} ms; warm p50 {statistics.median(warm):.3f} ms, "
          f"p99 {warm[int(0.99 * (len(warm) - 1))]:.3f} ms, mean {statistics.fmean(warm):.3f} ms")
    print(f"after the refresh at {observed} pods ({kept} of {len(policy.current_mix())} shapes kept): first call "
          f"{refresh[0]:.1f} ms, next new shapes mean {statistics.fmean(refresh[1:]):.2f} ms")


if __name__ == "__main__":
    main()
