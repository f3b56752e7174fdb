"""The DRA allocator's scenarios (packing.dra.allocate, packing.dra.results; dra.md §4–§6, §10): least VRAM
stranded, firstAvailable in order, constraints, allocationMode All, unknown classes, CEL selectors, a pod's
claims on one node, a pod bound to a node by an allocated claim."""

from __future__ import annotations

from dataclasses import replace

from dra_objects import (
    A100,
    H100,
    NV,
    GpuSpec,
    claim_obj,
    exact,
    first_available,
    node_slices,
    pod,
    resource_slice,
    whole_gpu,
    world,
)
from fakes.dra_schema import validate_object

from packing.dra.allocate import PodAllocation, Unallocated
from packing.dra.results import allocation_json
from packing.model import Isolation

H100_SEL = f"device.attributes['{NV}'].productName == '{H100}'"


def picked(result: PodAllocation | Unallocated) -> list[tuple[str, str, str]]:
    """(request, node, device) of every pick."""
    assert isinstance(result, PodAllocation), result
    return [(p.request, cp.node, p.fit.device.id.device) for cp in result.claims for p in cp.picks]


def node_a() -> list[dict]:
    """dra.md §10 (a): gpu-0 an exclusive H100, gpu-1 an A100 shared by memory."""
    return [resource_slice("node-a", [whole_gpu(0, "node-a", H100, 81559),
                                      whole_gpu(1, "node-a", A100, 81920, shares="memory")])]


