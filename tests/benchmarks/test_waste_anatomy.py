"""The waste anatomy's bounds: the conditional LP, and the order a policy's end state >= conditional bound >= LP bound."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import lp_bound, waste_anatomy
from benchmarks.bench_variants import variant_tasks
from benchmarks.variants import default_nodes, variant


def test_packing_lp_with_a_floor_on_a_size() -> None:
    sizes = Counter({810: 2, 500: 2})
    free = lp_bound.packing_lp(sizes, 2)
    # Two GPUs: 500 + 500 on one, an 810 on the other is the best (1,810 milli); one 810 is left out.
    assert free.packed == pytest.approx(1810.0)
    assert free.used[81] == pytest.approx(1.0) and free.used[50] == pytest.approx(2.0)
    held = lp_bound.packing_lp(sizes, 2, at_least=Counter({810: 2}))
    # Both 810s placed: each takes a GPU, no 500 fits beside one.
    assert held.packed == pytest.approx(1620.0)
    assert held.used[81] == pytest.approx(2.0) and held.used.get(50, 0.0) == pytest.approx(0.0)


def test_prefix_is_the_bounds_stopping_rule() -> None:
    nodes, tasks = default_nodes(), variant_tasks(variant("default"))
    p = lp_bound.prefix(nodes, tasks, 42)
    assert p.arrived <= p.cap and p.cap - p.arrived < 8 * 1000
    assert p.bins == p.cap // 1000 - p.whole_gpus
    assert lp_bound.bound_on(nodes, tasks, 42)["unallocated_pct_lower_bound"] == pytest.approx(3.096, abs=1e-3)


def test_a_policys_end_state_is_never_below_the_conditional_bound() -> None:
    """Any policy's end state is a packing that holds what it placed, so it is at or above the conditional
    bound, which is at or above the plain LP bound (module docstring)."""
    r = waste_anatomy.run_one(("default", "paper:bestfit", 42, 1.3))
    assert r["lp_bound_pct"] <= r["conditional_bound_pct"] + 1e-9
    assert r["conditional_bound_pct"] <= r["free_at_stop_pct"] + 1e-9
    assert set(r["lp_drops"]) == {"810"}
    assert 0 < r["placed"]["810"] <= r["arrived"]["810"]
    # The LP leaves 810s out to reach its bound; bestfit placed nearly every one that arrived.
    assert r["conditional_bound_pct"] > r["lp_bound_pct"] + 0.2
    assert r["sliver_pct"] <= r["free_at_stop_pct"]
