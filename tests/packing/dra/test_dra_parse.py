"""Reading `resource.k8s.io/v1` JSON (packing.dra.parse) and gathering pools (packing.dra.pools): the newest
generation of a pool wins, a pool counts only once all its slices are seen, 1.35+ split slices (counters-only +
devices) make one pool, and bad input is an InputError naming the object and the field (dra.md §2, §4)."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
from dra_objects import (
    GI,
    NV,
    GpuSpec,
    claim_obj,
    exact,
    first_available,
    node_slices,
    partitionable_gpu,
    resource_slice,
    whole_gpu,
)
from hypothesis import given
from hypothesis import strategies as st

from packing.dra.cel import Semver
from packing.dra.nodes import dra_inventory
from packing.dra.objects import DeviceId
from packing.dra.parse import claim, device_class, selector_node, slice_devices
from packing.dra.pools import gather_pools
from packing.model import InputError, Mode


def devices_of(pools: Any, pool: str = "node-a") -> list[str]:
    return sorted(d.id.device for p in pools.pools if p.name == pool for d in p.devices)


# ------------------------------------------------------------------ generations and completeness

@pytest.mark.parametrize("newest_first", [False, True])
def test_newest_generation_wins(newest_first: bool) -> None:
    old = resource_slice("node-a", [whole_gpu(0, "node-a")], generation=1)
    new = resource_slice("node-a", [whole_gpu(0, "node-a"), whole_gpu(1, "node-a")], generation=2)
    got = gather_pools([new, old] if newest_first else [old, new])
    assert devices_of(got) == ["gpu-0", "gpu-1"]
    assert [p.generation for p in got.pools] == [2]
    assert got.incomplete == ()


def test_older_generation_slices_are_not_mixed_in() -> None:
    # gen 1 had two slices; gen 2 has one: the stale second slice of gen 1 must not add its device
    old = [resource_slice("node-a", [whole_gpu(0, "node-a")], generation=1, count=2, index=0),
           resource_slice("node-a", [whole_gpu(7, "node-a")], generation=1, count=2, index=1)]
    new = resource_slice("node-a", [whole_gpu(0, "node-a")], generation=2, count=1)
    got = gather_pools([old[0], new, old[1]])
    assert devices_of(got) == ["gpu-0"]


def test_incomplete_pool_is_left_out_until_every_slice_is_seen() -> None:
    first = resource_slice("node-a", [whole_gpu(0, "node-a")], count=2, index=0)
    second = resource_slice("node-a", [whole_gpu(1, "node-a")], count=2, index=1)
    got = gather_pools([first])
    assert got.pools == ()
    assert got.incomplete == (f"{NV}/node-a",)
    got = gather_pools([first, second])
    assert devices_of(got) == ["gpu-0", "gpu-1"]
    assert got.incomplete == ()


def test_incomplete_newer_generation_hides_the_older_complete_one() -> None:
    # kube-scheduler uses only the highest generation; until it is complete vramfit allocates nothing there
    old = resource_slice("node-a", [whole_gpu(0, "node-a")], generation=1)
    new = resource_slice("node-a", [whole_gpu(0, "node-a")], generation=2, count=2)
    got = gather_pools([old, new])
    assert got.pools == ()
    assert got.incomplete == (f"{NV}/node-a",)
    inv = dra_inventory([old, new], _catalog())
    assert inv.nodes == {} and inv.incomplete == (f"{NV}/node-a",)


def test_pools_of_other_drivers_are_skipped_when_drivers_are_named() -> None:
    other = resource_slice("node-a", [whole_gpu(0, "node-a")], driver="gpu.example.com")
    mine = resource_slice("node-a", [whole_gpu(0, "node-a")])
    got = gather_pools([other, mine], frozenset({NV}))
    assert [(p.driver, p.name) for p in got.pools] == [(NV, "node-a")]
    assert len(gather_pools([other, mine]).pools) == 2


@given(order=st.permutations(range(4)))
def test_split_slices_read_as_one_pool_in_any_order(order: list[int]) -> None:
    slices = node_slices("node-a", [GpuSpec("partitionable"), GpuSpec("whole"), GpuSpec("partitionable")])
    assert len(slices) == 4 and "devices" not in slices[0]["spec"]  # counters-only slice first
    got = gather_pools([slices[i] for i in order])
    (pool,) = got.pools
    assert set(pool.counter_sets) == {"gpu-0-counter-set", "gpu-2-counter-set"}
    assert pool.counter_sets["gpu-0-counter-set"]["memory-slice-7"] == 1
    assert {"gpu-1", "gpu-0", "gpu-2"} <= {d.id.device for d in pool.devices}
    inv = dra_inventory([slices[i] for i in order], _catalog())
    modes = [g.mode for g in inv.nodes["node-a"].node.gpus]
    assert modes == [Mode.MIG_DYNAMIC, Mode.EXCLUSIVE, Mode.MIG_DYNAMIC]


def test_split_and_combined_publications_read_the_same() -> None:
    spec = [GpuSpec("partitionable"), GpuSpec("shared", shares=3)]
    split = dra_inventory(node_slices("node-a", spec, split=True), _catalog())
    combined = dra_inventory(node_slices("node-a", spec, split=False), _catalog())
    assert split.nodes["node-a"].node == combined.nodes["node-a"].node
    assert split.nodes["node-a"].units == combined.nodes["node-a"].units


def test_split_pool_missing_its_counters_slice_is_incomplete() -> None:
    slices = node_slices("node-a", [GpuSpec("partitionable")])
    got = gather_pools(slices[1:])
    assert got.pools == () and got.incomplete == (f"{NV}/node-a",)


def _catalog() -> Any:
    from dra_objects import catalog
    return catalog()


# ------------------------------------------------------------------ slice contents

def test_slice_devices_reads_attributes_capacity_and_counters() -> None:
    cset, devs = partitionable_gpu(0, "node-a")
    mig = next(d for d in devs if d["attributes"]["type"]["string"] == "mig")
    obj = resource_slice("node-a", [mig], counters=[cset])
    driver, pool, gen, count, node, devices, counters = slice_devices(obj)
    assert (driver, pool, gen, count, node) == (NV, "node-a", 1, 1, "node-a")
    d = devices[0]
    assert d.id == DeviceId(NV, "node-a", mig["name"])
    assert d.attribute("type") == "mig" and d.attribute(f"{NV}/type") == "mig"
    assert d.attribute("cudaComputeCapability") == Semver("8.0.0")
    assert d.consumes[0].counter_set == "gpu-0-counter-set"
    assert counters["gpu-0-counter-set"]["memory"] == 80 * GI


def test_shared_gpu_policy_and_flags() -> None:
    obj = resource_slice("node-a", [whole_gpu(1, "node-a", shares=4)])
    (d,) = slice_devices(obj)[5]
    assert d.allow_multiple
    mem = d.capacity["memory"]
    assert mem.value == 80 * GI
    assert mem.policy is not None
    assert (mem.policy.default, mem.policy.min, mem.policy.max, mem.policy.step) == (0, 0, 80 * GI, 2**20)
    shares = d.capacity["shares"]
    assert shares.value == 4 and shares.policy is not None and shares.policy.default == 1


def test_list_attributes_are_skipped_and_blocking_taints_mark_the_device() -> None:
    dev = whole_gpu(0, "node-a")
    dev["attributes"]["numaNodes"] = {"ints": [0, 1]}
    dev["taints"] = [{"key": "k", "effect": "NoExecute"}]
    soft = whole_gpu(1, "node-a")
    soft["taints"] = [{"key": "k", "effect": "PreferNoSchedule"}]
    devices = slice_devices(resource_slice("node-a", [dev, soft]))[5]
    assert "numaNodes" not in devices[0].attributes
    assert devices[0].tainted and not devices[1].tainted


def test_capacity_names_resolve_bare_and_qualified() -> None:
    (d,) = slice_devices(resource_slice("node-a", [whole_gpu(0, "node-a")]))[5]
    assert d.capacity_of("memory") == d.capacity_of(f"{NV}/memory")
    assert d.capacity_of("example.com/memory") is None


# ------------------------------------------------------------------ classes and claims

def test_device_class_selectors_and_config() -> None:
    obj = {"metadata": {"name": "gpu.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression": "true"}}],
                    "config": [{"opaque": {"driver": NV, "parameters": {"a": 1}}}]}}
    cls = device_class(obj)
    assert cls.name == "gpu.nvidia.com" and cls.selectors == ("true",)
    assert cls.config[0].driver == NV and cls.config[0].parameters == {"a": 1}


def test_claim_fields() -> None:
    obj = claim_obj("c", requests=[exact("gpu", memory="14Gi", count=2),
                                   first_available("alt", exact("big", memory="40Gi"), exact("small")),
                                   exact("every", cls="mig.nvidia.com", all_devices=True)],
                    constraints=[{"requests": ["gpu", "alt"], "matchAttribute": f"{NV}/productName"}],
                    config=[{"requests": ["gpu"], "opaque": {"driver": NV, "parameters": {"x": 1}}}])
    obj["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": "pod-uid", "controller": True,
                                           "apiVersion": "v1"}]
    obj["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}
    c = claim(obj)
    assert c.ref.key == "team-a/c" and c.uid == "uid-team-a-c" and c.resource_version == "1"
    gpu, alt, every = c.requests
    assert gpu.alternatives[0].count == 2 and gpu.alternatives[0].capacity == {"memory": 14 * GI}
    assert [a.name for a in alt.alternatives] == ["alt/big", "alt/small"]
    assert every.alternatives[0].all_devices and every.alternatives[0].device_class == "mig.nvidia.com"
    assert c.constraints[0].match_attribute == f"{NV}/productName"
    assert c.config[0].requests == ("gpu",)
    assert c.finalizers == ("resource.kubernetes.io/delete-protection",) and c.deleting
    assert c.owner_pod_uid == "pod-uid" and c.reserved_for == ("pod-uid",)
    assert c.allocation is None


def test_claim_allocation_is_read_back() -> None:
    obj = claim_obj("c")
    obj["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": NV, "pool": "node-a", "device": "gpu-1",
                                 "shareID": "5f0c2a9e-3d41-4b8a-9e67-1c2d3e4f5a6b",
                                 "consumedCapacity": {"memory": "14Gi"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}
    alloc = claim(obj).allocation
    assert alloc is not None and alloc.node == "node-a"
    (r,) = alloc.results
    assert r.device == DeviceId(NV, "node-a", "gpu-1") and r.consumed == {"memory": Fraction(14 * GI)}


@pytest.mark.parametrize("selector, node", [
    (None, None),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}, "n"),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}]},
     None),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}]}, None),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}, None),
])
def test_selector_node(selector: Any, node: str | None) -> None:
    assert selector_node(selector) == node


# ------------------------------------------------------------------ bad input

def _slice_with(**device: Any) -> dict[str, Any]:
    return resource_slice("node-a", [{"name": "gpu-0", **device}])


@pytest.mark.parametrize("obj, field", [
    (_slice_with(capacity={"memory": {"value": "lots"}}), "spec.devices[0].capacity[memory].value"),
    (_slice_with(capacity={"memory": {}}), "spec.devices[0].capacity[memory].value"),
    (_slice_with(attributes={"index": {"int": "zero"}}), "spec.devices[0].attributes[index]"),
    (_slice_with(capacity={"memory": {"value": "1Gi", "requestPolicy": {"default": "x"}}}),
     "spec.devices[0].capacity[memory].requestPolicy.default"),
    (resource_slice("node-a", [{"attributes": {}}]), "spec.devices[0].name"),
    ({"kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": {"pool": {"name": "p"}}},
     "spec.driver / spec.pool.name"),
])
def test_bad_slice_names_object_and_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        slice_devices(obj)
    assert err.value.field_name == field
    assert err.value.obj.startswith("ResourceSlice ")


def test_bad_slice_is_a_problem_not_a_crash_for_gather_pools() -> None:
    bad = _slice_with(capacity={"memory": {"value": "lots"}})
    bad["spec"]["pool"]["name"] = bad["spec"]["nodeName"] = "node-b"
    good = resource_slice("node-a", [whole_gpu(0, "node-a")])
    got = gather_pools([bad, good])
    assert devices_of(got) == ["gpu-0"]
    assert len(got.problems) == 1 and "capacity[memory].value" in got.problems[0]


def test_bad_pool_generation_names_the_field() -> None:
    obj = resource_slice("node-a", [whole_gpu(0, "node-a")])
    obj["spec"]["pool"]["generation"] = "new"
    got = gather_pools([obj])
    assert len(got.problems) == 1 and "spec.pool.generation" in got.problems[0]


def _claim_with(request: dict[str, Any]) -> dict[str, Any]:
    return claim_obj("c", requests=[request])


@pytest.mark.parametrize("obj, field", [
    (_claim_with({"name": "gpu", "exactly": {}}), "spec.devices.requests[0].exactly.deviceClassName"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}),
     "spec.devices.requests[0].exactly.count"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "allocationMode": "Some"}}),
     "spec.devices.requests[0].exactly.allocationMode"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "capacity": {"requests": {"memory": "1 Gi"}}}}),
     "spec.devices.requests[0].exactly.capacity.requests[memory]"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "selectors": [{"cel": {}}]}}),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression"),
    (_claim_with({"name": "gpu"}), "spec.devices.requests[0]"),
    (_claim_with({"exactly": {"deviceClassName": "x"}}), "spec.devices.requests[0].name"),
    (_claim_with({"name": "alt", "firstAvailable": [{"name": "a"}]}),
     "spec.devices.requests[0].firstAvailable[0].deviceClassName"),
    (claim_obj("c", config=[{"opaque": {"parameters": {}}}]), "spec.devices.config[0].opaque"),
])
def test_bad_claim_names_object_and_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        claim(obj)
    assert err.value.field_name == field
    assert err.value.obj == "ResourceClaim team-a/c"


def test_bad_allocation_result_names_the_result() -> None:
    obj = claim_obj("c")
    obj["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": NV, "pool": "p"}]}}}
    with pytest.raises(InputError) as err:
        claim(obj)
    assert err.value.field_name == "status.allocation.devices.results[0]"


def test_unnamed_subrequest_names_the_field() -> None:
    with pytest.raises(InputError) as err:
        claim(_claim_with({"name": "alt", "firstAvailable": [{"deviceClassName": "x"}]}))
    assert err.value.field_name == "spec.devices.requests[0].firstAvailable[0].name"


def test_requests_not_a_list_names_the_field() -> None:
    obj = claim_obj("c")
    obj["spec"]["devices"]["requests"] = {"name": "gpu", "exactly": {"deviceClassName": "x"}}
    with pytest.raises(InputError) as err:
        claim(obj)
    assert err.value.field_name.startswith("spec.devices.requests")


# ------------------------------------------------------------------ shapes: a field of the wrong JSON type

def _full_claim() -> dict[str, Any]:
    """A claim with every field `parse.claim` reads, so each can be swapped for a value of the wrong shape."""
    obj = claim_obj("c", requests=[exact("gpu", memory="1Gi", selectors=["true"]),
                                   first_available("alt", exact("a"), exact("b"))],
                    constraints=[{"requests": ["gpu"], "matchAttribute": f"{NV}/uuid"}],
                    config=[{"requests": ["gpu"], "opaque": {"driver": NV, "parameters": {}}}])
    obj["metadata"].update(finalizers=["f"], ownerReferences=[{"kind": "Pod", "uid": "u", "controller": True}])
    obj["status"] = {"reservedFor": [{"uid": "u"}], "allocation": {
        "devices": {"results": [{"request": "gpu", "driver": NV, "pool": "node-a", "device": "gpu-0",
                                 "consumedCapacity": {"memory": "1Gi"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}
    return obj


def _full_slice() -> dict[str, Any]:
    cset, devices = partitionable_gpu(0, "node-a")
    devices.append(whole_gpu(1, "node-a", shares=4))
    devices[-1]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    return resource_slice("node-a", devices, counters=[cset])


_CLAIM_PATHS: list[tuple[Any, ...]] = [
    ("metadata",), ("metadata", "finalizers"), ("metadata", "ownerReferences"), ("metadata", "ownerReferences", 0),
    ("spec",), ("spec", "devices"), ("spec", "devices", "requests"), ("spec", "devices", "requests", 0),
    ("spec", "devices", "requests", 0, "exactly", "capacity"),
    ("spec", "devices", "requests", 0, "exactly", "capacity", "requests"),
    ("spec", "devices", "requests", 0, "exactly", "selectors"),
    ("spec", "devices", "requests", 0, "exactly", "selectors", 0),
    ("spec", "devices", "requests", 0, "exactly", "selectors", 0, "cel"),
    ("spec", "devices", "requests", 1, "firstAvailable"), ("spec", "devices", "requests", 1, "firstAvailable", 0),
    ("spec", "devices", "constraints"), ("spec", "devices", "constraints", 0),
    ("spec", "devices", "constraints", 0, "requests"),
    ("spec", "devices", "config"), ("spec", "devices", "config", 0), ("spec", "devices", "config", 0, "requests"),
    ("status",), ("status", "reservedFor"), ("status", "reservedFor", 0), ("status", "allocation"),
    ("status", "allocation", "devices"), ("status", "allocation", "devices", "results"),
    ("status", "allocation", "devices", "results", 0),
    ("status", "allocation", "devices", "results", 0, "consumedCapacity"),
    ("status", "allocation", "nodeSelector"), ("status", "allocation", "nodeSelector", "nodeSelectorTerms"),
    ("status", "allocation", "nodeSelector", "nodeSelectorTerms", 0),
]
_SLICE_PATHS: list[tuple[Any, ...]] = [
    ("metadata",), ("spec",), ("spec", "pool"), ("spec", "pool", "generation"), ("spec", "pool", "resourceSliceCount"),
    ("spec", "devices"), ("spec", "devices", 0), ("spec", "devices", 0, "attributes"),
    ("spec", "devices", 0, "attributes", "productName"), ("spec", "devices", 0, "capacity"),
    ("spec", "devices", 0, "capacity", "memory"), ("spec", "devices", 0, "consumesCounters"),
    ("spec", "devices", 0, "consumesCounters", 0), ("spec", "devices", 0, "consumesCounters", 0, "counters"),
    ("spec", "devices", 0, "consumesCounters", 0, "counters", "memory"),
    ("spec", "devices", -1, "capacity", "shares", "requestPolicy"),
    ("spec", "devices", -1, "capacity", "shares", "requestPolicy", "validRange"),
    ("spec", "devices", -1, "capacity", "shares", "requestPolicy", "validValues"),
    ("spec", "devices", -1, "taints"), ("spec", "devices", -1, "taints", 0),
    ("spec", "sharedCounters"), ("spec", "sharedCounters", 0), ("spec", "sharedCounters", 0, "counters"),
    ("spec", "sharedCounters", 0, "counters", "memory"),
]
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                     max_leaves=4)


def _replaced(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))  # not deepcopy: the fixtures share sub-dicts, one swap must hit one field
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def test_the_full_objects_parse() -> None:
    got = claim(_full_claim())
    assert [r.name for r in got.requests] == ["gpu", "alt"] and got.allocation is not None
    assert got.allocation.node == "node-a" and got.finalizers == ("f",) and got.owner_pod_uid == "u"
    assert len(slice_devices(_full_slice())[5]) > 2


@given(path=st.sampled_from(_CLAIM_PATHS), value=_JSON)
def test_any_claim_field_of_any_shape_parses_or_is_an_input_error(path: tuple[Any, ...], value: Any) -> None:
    try:
        claim(_replaced(_full_claim(), path, value))
    except InputError as err:
        assert err.obj == ("ResourceClaim team-a/c" if path != ("metadata",) else "ResourceClaim ?")


@given(path=st.sampled_from(_SLICE_PATHS), value=_JSON)
def test_any_slice_field_of_any_shape_parses_or_is_a_problem(path: tuple[Any, ...], value: Any) -> None:
    got = gather_pools([_replaced(_full_slice(), path, value)])
    assert len(got.problems) + len(got.pools) + len(got.incomplete) == 1


@pytest.mark.parametrize("path, value, field", [
    (("spec", "devices", "requests"), "gpu", "spec.devices.requests"),
    (("spec", "devices", "requests", 0), "gpu", "spec.devices.requests[0]"),
    (("spec", "devices", "constraints"), {"requests": ["gpu"]}, "spec.devices.constraints"),
    (("spec", "devices", "constraints", 0, "requests"), "gpu", "spec.devices.constraints[0].requests"),
    (("spec", "devices", "constraints", 0, "matchAttribute"), ["uuid"], "spec.devices.constraints[0].matchAttribute"),
    (("spec", "devices", "config"), {"opaque": {}}, "spec.devices.config"),
    (("spec", "devices", "requests", 1, "firstAvailable"), {"name": "a"}, "spec.devices.requests[1].firstAvailable"),
    (("spec", "devices", "requests", 0, "exactly", "capacity", "requests"), ["1Gi"],
     "spec.devices.requests[0].exactly.capacity.requests"),
    (("status", "allocation", "devices", "results"), {"request": "gpu"}, "status.allocation.devices.results"),
    (("status", "allocation", "devices", "results", 0, "consumedCapacity"), "1Gi",
     "status.allocation.devices.results[0].consumedCapacity"),
    (("metadata", "finalizers"), "f", "metadata.finalizers"),
])
def test_claim_field_of_the_wrong_shape_names_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    with pytest.raises(InputError) as err:
        claim(_replaced(_full_claim(), path, value))
    assert err.value.field_name == field


@pytest.mark.parametrize("path, value, field", [
    (("spec", "devices"), {"name": "gpu-0"}, "spec.devices"),
    (("spec", "devices", 0), "gpu-0", "spec.devices[0]"),
    (("spec", "devices", 0, "attributes"), ["productName"], "spec.devices[0].attributes"),
    (("spec", "devices", 0, "capacity"), ["memory"], "spec.devices[0].capacity"),
    (("spec", "devices", 0, "capacity", "memory"), "80Gi", "spec.devices[0].capacity[memory]"),
    (("spec", "devices", 0, "consumesCounters"), {"counterSet": "x"}, "spec.devices[0].consumesCounters"),
    (("spec", "devices", 0, "consumesCounters", 0, "counters"), ["memory"],
     "spec.devices[0].consumesCounters[0].counters"),
    (("spec", "sharedCounters"), {"name": "x"}, "spec.sharedCounters"),
    (("spec", "sharedCounters", 0, "counters", "memory"), "1", "spec.sharedCounters[0].counters[memory]"),
    (("spec", "pool", "resourceSliceCount"), "two", "spec.pool.resourceSliceCount"),
    (("spec", "pool", "resourceSliceCount"), 0, "spec.pool.resourceSliceCount"),
    (("spec", "pool", "generation"), -1, "spec.pool.generation"),
    (("spec", "pool", "generation"), True, "spec.pool.generation"),
])
def test_slice_field_of_the_wrong_shape_names_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    with pytest.raises(InputError) as err:
        slice_devices(_replaced(_full_slice(), path, value))
    assert err.value.field_name == field