def test_14gi_claim_lands_on_the_shared_a100_not_the_exclusive_h100() -> None:
    w = world(node_a())
    obj = claim_obj("chat-14gi", requests=[exact("gpu", memory="14Gi")])
    got = w.allocator.allocate(pod("team-a/chat-0", obj))
    assert picked(got) == [("gpu", "node-a", "gpu-1")]
    assert isinstance(got, PodAllocation)
    alloc = allocation_json(got.claims[0], w.classes, lambda: "5f0c2a9e-3d41-4b8a-9e67-1c2d3e4f5a6b")
    assert alloc == {"devices": {"results": [{
        "request": "gpu", "driver": NV, "pool": "node-a", "device": "gpu-1",
        "shareID": "5f0c2a9e-3d41-4b8a-9e67-1c2d3e4f5a6b", "consumedCapacity": {"memory": "14Gi"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}
    validate_object({**obj, "status": {"allocation": alloc}})
    # a second tenant may not join the shared A100: it gets the H100 whole
    other = w.allocator.allocate(pod("team-b/p", claim_obj("c", "team-b", [exact("gpu", memory="14Gi")]),
                                     tenant="team-b"))
    assert picked(other) == [("gpu", "node-a", "gpu-0")]
    assert isinstance(other, PodAllocation) and other.claims[0].picks[0].fit.consumed is None


def test_hardware_isolation_never_takes_a_share() -> None:
    w = world(node_a())
    got = w.allocator.allocate(pod("team-a/p", claim_obj("c", requests=[exact("gpu", memory="14Gi")]),
                                   isolation=Isolation.HARDWARE))
    assert picked(got) == [("gpu", "node-a", "gpu-0")]


def test_first_available_alternatives_in_order() -> None:
    w = world(node_a())
    req = first_available("gpu", exact("h100", selectors=[H100_SEL]), exact("any", memory="10Gi"))
    assert picked(w.allocator.allocate(pod("team-a/p1", claim_obj("c1", requests=[req])))) == \
        [("gpu/h100", "node-a", "gpu-0")]
    # the H100 is taken now: the second alternative
    assert picked(w.allocator.allocate(pod("team-a/p2", claim_obj("c2", requests=[req])))) == \
        [("gpu/any", "node-a", "gpu-1")]


def test_first_available_result_and_config_are_schema_valid() -> None:
    w = world(node_a(), classes=[
        {"metadata": {"name": "gpu.nvidia.com"}, "spec": {
            "selectors": [{"cel": {"expression": f"device.attributes['{NV}'].type == 'gpu'"}}],
            "config": [{"opaque": {"driver": NV, "parameters": {"kind": "GpuConfig"}}}]}}])
    obj = claim_obj("c", requests=[first_available("gpu", exact("big", memory="90Gi"), exact("small", memory="1Gi"))],
                    config=[{"requests": ["gpu"], "opaque": {"driver": NV, "parameters": {"x": 1}}}])
    got = w.allocator.allocate(pod("team-a/p", obj))
    assert isinstance(got, PodAllocation)
    alloc = allocation_json(got.claims[0], w.classes)
    assert alloc["devices"]["results"][0]["request"] == "gpu/small"
    assert [c["source"] for c in alloc["devices"]["config"]] == ["FromClass", "FromClaim"]
    validate_object({**obj, "status": {"allocation": alloc}})


def three_gpus() -> list[dict]:
    return [resource_slice("n", [whole_gpu(0, "n", A100, 81920), whole_gpu(1, "n", H100, 81559),
                                 whole_gpu(2, "n", H100, 81559)])]


def test_match_attribute_within_one_request() -> None:
    w = world([resource_slice("n", [whole_gpu(0, "n", H100, 81559), whole_gpu(1, "n", H100, 81559),
                                    whole_gpu(2, "n", A100, 81920)])])
    obj = claim_obj("c", requests=[exact("gpu", count=2)],
                    constraints=[{"matchAttribute": f"{NV}/productName"}])
    assert sorted(d for _r, _n, d in picked(w.allocator.allocate(pod("team-a/p", obj)))) == ["gpu-0", "gpu-1"]


def test_match_attribute_across_requests_needs_search_not_greedy() -> None:
    # a: any GPU, b: an H100, same productName. Greedy takes gpu-0 (the A100) for `a` and then finds no
    # A100 for `b`; kube-scheduler's allocator backtracks and gives both H100s.
    w = world(three_gpus())
    obj = claim_obj("c", requests=[exact("a"), exact("b", selectors=[H100_SEL])],
                    constraints=[{"requests": ["a", "b"], "matchAttribute": f"{NV}/productName"}])
    got = w.allocator.allocate(pod("team-a/p", obj))
    assert sorted(d for _r, _n, d in picked(got)) == ["gpu-1", "gpu-2"]


def test_match_attribute_within_a_count_needs_search_not_greedy() -> None:
    w = world(three_gpus())
    obj = claim_obj("c", requests=[exact("gpu", count=2)], constraints=[{"matchAttribute": f"{NV}/productName"}])
    got = w.allocator.allocate(pod("team-a/p", obj))
    assert sorted(d for _r, _n, d in picked(got)) == ["gpu-1", "gpu-2"]


def test_constraint_naming_a_subrequest_applies_to_it() -> None:
    # constraints may name `<request>/<subrequest>` (resource/v1 DeviceConstraint.requests)
    w = world(three_gpus())
    obj = claim_obj("c", requests=[first_available("a", exact("h", selectors=[H100_SEL])), exact("b")],
                    constraints=[{"requests": ["a/h", "b"], "matchAttribute": f"{NV}/productName"}])
    got = picked(w.allocator.allocate(pod("team-a/p", obj)))
    assert sorted(d for _r, _n, d in got) == ["gpu-1", "gpu-2"]


def test_distinct_attribute_keeps_requests_off_one_device() -> None:
    w = world([resource_slice("n", [whole_gpu(0, "n", shares="memory"), whole_gpu(1, "n", shares="memory")])])
    same = claim_obj("c1", requests=[exact("a", memory="10Gi"), exact("b", memory="10Gi")])
    assert len({d for _r, _n, d in picked(w.allocator.allocate(pod("team-a/p1", same)))}) == 1
    distinct = claim_obj("c2", requests=[exact("a", memory="10Gi"), exact("b", memory="10Gi")],
                         constraints=[{"distinctAttribute": f"{NV}/uuid"}])
    assert len({d for _r, _n, d in picked(w.allocator.allocate(pod("team-a/p2", distinct)))}) == 2


def test_allocation_mode_all_takes_every_matching_device() -> None:
    spec = [GpuSpec("mig", layout=("3g.40gb@0", "2g.20gb@4", "1g.10gb@6")), GpuSpec("whole")]
    w = world(node_slices("n", spec))
    obj = claim_obj("c", requests=[exact("migs", cls="mig.nvidia.com", all_devices=True)])
    # Several MIG instances in one pod only when each process picks its own (the core's hardware truths).
    refused = w.allocator.allocate(pod("team-a/p", obj))
    assert isinstance(refused, Unallocated) and "gpu-per-process" in refused.reason
    got = w.allocator.allocate(replace(pod("team-a/p", obj), gpu_per_process=True))
    assert sorted(d for _r, _n, d in picked(got)) == ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-14-4",
                                                      "gpu-0-mig-3g40gb-9-0"]
    # one of them taken: All cannot be satisfied any more
    w2 = world(node_slices("n", spec))
    assert isinstance(w2.allocator.allocate(pod("team-a/q", claim_obj("d", requests=[
        exact("one", cls="mig.nvidia.com", memory="5Gi")]))), PodAllocation)
    assert isinstance(w2.allocator.allocate(replace(pod("team-a/p", obj), gpu_per_process=True)), Unallocated)


def test_unknown_device_class_is_unallocated_with_a_reason() -> None:
    w = world(node_a())
    got = w.allocator.allocate(pod("team-a/p", claim_obj("c", requests=[exact("gpu", cls="tpu.example.com")])))
    assert isinstance(got, Unallocated) and "tpu.example.com" in got.reason and "does not exist" in got.reason
    assert w.state.holders() == []


def test_cel_selector_on_product_name() -> None:
    w = world(node_a())
    got = w.allocator.allocate(pod("team-a/p", claim_obj("c", requests=[exact("gpu", selectors=[
        f"device.attributes['{NV}'].productName == '{A100}'"])])))
    assert picked(got) == [("gpu", "node-a", "gpu-1")]
    none = w.allocator.allocate(pod("team-a/q", claim_obj("d", requests=[exact("gpu", selectors=[
        f"device.attributes['{NV}'].productName == 'NVIDIA B200'"])])))
    assert isinstance(none, Unallocated) and "no device" in none.reason


def two_nodes() -> list[dict]:
    return (node_slices("node-a", [GpuSpec("shared")])
            + node_slices("node-b", [GpuSpec("whole", H100), GpuSpec("mig", layout=("3g.40gb@0", "3g.40gb@4"))]))


def test_pod_claims_share_one_node() -> None:
    w = world(two_nodes())
    c1 = claim_obj("c1", requests=[exact("gpu", memory="1Gi")])
    c2 = claim_obj("c2", requests=[exact("mig", cls="mig.nvidia.com", memory="20Gi")])
    # One process cannot use a whole GPU and a MIG instance together: the claims must be two containers'.
    mixed = w.allocator.allocate(pod("team-a/p", c1, c2))
    assert isinstance(mixed, Unallocated) and "one kind" in mixed.reason
    apart = (frozenset({"team-a/c1"}), frozenset({"team-a/c2"}))
    got = w.allocator.allocate(replace(pod("team-a/p", c1, c2), containers=apart))
    assert {n for _r, n, _d in picked(got)} == {"node-b"}
    assert isinstance(got, PodAllocation) and got.node == "node-b"


def test_pod_bound_to_a_node_by_an_allocated_claim() -> None:
    w = world(two_nodes())
    c = claim_obj("c", requests=[exact("gpu", memory="1Gi")])
    assert {n for _r, n, _d in picked(w.allocator.allocate(pod("team-a/free", c)))} == {"node-a"}
    bound = w.allocator.allocate(pod("team-a/p", claim_obj("d", requests=[exact("gpu", memory="1Gi")]),
                                     node="node-b"))
    assert picked(bound) == [("gpu", "node-b", "gpu-0")]
    only_a = world(node_slices("node-a", [GpuSpec("whole")]) + node_slices("node-b", [GpuSpec("mig", layout=(
        "7g.80gb@0",))]))
    stuck = only_a.allocator.allocate(pod("team-a/q", claim_obj("e", requests=[exact("gpu")]), node="node-b"))
    assert isinstance(stuck, Unallocated) and "node-b" in stuck.reason


def test_release_claim_frees_its_devices() -> None:
    w = world(node_a())
    got = w.allocator.allocate(pod("team-a/p", claim_obj("c", requests=[exact("gpu", memory="80Gi")])))
    assert picked(got)
    w.allocator.release_claim("team-a/c")
    assert w.state.holders() == []
    assert all(v == 0 for used in w.allocator.ledger.used.values() for v in used.values())
