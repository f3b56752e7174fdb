"""The node agent's GPU readers, one per vendor: the vendor's name picks the reader (`--vendor`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nodeagent.cli import FlagError, _configure, build_agent
from nodeagent.inventory import READERS, NvmlInventory, reader_for
from nodeagent.nvml import NvmlReader
from packing.vendors import DEFAULT_VENDOR, VENDORS


def test_every_reader_is_a_registered_vendors() -> None:
    """A reader under a name no vendor has would never be matched to the labels the inventory reads."""
    assert set(READERS) <= {v.name for v in VENDORS}


def test_no_vendor_named_reads_through_the_default_vendors_reader() -> None:
    assert DEFAULT_VENDOR.name in READERS
    assert isinstance(reader_for(None), NvmlReader)
    assert isinstance(reader_for(DEFAULT_VENDOR.name), NvmlReader)


def test_a_vendor_without_a_reader_is_refused_naming_it_and_the_readers() -> None:
    with pytest.raises(ValueError, match=r"'acme'.*nvidia"):
        reader_for("acme")


def test_the_inventory_reads_through_the_reader_the_vendor_chose() -> None:
    from nodeagent.config import AgentConfig

    inventory = NvmlInventory(AgentConfig(), "n1", reader=reader_for("nvidia"))
    assert isinstance(inventory._reader, NvmlReader)


def test_an_unknown_vendor_flag_is_a_bad_flag(tmp_path: Path) -> None:
    (tmp_path / "dp").mkdir()
    args = _configure(argparse.ArgumentParser()).parse_args([
        "--node-name", "n1", "--in-cluster", "--allow-unsigned-assignments", "--vendor", "acme",
        "--device-plugin-dir", str(tmp_path / "dp"), "--state-dir", str(tmp_path / "state"),
        "--pod-resources-socket", ""])
    with pytest.raises(FlagError, match=r"^--vendor: no GPU reader for vendor 'acme'"):
        build_agent(args)
