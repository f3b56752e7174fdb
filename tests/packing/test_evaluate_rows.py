"""`frag_tables.evaluate_rows` (one evaluation per kind of node row, shared by the rows alike) answers every row as
`evaluate_interned` does on each, through placements and releases."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing.model import Node
from packing.place import schedule_one
from packing.policies import get_policy
from packing.policies.frag_aware import FragAware
from packing.policies.frag_tables import GROUP_ROWS, PodTerms, evaluate_interned, evaluate_rows
from packing.state import ClusterState
from tests.packing.test_feasible_rows import node, pod


def alike(kind: Node, name: str, turn: int) -> Node:
    """A node of the kind with its GPUs in another order (same content, other signatures by GPU index)."""
    k = len(kind.gpus)
    gpus = [replace(kind.gpus[(j + turn) % k], index=j) for j in range(k)]
    return Node(name, tuple(gpus), cpu_milli=kind.cpu_milli, memory_mib=kind.memory_mib)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_rows_alike_are_evaluated_once_and_answered_alike(rng: random.Random) -> None:
    kinds = [node(rng, "k") for _ in range(3)]  # few kinds of node, many nodes: rows repeat
    state = ClusterState([alike(kinds[i % 3], f"n{i}", i // 3) for i in range(3 * GROUP_ROWS)])
    policy = get_policy("vramfit")
    assert isinstance(policy, FragAware)
    placed = []
    for i in range(40):
        d = schedule_one(state, pod(rng, i), policy, explain_failures=False)
        if d.node is not None:
            placed.append(d.pod.key)
        if placed and rng.random() < 0.2:
            state.release(placed.pop(rng.randrange(len(placed))))
    mix, table = policy._prepare(state)
    rows = np.arange(len(state))
    for i in range(6):
        p = pod(rng, 100 + i)
        view = policy._pod_view(state, p, mix)
        terms = PodTerms(view.tenant_id, view.kind_ok)
        terms.extend(table, mix, view)
        got, want = evaluate_rows(state, rows, table, mix, view, terms), evaluate_interned(state, rows, table, mix,
                                                                                         view, terms)
        for name in ("loss", "pack", "select", "loss_g"):
            assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True), name
