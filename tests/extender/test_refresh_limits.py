"""DemandLimits kept row by row (extender/verbs/shared.py NodeSizes): the same limits as read from every node,
through placements, node changes and removals."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_extender import BENCH_NAMESPACE, make_node
from extender.store import Store
from extender.verbs.shared import DemandLimits, NodeSizes
from packing.catalog import load_catalog
from packing.k8s.snapshot import upsert_node
from packing.model import PodDemand
from packing.place import schedule_one
from packing.policies import get_policy

CATALOG = load_catalog()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_limits_kept_row_by_row_equal_limits_read_from_every_node(seed: int) -> None:
    rng = random.Random(seed)
    store = Store.from_objects([make_node(k) for k in range(12)] + [BENCH_NAMESPACE], CATALOG)
    state, sizes, policy = store.state, NodeSizes(), get_policy("best-fit")
    for j in range(30):
        step = rng.random()
        if step < 0.6:
            schedule_one(state, PodDemand(key=f"bench/p{j}", vram_mib=rng.choice([4096, 20000, 40000])), policy)
        elif step < 0.8:
            obj = make_node(rng.randrange(40))  # a new node, or one replaced by its own description
            obj["status"]["allocatable"]["cpu"] = str(rng.choice([8, 64, 512]))
            upsert_node(state, obj, CATALOG, store.names)
        elif len(state) > 1:
            state.remove_node(state.node_names[rng.randrange(len(state))])
        assert DemandLimits.of(CATALOG, state, sizes) == DemandLimits.of(CATALOG, state)
