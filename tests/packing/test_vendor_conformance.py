"""The conformance suite every GPU vendor (`packing.vendors.VENDORS`) passes, as every sharing mode and every
policy pass theirs: a new vendor module is picked up here by its registry line alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.catalog import load_catalog
from packing.vendors import UNIT_GPU, UNIT_MIG_PREFIX, VENDORS, Vendor, plugin_unit, product_model, vendor_for

CATALOG = load_catalog()
by_vendor = pytest.mark.parametrize("vendor", VENDORS, ids=lambda v: v.name)
# Resources no device plugin hands out: vramfit's own, and a pod's CPU and memory.
NOT_GPUS = ("cpu", "memory", "ephemeral-storage", "vramfit.io/gpu", "vramfit.io/vram", "pods")


def test_vendors_have_one_name_each() -> None:
    """Two vendors under one name would make a node's vendor depend on the registry's order."""
    names = [v.name for v in VENDORS]
    assert len(names) == len(set(names)) and all(names)


@by_vendor
def test_a_node_without_labels_is_no_vendors(vendor: Vendor) -> None:
    """A CPU-only node (no discovery labels) must not be read as a GPU node of any vendor."""
    assert not vendor.discovers({})
    assert vendor_for({}) is None


@by_vendor
@pytest.mark.parametrize("resource", NOT_GPUS)
def test_no_vendor_counts_a_non_gpu_resource_as_a_gpu(vendor: Vendor, resource: str) -> None:
    """A pod's CPU or vramfit's own resources booked as device plugin GPUs would strand real GPUs."""
    assert vendor.plugin_names.unit(resource) is None
    assert plugin_unit(resource) is None


@by_vendor
@given(resource=st.text(min_size=1, max_size=40))
def test_a_plugin_unit_is_a_gpu_or_a_mig_profile(vendor: Vendor, resource: str) -> None:
    """The snapshot reads units only as a whole GPU or `mig-<profile>`: any other word would be dropped."""
    unit = vendor.plugin_names.unit(resource)
    assert unit is None or unit == UNIT_GPU or (unit.startswith(UNIT_MIG_PREFIX) and len(unit) > len(UNIT_MIG_PREFIX))


@by_vendor
def test_client_limit_is_a_positive_count(vendor: Vendor) -> None:
    """A daemon-shared GPU with no client room would refuse every pod; an unknown model still gets a limit."""
    assert vendor.client_limit(None) > 0
    assert all(vendor.client_limit(m) > 0 for m in CATALOG.models.values())


def test_every_catalog_product_resolves_to_its_model() -> None:
    """A catalog product no vendor reads back to its model would make its nodes' GPUs unknown (no capacity)."""
    wrong = [(p, m.name) for m in CATALOG.models.values() for p in m.products
             if (found := product_model(CATALOG, p)) is None or found.name != m.name]
    assert wrong == []


@by_vendor
def test_a_product_is_among_its_own_forms(vendor: Vendor) -> None:
    """The model filter matches a pod's allowed products against a GPU's forms: its own spelling must be one."""
    for m in CATALOG.models.values():
        for p in m.products:
            assert p.lower() in {f.lower() for f in vendor.product_forms(p)}
