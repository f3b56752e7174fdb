"""NVIDIA's DRA driver read into core GPUs (packing.dra.nodes, packing.vendors.nvidia.dra; dra.md §7, §10):
whole GPUs, consumable shares, static MIG, partitionable GPUs, vfio devices left out, naming and order."""

from __future__ import annotations

import random

import pytest
from dra_objects import (
    A100,
    H100,
    NV,
    T4,
    GpuSpec,
    catalog,
    node_slices,
    partitionable_gpu,
    resource_slice,
    static_layout,
    static_mig,
    uuid_of,
    whole_gpu,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.dra.driver_base import UnitRef
from packing.dra.nodes import DEFAULT_CLASSES, DRA_DRIVERS, dra_inventory, with_host
from packing.dra.objects import DeviceId
from packing.model import Mode, Node
from packing.modes.mig_dynamic import MEDIA_SUFFIX, placements_for


def dev(node: str, name: str) -> DeviceId:
    return DeviceId(NV, node, name)


def test_registry_and_default_classes() -> None:
    assert set(DRA_DRIVERS) == {NV}
    assert DEFAULT_CLASSES == ("gpu.nvidia.com", "mig.nvidia.com")


def test_whole_gpu_is_exclusive() -> None:
    inv = dra_inventory([resource_slice("node-a", [whole_gpu(0, "node-a", H100, 81559)])], catalog())
    dn = inv.nodes["node-a"]
    (gpu,) = dn.node.gpus
    assert (gpu.index, gpu.mode, gpu.memory_mib, gpu.model) == (0, Mode.EXCLUSIVE, 81559, "H100-80GB")
    assert gpu.product == H100 and gpu.uuid == uuid_of("node-a", 0)
    assert dn.units == {dev("node-a", "gpu-0"): UnitRef(0)}
    assert inv.node_of(dev("node-a", "gpu-0")) == "node-a"


@pytest.mark.parametrize("shares, replicas", [("memory", None), ("unlimited", None), (4, 4)])
def test_consumable_shares_gpu_is_shared_by_memory(shares: str | int, replicas: int | None) -> None:
    inv = dra_inventory([resource_slice("node-a", [whole_gpu(0, "node-a", shares=shares)])], catalog())
    (gpu,) = inv.nodes["node-a"].node.gpus
    assert gpu.mode == Mode.TIMESLICE and gpu.memory_mib == 81920 and gpu.replicas == replicas
    assert inv.nodes["node-a"].units == {dev("node-a", "gpu-0"): UnitRef(0)}


def test_static_mig_gpu_reads_profiles_and_memory_slices() -> None:
    layout = static_layout(A100, ["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"])
    devices = [static_mig(0, "node-mig", i) for i in layout]
    assert [d["name"] for d in devices] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-2g20gb-14-4",
                                            "gpu-0-mig-1g10gb-19-6"]
    inv = dra_inventory([resource_slice("node-mig", devices)], catalog())
    (gpu,) = inv.nodes["node-mig"].node.gpus
    assert gpu.mode == Mode.MIG and gpu.model == "A100-80GB" and gpu.uuid == uuid_of("node-mig", 0)
    got = [(i.ref, i.memory_slices, i.compute_slices, i.memory_mib) for i in gpu.mig]
    assert got == [("3g.40gb@0", 4, 3, 40192), ("2g.20gb@4", 2, 2, 19968), ("1g.10gb@6", 1, 1, 9728)]
    assert inv.nodes["node-mig"].units[dev("node-mig", "gpu-0-mig-2g20gb-14-4")] == UnitRef(0, mig="2g.20gb@4")


def test_static_mig_placement_comes_from_memory_slices_not_the_name() -> None:
    (inst,) = static_layout(A100, ["1g.10gb@6"])
    d = static_mig(0, "n", inst)
    d["name"] = "gpu-0-mig-1g10gb-19-2"  # a name that disagrees: the capacities say where it is
    (gpu,) = dra_inventory([resource_slice("n", [d])], catalog()).nodes["n"].node.gpus
    assert [i.ref for i in gpu.mig] == ["1g.10gb@6"]


def test_partitionable_gpu_is_dynamic_mig() -> None:
    slices = node_slices("node-p", [GpuSpec("partitionable")])
    inv = dra_inventory(slices, catalog())
    dn = inv.nodes["node-p"]
    (gpu,) = dn.node.gpus
    assert gpu.mode == Mode.MIG_DYNAMIC and gpu.memory_mib == 81920
    expected = [i for i in placements_for(catalog().models["A100-80GB"]) if not i.profile.endswith(MEDIA_SUFFIX)]
    assert {(i.ref, i.memory_slices, i.memory_mib) for i in gpu.mig} == \
        {(i.ref, i.memory_slices, i.memory_mib) for i in expected}
    assert dn.units[dev("node-p", "gpu-0")] == UnitRef(0, whole=True)
    assert dn.units[dev("node-p", "gpu-0-mig-3g40gb-9-4")] == UnitRef(0, mig="3g.40gb@4")
    assert len(dn.units) == len(expected) + 1


