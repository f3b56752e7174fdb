"""Peers the trace benchmark measures vramfit against: the FGD paper's six policies (`paper_policies`) and
its fragmentation measure (`workload_frag`). They live in the benchmark, not the core: the extender and
what-if never need them, and the benchmark adds them to the core's registry with `register()`.
"""

from __future__ import annotations

from benchmarks.peers import paper_policies as paper
from packing.policies import PolicyFactory, policy_names
from packing.policies import register as register_policy

PEERS: dict[str, tuple[PolicyFactory, str]] = {
    "paper:random": (paper.make_random, "FGD paper baseline: random feasible node, random fitting GPU"),
    "paper:dotprod": (paper.make_dotprod, "FGD paper baseline: smallest dot product of (CPU, GPU) vectors"),
    "paper:clustering": (paper.make_clustering, "FGD paper baseline: GpuClustering (same task kind together)"),
    "paper:packing": (paper.make_packing, "FGD paper baseline: GpuPacking (shared GPUs, then used nodes)"),
    "paper:bestfit": (paper.make_bestfit, "FGD paper baseline: BestFit on weighted CPU+GPU leftover"),
    "paper:fgd": (paper.make_fgd, "FGD (ATC'23): fragmentation gradient descent over the target workload"),
}


def register() -> None:
    """Add the FGD paper's policies to the core's registry (once: a second call finds them there)."""
    known = set(policy_names())
    for name, (factory, description) in PEERS.items():
        if name not in known:
            register_policy(name, factory, description)
