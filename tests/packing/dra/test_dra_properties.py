"""Invariants of DRA allocation over random NVIDIA-shaped clusters and random bursts of claims (issue 29, "Tests
and measures"): no exclusive device twice, consumed capacity within each device's, devices on the node the
nodeSelector names, one tenant per shared device, no hardware pod on a share, partitionable MIG placements never
overlapping, every allocation schema-valid, and a restart (books rebuilt from the claims) booking the same units."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_objects import A100, H100, GpuSpec, catalog, claim_obj, exact, node_slices, pod, world
from fakes.dra_schema import validate_object
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing.dra.allocate import Ledger, PodAllocation
from packing.dra.books import book_claim
from packing.dra.objects import Claim, DeviceId
from packing.dra.parse import claim as parse_claim
from packing.dra.results import allocation_json
from packing.model import Isolation, Mode
from packing.state import ClusterState

LAYOUTS = (("3g.40gb@0", "2g.20gb@4", "1g.10gb@6"), ("7g.80gb@0",), ("4g.40gb@0", "3g.40gb@4"),
           ("1g.10gb@0", "1g.10gb@1", "2g.20gb@2", "2g.20gb@4", "1g.10gb@6"))

gpus = st.one_of(
    st.builds(GpuSpec, st.just("whole"), st.sampled_from([A100, H100])),
    st.builds(GpuSpec, st.just("shared"), st.sampled_from([A100, H100]),
              st.sampled_from(["memory", "unlimited", 2, 4])),
    st.builds(GpuSpec, st.just("mig"), st.just(A100), st.just("memory"), st.sampled_from(LAYOUTS)),
    st.builds(GpuSpec, st.just("partitionable"), st.sampled_from([A100, H100])),
)
clusters = st.lists(st.lists(gpus, min_size=1, max_size=3), min_size=1, max_size=3)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    mig = draw(st.booleans())
    name = draw(st.sampled_from(["gpu", "mig", "x"]))
    count = draw(st.integers(1, 2))
    if mig:
        return exact(name, cls="mig.nvidia.com", count=count, memory=draw(st.sampled_from([None, "9Gi", "20Gi"])))
    return exact(name, count=count, memory=draw(st.sampled_from([None, "5Gi", "14Gi", "40Gi"])))


@dataclass(frozen=True)
class PodSpec:
    tenant: str
    hardware: bool
    claims: tuple[tuple[dict[str, Any], ...], ...]  # per claim, its requests


@st.composite
def pod_specs(draw: st.DrawFn) -> PodSpec:
    claims = draw(st.lists(st.lists(requests(), min_size=1, max_size=2, unique_by=lambda r: r["name"]).map(tuple),
                           min_size=1, max_size=2).map(tuple))
    return PodSpec(draw(st.sampled_from(["team-a", "team-b", "team-c"])), draw(st.booleans()), claims)


@dataclass
class Done:
    allocation: PodAllocation
    spec: PodSpec
    claims: list[tuple[dict[str, Any], Claim]]  # the claim object with its status, parsed back


def run(cluster: list[list[GpuSpec]], pods: list[PodSpec]) -> tuple[Any, list[Done]]:
    slices = [s for i, node in enumerate(cluster) for s in node_slices(f"node-{i}", node)]
    w = world(slices)
    done: list[Done] = []
    for i, spec in enumerate(pods):
        objs = [claim_obj(f"c{i}-{j}", spec.tenant, list(reqs)) for j, reqs in enumerate(spec.claims)]
        iso = Isolation.HARDWARE if spec.hardware else Isolation.NONE
        got = w.allocator.allocate(pod(f"{spec.tenant}/p{i}", *objs, tenant=spec.tenant, isolation=iso))
        if not isinstance(got, PodAllocation):
            continue
        back = []
        for obj, cp in zip(objs, got.claims, strict=True):
            full = {**obj, "status": {"allocation": allocation_json(cp, w.classes)}}
            back.append((full, parse_claim(full)))
        done.append(Done(got, spec, back))
    return w, done


PROPS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(cluster=clusters, pods=st.lists(pod_specs(), min_size=1, max_size=8))
def test_allocation_invariants(cluster: list[list[GpuSpec]], pods: list[PodSpec]) -> None:
    w, done = run(cluster, pods)
    inv = w.inventory
    exclusive: dict[DeviceId, int] = defaultdict(int)
    consumed: dict[DeviceId, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    tenants: dict[DeviceId, set[str]] = defaultdict(set)
    placements: dict[tuple[str, int], list[tuple[str | None, bool]]] = defaultdict(list)
    for d in done:
        for full, parsed in d.claims:
            validate_object(full)
            assert parsed.allocation is not None
            for r in parsed.allocation.results:
                device = inv.devices[r.device]
                assert device.node == parsed.allocation.node, (r.device, parsed.allocation.node)
                unit = inv.nodes[device.node].units[r.device]
                placements[(device.node, unit.gpu)].append((unit.mig, unit.whole))
                if device.allow_multiple:
                    assert r.share_id and r.consumed is not None
                    assert not d.spec.hardware, f"hardware pod on shared {r.device}"
                    tenants[r.device].add(d.spec.tenant)
                    for k, v in r.consumed.items():
                        consumed[r.device][k] += v
                else:
                    assert r.share_id is None and r.consumed is None
                    exclusive[r.device] += 1
    assert all(n == 1 for n in exclusive.values()), exclusive
    for dev, used in consumed.items():
        caps = inv.devices[dev].capacity
        assert set(used) == set(caps)  # every capacity of a shared device is in consumedCapacity
        assert all(v <= caps[k].value for k, v in used.items()), (dev, used)
    assert all(len(t) == 1 for t in tenants.values()), tenants
    for (node, gpu_index), units in placements.items():
        gpu = inv.nodes[node].node.gpus[gpu_index]
        if gpu.mode is not Mode.MIG_DYNAMIC:
            continue
        if any(whole for _m, whole in units):
            assert len(units) == 1, f"whole partitionable GPU {node}/{gpu_index} shared: {units}"
            continue
        taken = 0
        for ref, _whole in units:
            inst = gpu.instance(ref or "")
            assert inst is not None
            mask = ((1 << inst.memory_slices) - 1) << inst.start
            assert not taken & mask, f"{ref} overlaps on {node}/{gpu_index}"
            taken |= mask


def _holders(state: ClusterState) -> set[tuple[str, str, tuple[Any, ...]]]:
    return {(h.pod.key, h.assignment.node, h.assignment.gpus) for h in state.holders()}


@PROPS
@given(cluster=clusters, pods=st.lists(pod_specs(), min_size=1, max_size=8))
def test_restart_books_the_same_units(cluster: list[list[GpuSpec]], pods: list[PodSpec]) -> None:
    w, done = run(cluster, pods)
    fresh = ClusterState([n.node for n in w.inventory.nodes.values()])
    ledger = Ledger()
    for d in done:
        for _full, parsed in d.claims:
            booked = book_claim(fresh, w.inventory, ledger, parsed, d.spec.tenant)
            assert booked.problems == ()
            assert len(booked.holders) == len(parsed.allocation.results if parsed.allocation else ())
    assert _holders(fresh) == _holders(w.state)
    live = {k: {c: v for c, v in used.items() if v} for k, used in w.allocator.ledger.used.items()}
    again = {k: {c: v for c, v in used.items() if v} for k, used in ledger.used.items()}
    assert {k: v for k, v in again.items() if v} == {k: v for k, v in live.items() if v}


def test_catalog_is_loaded_once() -> None:
    assert catalog() is catalog()