def test_partitionable_gpu_without_whole_device() -> None:
    cset, devs = partitionable_gpu(0, "n", with_whole=False)
    inv = dra_inventory([resource_slice("n", devs, counters=[cset])], catalog())
    (gpu,) = inv.nodes["n"].node.gpus
    assert gpu.mode == Mode.MIG_DYNAMIC and gpu.memory_mib == 81920  # from the catalog model
    assert all(u.mig is not None for u in inv.nodes["n"].units.values())


def test_vfio_devices_are_not_gpu_units() -> None:
    vfio = whole_gpu(1, "node-a")
    vfio["name"] = "gpu-vfio-1"
    vfio["attributes"]["type"] = {"string": "vfio"}
    inv = dra_inventory([resource_slice("node-a", [whole_gpu(0, "node-a"), vfio])], catalog())
    assert len(inv.nodes["node-a"].node.gpus) == 1
    assert dev("node-a", "gpu-vfio-1") not in inv.nodes["node-a"].units
    assert dev("node-a", "gpu-vfio-1") in inv.devices  # still a device of the pool


def test_node_of_only_vfio_has_no_dra_node() -> None:
    vfio = whole_gpu(0, "node-v")
    vfio["attributes"]["type"] = {"string": "vfio"}
    inv = dra_inventory([resource_slice("node-v", [vfio])], catalog())
    assert inv.nodes == {}


def test_gpus_are_indexed_by_minor_number_not_by_name() -> None:
    devices = [whole_gpu(m, "n", T4, 15360) for m in (10, 2, 1)]
    inv = dra_inventory([resource_slice("n", devices)], catalog())
    dn = inv.nodes["n"]
    assert [dn.units[dev("n", f"gpu-{m}")].gpu for m in (1, 2, 10)] == [0, 1, 2]
    assert [g.uuid for g in dn.node.gpus] == [uuid_of("n", m) for m in (1, 2, 10)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_static_path_device_order_does_not_matter(seed: int) -> None:
    # The driver's static path publishes devices in Go map order (dra.md §7): any order reads the same.
    devices = [whole_gpu(0, "n", H100, 81559), whole_gpu(1, "n", shares=2)]
    devices += [static_mig(2, "n", i) for i in static_layout(A100, ["4g.40gb@0", "2g.20gb@4", "1g.10gb@6"])]
    base = dra_inventory([resource_slice("n", devices)], catalog()).nodes["n"]
    random.Random(seed).shuffle(devices)
    shuffled = dra_inventory([resource_slice("n", devices)], catalog()).nodes["n"]
    assert shuffled.node == base.node and shuffled.units == base.units


def test_mixed_node_and_two_nodes() -> None:
    spec = [GpuSpec("whole", H100), GpuSpec("shared", shares=3), GpuSpec("mig", layout=("7g.80gb@0",)),
            GpuSpec("partitionable")]
    inv = dra_inventory(node_slices("a", spec) + node_slices("b", spec[:1]), catalog())
    assert sorted(inv.nodes) == ["a", "b"]
    assert [g.mode for g in inv.nodes["a"].node.gpus] == [Mode.EXCLUSIVE, Mode.TIMESLICE, Mode.MIG,
                                                          Mode.MIG_DYNAMIC]
    assert [g.index for g in inv.nodes["a"].node.gpus] == [0, 1, 2, 3]
    assert all(d.pool == "a" for d in inv.nodes["a"].units)
    assert [g.mode for g in inv.nodes["b"].node.gpus] == [Mode.EXCLUSIVE]


def test_pool_not_node_local_is_a_problem() -> None:
    obj = resource_slice("n", [whole_gpu(0, "n")])
    del obj["spec"]["nodeName"]
    obj["spec"]["allNodes"] = True
    inv = dra_inventory([obj], catalog())
    assert inv.nodes == {} and any("not node-local" in p for p in inv.problems)


def test_gpu_without_memory_is_a_problem_not_a_crash() -> None:
    d = whole_gpu(0, "n")
    d["capacity"] = {}
    inv = dra_inventory([resource_slice("n", [d, whole_gpu(1, "n")])], catalog())
    assert len(inv.nodes["n"].node.gpus) == 1
    assert any("no memory capacity" in p for p in inv.problems)


def test_two_whole_devices_of_one_uuid_are_a_problem() -> None:
    a, b = whole_gpu(0, "n"), whole_gpu(1, "n")
    b["attributes"]["uuid"] = a["attributes"]["uuid"]
    inv = dra_inventory([resource_slice("n", [a, b])], catalog())
    assert "n" not in inv.nodes and any("share one UUID" in p for p in inv.problems)


def test_with_host_keeps_dra_gpus() -> None:
    inv = dra_inventory([resource_slice("n", [whole_gpu(0, "n")])], catalog())
    dra = inv.nodes["n"].node
    host = Node("n", (), cpu_milli=8000, memory_mib=64000, labels={"zone": "z"})
    merged = with_host(dra, host)
    assert merged.gpus == dra.gpus and merged.cpu_milli == 8000 and merged.labels == {"zone": "z"}
    assert with_host(dra, None) is dra
