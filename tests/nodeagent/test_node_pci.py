"""A GPU's PCI bus id: read from NVML (`nvmlDeviceGetPciInfo`), accepted in `vramfit.io/gpus`, and what orders a
container's CUDA devices in Allocate's answer when published."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from fakes.pynvml_fake import NVML_ERROR_NOT_SUPPORTED, FakeGpu, FakeNvml, NVMLError
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.allocate import AnswerSettings, PodInAdmission, answer_for, node_units
from nodeagent.inventory import InventoryError, validate_annotation
from nodeagent.nvml import pci_bus_id
from packing.catalog import default_catalog
from packing.k8s.inventory import GPUS_ANNOTATION, node_from_k8s
from packing.model import GpuGrant, InputError


class PciNvml(FakeNvml):
    """The stand-in with `nvmlDeviceGetPciInfo`: each GPU's busId as NVML spells it, or an error code."""

    def __init__(self, gpus: list[FakeGpu], bus_ids: list[str | bytes | int]) -> None:
        super().__init__(gpus)
        self.bus_ids = bus_ids

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:  # noqa: N802 - NVML's name
        self._call("nvmlDeviceGetPciInfo")
        bus = self.bus_ids[handle.gpu]
        if isinstance(bus, int):
            raise NVMLError(bus)
        return SimpleNamespace(busId=bus, domain=0, bus=0, device=0)


def t4(n: int) -> FakeGpu:
    return FakeGpu(name="Tesla T4", uuid=f"GPU-t4-{n}", memory_mib=15360, compute_capability=(7, 5))


def bus_ids(nvml: FakeNvml) -> list[str | None]:
    nvml.nvmlInit()
    try:
        return [pci_bus_id(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


def test_nvml_bus_ids_are_read_in_one_form_and_a_failure_is_none() -> None:
    nvml = PciNvml([t4(0), t4(1), t4(2), t4(3)],
                   ["00000000:3B:00.0", b"0000:AF:00.0", NVML_ERROR_NOT_SUPPORTED, "garbage"])
    # Domain widened to eight digits, lower case: ids of one node sort as text in bus order.
    assert bus_ids(nvml) == ["00000000:3b:00.0", "00000000:af:00.0", None, None]


def test_an_nvml_without_pci_info_reads_no_bus_id() -> None:
    assert bus_ids(FakeNvml([t4(0)])) == [None]


def gpus_annotation(**extra: Any) -> list[dict[str, Any]]:
    return [{"index": 0, "uuid": "GPU-t4-0", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice",
             "replicas": 4, **extra}]


def test_the_annotation_accepts_a_bus_id_and_the_agent_validates_it() -> None:
    value = gpus_annotation(pci_bus_id="00000000:3b:00.0")
    node = node_from_k8s({"metadata": {"name": "n1", "annotations": {GPUS_ANNOTATION: json.dumps(value)}}},
                         default_catalog())
    assert [g.uuid for g in node.gpus] == ["GPU-t4-0"]
    assert validate_annotation(value, "gpus.json") == []


@pytest.mark.parametrize("bad", ["3b:00.0", "00000000:3b:00", 7, ""])
def test_a_malformed_bus_id_is_refused_by_field(bad: Any) -> None:
    value = gpus_annotation(pci_bus_id=bad)
    with pytest.raises(InputError, match=r"\[0\]\.pci_bus_id"):
        node_from_k8s({"metadata": {"name": "n1", "annotations": {GPUS_ANNOTATION: json.dumps(value)}}},
                      default_catalog())
    with pytest.raises(InventoryError, match="pci_bus_id"):
        validate_annotation(value, "gpus.json")


@given(st.permutations(range(4)))
def test_published_bus_ids_order_the_visible_devices_whatever_the_index(order: list[int]) -> None:
    # GPU i sits on bus order[i]: NVML's index is no longer what decides CUDA's ordinals.
    published = [{"index": i, "uuid": f"GPU-{i}", "mode": "timeslice", "replicas": 2, "memory_mib": 15360,
                  "pci_bus_id": f"00000000:{0x10 * (b + 1):02x}:00.0"} for i, b in enumerate(order)]
    pod = PodInAdmission(uid="u", key="ns/p", grants=tuple(GpuGrant(index=i, vram_mib=1024) for i in range(4)),
                         gpu_containers=(("main", 4),))
    answer = answer_for(pod, node_units(published), AnswerSettings(), {})
    by_bus = sorted(range(4), key=lambda i: order[i])
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(f"GPU-{i}" for i in by_bus)
