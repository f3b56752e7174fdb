"""`fit.FeasibleRows` (feasibility kept per pod shape, re-judged on moved rows) equals `fit.feasible` on every
state a cluster passes through: placements, releases, nodes changed, added and removed, new tenants."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.model import Gpu, Isolation, Mode, Node, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy
from packing.state import ClusterState

KINDS = [(81920, Mode.TIMESLICE, 4, "A100-80GB"), (40960, Mode.MPS, 4, "A100-40GB"), (24576, Mode.EXCLUSIVE, 1, "L4"),
         (81920, Mode.EXCLUSIVE, 1, "H100")]


def node(rng: random.Random, name: str) -> Node:
    gpus = []
    for j in range(rng.randint(1, 4)):
        memory, mode, replicas, product = KINDS[rng.randrange(len(KINDS))]
        gpus.append(Gpu(index=j, memory_mib=memory, mode=mode, replicas=replicas, product=product, model=product))
    return Node(name, tuple(gpus), cpu_milli=rng.choice([8000, 32000]), memory_mib=rng.choice([32768, 262144]))


def pod(rng: random.Random, i: int) -> PodDemand:
    return PodDemand(key=f"{rng.choice('abc')}/p{i}", tenant=rng.choice(["a", "b", "c", f"t{i}"]),
                     vram_mib=rng.choice([0, 8192, 20000, 40960]), gpu_count=rng.choice([1, 1, 2]),
                     isolation=rng.choice(list(Isolation)), cpu_milli=rng.choice([1000, 6000]),
                     memory_mib=rng.choice([1024, 65536]),
                     models=rng.choice([None, frozenset({"L4"}), frozenset({"A100-80GB", "H100"})]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.booleans())
def test_kept_rows_judge_as_the_full_filter(rng: random.Random, whole_gpu: bool) -> None:
    state = ClusterState([node(rng, f"n{i}") for i in range(rng.randint(2, 10))])
    kept = fit.FeasibleRows(max_shapes=8)
    policy = get_policy("best-fit")
    shapes = [pod(rng, i) for i in range(6)]  # asked again and again, as a scheduler's queue does
    placed: list[str] = []
    for i in range(60):
        step = rng.random()
        if step < 0.5:
            d = schedule_one(state, pod(rng, 100 + i), policy, explain_failures=False)
            if d.node is not None:
                placed.append(d.pod.key)
        elif step < 0.65 and placed:
            state.release(placed.pop(rng.randrange(len(placed))))
        elif step < 0.75:
            state.upsert_node(node(rng, f"n{rng.randint(0, 12)}"))
        elif step < 0.8 and len(state) > 1:
            state.remove_node(state.node_names[rng.randrange(len(state))])
        ask = rng.choice(shapes)
        got, want = kept.mask(state, ask, whole_gpu), fit.feasible(state, ask, whole_gpu)
        assert np.array_equal(got.now, want.now)
        assert np.array_equal(got.never, want.never)
        assert np.array_equal(got.gpu_ok, want.gpu_ok)
