"""The conformance suite every DRA driver reading (`packing.dra.nodes.DRA_DRIVERS`) passes, as the vendor and mode
suites do for theirs. A new driver adds its example slices to `EXAMPLES` (a driver without them fails here), and
each check is named for the bug it prevents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from dra_objects import GpuSpec, catalog, node_slices
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.dra.nodes import DRA_DRIVERS, DraNode, dra_inventory
from packing.model import Assignment, GpuGrant, Isolation, PodDemand
from packing.modes import mode_rules
from packing.state import ClusterState

_KINDS = st.sampled_from(["whole", "shared", "mig", "partitionable"])


def _nvidia(kinds: list[str]) -> list[dict[str, Any]]:
    gpus = [GpuSpec(k, layout=("3g.40gb@0", "2g.20gb@4", "1g.10gb@6") if k == "mig" else ()) for k in kinds]
    return node_slices("node-0", gpus)


# driver name -> example slices of one node holding GPUs of the drawn kinds
EXAMPLES: dict[str, Callable[[list[str]], list[dict[str, Any]]]] = {"gpu.nvidia.com": _nvidia}


def _node(driver: str, kinds: list[str]) -> DraNode:
    inv = dra_inventory(EXAMPLES[driver](kinds), catalog())
    assert inv.problems == () and inv.incomplete == ()
    return inv.nodes["node-0"]


def test_every_registered_driver_has_examples() -> None:
    # prevents: a driver registered without the examples this suite runs it on (so never checked)
    assert set(DRA_DRIVERS) <= set(EXAMPLES), f"add example slices for {set(DRA_DRIVERS) - set(EXAMPLES)}"


@pytest.mark.parametrize("driver", sorted(DRA_DRIVERS))
@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(_KINDS, min_size=1, max_size=4))
def test_units_name_the_gpus_and_instances_the_node_has(driver: str, kinds: list[str]) -> None:
    # prevents: a device mapped to a GPU index or MIG instance the core node does not have (a grant nobody can book)
    dnode = _node(driver, kinds)
    gpus = {g.index: g for g in dnode.node.gpus}
    assert sorted(gpus) == list(range(len(kinds)))
    for dev, unit in dnode.units.items():
        assert dev in dnode.devices
        gpu = gpus[unit.gpu]
        if unit.mig is not None:
            assert gpu.instance(unit.mig) is not None
        # an instance or a whole partitionable GPU on an instanced mode; a plain device on a GPU that is not
        assert (unit.mig is not None or unit.whole) == mode_rules(gpu.mode).instanced


@pytest.mark.parametrize("driver", sorted(DRA_DRIVERS))
@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(_KINDS, min_size=1, max_size=4))
def test_every_unit_is_bookable_once_on_an_empty_node(driver: str, kinds: list[str]) -> None:
    # prevents: a device the allocator may pick whose grant the core's books refuse, or book twice
    dnode = _node(driver, kinds)
    for dev, unit in dnode.units.items():
        state = ClusterState([dnode.node])
        gpu = dnode.node.gpus[unit.gpu]
        inst = gpu.instance(unit.mig) if unit.mig else None
        shared = dnode.devices[dev].allow_multiple
        vram = 1024 if shared else inst.memory_mib if inst is not None else gpu.memory_mib
        grant = GpuGrant(unit.gpu, vram, unit.mig, unit.whole)
        state.allocate(PodDemand(key="a/p", vram_mib=vram, tenant="a"), Assignment("node-0", (grant,)))
        second = PodDemand(key="a/q", vram_mib=vram, tenant="a", isolation=Isolation.NONE)
        gu = state.usage("node-0").gpus[unit.gpu]
        # a shared device takes a second claim of its tenant; any other device is taken once
        assert (state.grant_problem(second, gu, grant) is None) == shared
