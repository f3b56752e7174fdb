"""The DRA bench: the first-fit emulation never over-commits, walks devices in slice order, and the bench writes
its files."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import dra_bench
from benchmarks.dra_firstfit import FirstFit, search_order
from benchmarks.dra_slices import (
    DYNAMIC_MIG,
    MIG_CLASS,
    SHARES,
    STATIC_MIG,
    WHOLE,
    GpuSpec,
    claim_object,
    class_objects,
    node_slices,
)
from packing.catalog import load_catalog
from packing.dra.allocate import Allocator, PodAllocation, PodClaims
from packing.dra.index import EligibleIndex
from packing.dra.nodes import dra_inventory
from packing.dra.parse import claim as parse_claim
from packing.dra.parse import device_class
from packing.model import Isolation
from packing.policies import get_policy
from packing.state import ClusterState

CATALOG = load_catalog()
CLASSES = {c.name: c for c in map(device_class, class_objects())}
MIB = 1 << 20


def _first_fit(slices: list[dict[str, Any]], seed: int = 0) -> FirstFit:
    nodes = search_order(slices)
    return FirstFit(nodes, CLASSES, {n: 10**9 for n in nodes}, {n: None for n in nodes}, seed=seed)


FORMS = st.sampled_from([GpuSpec("A100-80GB", WHOLE), GpuSpec("A100-80GB", SHARES), GpuSpec("H100-80GB", DYNAMIC_MIG),
                         GpuSpec("A100-80GB", STATIC_MIG, (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)))])
ASKS = st.tuples(st.sampled_from(["gpu.nvidia.com", MIG_CLASS]), st.one_of(st.none(), st.integers(1, 90000)),
                 st.integers(1, 3))


def _capacity_of(dev: Any, name: str) -> Fraction:
    return dev.capacity[name].value


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(FORMS, min_size=1, max_size=3), min_size=1, max_size=3), st.lists(ASKS, max_size=25),
       st.integers(0, 1000))
def test_first_fit_never_over_commits(nodes: list[list[GpuSpec]], asks: list[tuple[str, int | None, int]],
                                      seed: int) -> None:
    rng = random.Random(seed)
    slices = [s for i, gpus in enumerate(nodes) for s in node_slices(f"n{i}", gpus, CATALOG, rng)]
    ff = _first_fit(slices, seed)
    exclusive: list[Any] = []
    shared: dict[Any, dict[str, Fraction]] = {}
    counters: dict[tuple[str, str], dict[str, Fraction]] = {}
    for k, (cls, mem, count) in enumerate(asks):
        got = ff.place((parse_claim(claim_object("ns", f"c{k}", cls, memory_mib=mem, count=count)),))
        if got is None:
            continue
        node, picks = got
        assert len(picks) == count
        for p in picks:
            assert p.fit.device.node == node
            if p.fit.consumed is None:
                exclusive.append(p.fit.device.id)
            else:
                used = shared.setdefault(p.fit.device.id, {})
                for name, v in p.fit.consumed.items():
                    used[name] = used.get(name, 0) + v
                    assert used[name] <= _capacity_of(p.fit.device, name)
            if p.fit.consumed is None:  # the shareable devices built here consume no counters
                for use in p.fit.device.consumes:
                    c = counters.setdefault((node, use.counter_set), {})
                    for name, v in use.counters:
                        c[name] = c.get(name, 0) + v
    assert len(exclusive) == len(set(exclusive)), "an exclusive device given twice"
    assert not set(exclusive) & set(shared), "a device given whole and shared"
    sets = {(n, k): v for n, nd in search_order(slices).items() for (_d, _p), cs in nd.counter_sets.items()
            for k, v in cs.items()}
    for key, used in counters.items():
        assert all(v <= sets[key][name] for name, v in used.items()), f"counters of {key} over-committed"


def _mig_slices(order: list[str]) -> list[dict[str, Any]]:
    """One A100 with 4g.40gb@0, 2g.20gb@4, 1g.10gb@6, listed in the given profile order (Go map order)."""
    layout = {"4g.40gb": 0, "2g.20gb": 4, "1g.10gb": 6}
    slices = node_slices("node-mig", [GpuSpec("A100-80GB", STATIC_MIG, tuple((p, layout[p]) for p in order))],
                         CATALOG, random.Random(0))
    by_profile = {d["attributes"]["profile"]["string"]: d for d in slices[0]["spec"]["devices"]}
    slices[0]["spec"]["devices"] = [by_profile[p] for p in order]
    return slices


def _vramfit(slices: list[dict[str, Any]]) -> Allocator:
    inv = dra_inventory(slices, CATALOG)
    state = ClusterState([d.node for d in inv.nodes.values()])
    return Allocator(state, inv.nodes, EligibleIndex(inv, CLASSES), get_policy("vramfit"))


def _mig_claim(name: str, mib: int) -> Any:
    return parse_claim(claim_object("team", name, MIG_CLASS, memory_mib=mib))


def test_first_fit_follows_slice_order_and_strands_the_big_instance() -> None:
    """The driver lists the 4g.40gb first: a 9 GiB claim gets it, and the 40 GiB claim after it finds no device;
    vramfit gives the 9 GiB claim the 1g.10gb and both fit."""
    slices = _mig_slices(["4g.40gb", "2g.20gb", "1g.10gb"])
    ff = _first_fit(slices)
    small = ff.place((_mig_claim("small", 9 * 1024),))
    assert small is not None and small[1][0].fit.device.attribute("profile") == "4g.40gb"
    assert ff.place((_mig_claim("big", 40000),)) is None

    vf = _vramfit(slices)
    got = vf.allocate(PodClaims("team/a", "u1", "team", Isolation.NONE, (_mig_claim("small", 9 * 1024),)))
    assert isinstance(got, PodAllocation)
    assert got.claims[0].picks[0].fit.device.attribute("profile") == "1g.10gb"
    assert isinstance(vf.allocate(PodClaims("team/b", "u2", "team", Isolation.NONE, (_mig_claim("big", 40000),))),
                      PodAllocation)


def test_first_fit_takes_the_first_listed_device_in_a_reversed_slice() -> None:
    slices = _mig_slices(["1g.10gb", "2g.20gb", "4g.40gb"])
    got = _first_fit(slices).place((_mig_claim("small", 9 * 1024),))
    assert got is not None and got[1][0].fit.device.attribute("profile") == "1g.10gb"


def test_three_requests_of_one_claim_walk_the_order() -> None:
    """1g + 2g + 4g asked by memory in one claim: each request takes the first free device large enough, in slice
    order, and the search backtracks until all three fit."""
    slices = _mig_slices(["2g.20gb", "4g.40gb", "1g.10gb"])
    claim = parse_claim(claim_object("team", "trio", requests=[("small", MIG_CLASS, 9 * 1024, 1),
                                                                ("mid", MIG_CLASS, 19 * 1024, 1),
                                                                ("big", MIG_CLASS, 39 * 1024, 1)]))
    got = _first_fit(slices).place((claim,))
    assert got is not None
    # small takes the 2g (listed first), mid the 4g, big finds nothing: backtracking ends at 1g, 2g, 4g
    assert [p.fit.device.attribute("profile") for p in got[1]] == ["1g.10gb", "2g.20gb", "4g.40gb"]


def test_quick_bench_writes_its_files(tmp_path: Any) -> None:
    out = tmp_path / "dra"
    assert dra_bench.main(["--quick", "--parts", "a,c", "--nodes", "20", "--out", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert {"command", "machine", "scenarios", "latency"} <= set(doc)
    assert doc["latency"]["pods"] == 200 and doc["latency"]["p99_s"] >= doc["latency"]["p50_s"]
    for row in doc["scenarios"]["summary"]:
        assert row["vramfit"] <= row["pods"] and row["first_fit"] <= row["pods"]
    text = out.with_suffix(".md").read_text()
    assert "(a) Scenarios" in text and "(c) Gate-to-allocation" in text
