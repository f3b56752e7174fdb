"""Kubernetes Node JSON -> Node: the vramfit.io/gpus annotation and GPU Feature Discovery labels."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.catalog import Placement, all_layouts, load_catalog, validate_layout
from packing.k8s.inventory import node_from_k8s
from packing.model import Gpu, InputError, Mode
from packing.vendors import product_model

CAT = load_catalog()
MIG_MODELS = sorted(name for name, m in CAT.models.items() if m.mig is not None)
ANN = "metadata.annotations[vramfit.io/gpus]"

# gpu-facts.md §3 Example A (the <NVML MiB> placeholder filled with a plausible figure).
EXAMPLE_A = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mig.config": "all-balanced",
    "nvidia.com/mig.config.state": "success",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/mig-1g.10gb.count": "16",
    "nvidia.com/mig-1g.10gb.memory": "9728",
    "nvidia.com/mig-1g.10gb.multiprocessors": "14",
    "nvidia.com/mig-1g.10gb.slices.gi": "1",
    "nvidia.com/mig-1g.10gb.slices.ci": "1",
    "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
    "nvidia.com/mig-1g.10gb.replicas": "1",
    "nvidia.com/mig-2g.20gb.count": "8",
    "nvidia.com/mig-2g.20gb.multiprocessors": "28",
    "nvidia.com/mig-2g.20gb.slices.gi": "2",
    "nvidia.com/mig-3g.40gb.count": "8",
    "nvidia.com/mig-3g.40gb.multiprocessors": "42",
    "nvidia.com/mig-3g.40gb.slices.gi": "3",
    "nvidia.com/cuda.driver-version.full": "550.107.02",
    "nvidia.com/cuda.runtime-version.full": "12.4",
}
EXAMPLE_B = {
    "nvidia.com/gpu.product": "Tesla-T4-SHARED",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/mps.capable": "false",
}


def k8s_node(name: str = "n1", labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    if labels is not None:
        obj["metadata"]["labels"] = labels
    if annotations is not None:
        obj["metadata"]["annotations"] = annotations
    if allocatable is not None:
        obj["status"] = {"allocatable": allocatable, "capacity": allocatable}
    return obj


def ann_node(gpus: Any, labels: dict[str, str] | None = None) -> dict[str, Any]:
    text = gpus if isinstance(gpus, str) else json.dumps(gpus)
    return k8s_node(labels=labels, annotations={"vramfit.io/gpus": text})


def profile_counts(gpu: Gpu) -> Counter[str]:
    return Counter(m.profile for m in gpu.mig)


def layout_of(gpu: Gpu) -> list[Placement]:
    return [Placement(m.profile, m.start) for m in gpu.mig]


# --- GFD labels -------------------------------------------------------------------------------------------------


def test_example_a_mixed_all_balanced() -> None:
    node = node_from_k8s(k8s_node(labels=EXAMPLE_A, allocatable={
        "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/mig-1g.10gb": "16",
        "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}), CAT)
    assert node.name == "n1" and node.cpu_milli == 64000 and node.memory_mib == 512 * 1024
    assert node.warnings == ()
    assert node.labels["nvidia.com/mig.config"] == "all-balanced"
    assert [g.index for g in node.gpus] == list(range(8))
    a100 = CAT.get("A100-80GB")
    assert a100 is not None
    for g in node.gpus:
        assert g.mode is Mode.MIG and g.model == "A100-80GB" and g.memory_mib == 81920
        assert g.product == "NVIDIA-A100-SXM4-80GB" and g.replicas is None
        assert profile_counts(g) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        assert validate_layout(a100, layout_of(g)) == []
        mem = {m.profile: m.memory_mib for m in g.mig}
        assert mem == {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192}  # label wins for 1g, catalog else
        assert all(m.ref == f"{m.profile}@{m.start}" for m in g.mig)


def test_example_a_without_config_name_derives_layouts() -> None:
    labels = {k: v for k, v in EXAMPLE_A.items() if k != "nvidia.com/mig.config"}
    labels["nvidia.com/mig-1g.10gb.count"] = "15"
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    a100 = CAT.get("A100-80GB")
    assert a100 is not None and len(node.gpus) == 8
    total = sum((profile_counts(g) for g in node.gpus), Counter())
    assert total == {"1g.10gb": 15, "2g.20gb": 8, "3g.40gb": 8}
    assert all(validate_layout(a100, layout_of(g)) == [] for g in node.gpus)


def test_mixed_with_some_full_gpus() -> None:
    labels = dict(EXAMPLE_A, **{"nvidia.com/mig-1g.10gb.count": "12", "nvidia.com/mig-2g.20gb.count": "6",
                                "nvidia.com/mig-3g.40gb.count": "6"})
    node = node_from_k8s(k8s_node(labels=labels, allocatable={"nvidia.com/gpu": "2"}), CAT)
    modes = [g.mode for g in node.gpus]
    assert modes == [Mode.MIG] * 6 + [Mode.EXCLUSIVE] * 2
    assert node.gpus[7].memory_mib == 81920 and node.gpus[7].mig == ()


def test_mixed_named_config_that_does_not_match_counts_is_ignored() -> None:
    labels = dict(EXAMPLE_A, **{"nvidia.com/mig.config": "all-1g.10gb"})
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert all(profile_counts(g) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} for g in node.gpus)


def test_mixed_no_instances_yet() -> None:
    labels = {k: v for k, v in EXAMPLE_A.items() if ".count" not in k or k == "nvidia.com/gpu.count"}
    labels["nvidia.com/mig.config"] = "all-enabled"
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == 8 and all(g.mode is Mode.MIG and g.mig == () for g in node.gpus)
    labels["nvidia.com/mig.config"] = "all-disabled"
    labels["nvidia.com/gpu.replicas"] = "1"
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert all(g.mode is Mode.EXCLUSIVE for g in node.gpus)


def test_mig_config_pending_warns() -> None:
    labels = dict(EXAMPLE_A, **{"nvidia.com/mig.config.state": "pending"})
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert any("pending" in w for w in node.warnings)


def test_example_b_t4_time_slicing() -> None:
    node = node_from_k8s(k8s_node(labels=EXAMPLE_B, allocatable={"cpu": "8", "memory": "32Gi",
                                                                 "nvidia.com/gpu": "4"}), CAT)
    assert node.gpus == (Gpu(index=0, memory_mib=15360, mode=Mode.TIMESLICE, product="Tesla-T4", model="T4",
                             replicas=4),)
    assert node.cpu_milli == 8000 and node.memory_mib == 32768 and node.warnings == ()


def test_renamed_time_slicing_and_old_gfd_without_strategy_label() -> None:
    labels = {k: v for k, v in EXAMPLE_B.items() if k != "nvidia.com/gpu.sharing-strategy"}
    labels["nvidia.com/gpu.product"] = "Tesla-T4"
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert node.gpus[0].mode is Mode.TIMESLICE and node.gpus[0].replicas == 4


def test_mps_labels() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2",
              "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/mps.capable": "true"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert [(g.mode, g.replicas, g.memory_mib, g.model) for g in node.gpus] == [
        (Mode.MPS, 4, 81559, "H100-80GB")] * 2


def test_whole_gpus_catalog_memory_when_label_missing() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4",
              "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert [(g.index, g.mode, g.replicas, g.memory_mib) for g in node.gpus] == [
        (i, Mode.EXCLUSIVE, None, 49152) for i in range(4)]


def test_single_strategy() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.count": "14",
              "nvidia.com/gpu.memory": "4864", "nvidia.com/mig.strategy": "single",
              "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == 2 and node.warnings == ()
    for g in node.gpus:
        assert g.mode is Mode.MIG and g.model == "A100-40GB" and g.product == "NVIDIA-A100-SXM4-40GB"
        assert profile_counts(g) == {"1g.5gb": 7}
        assert all(m.memory_mib == 4864 for m in g.mig)


def test_single_strategy_uses_named_config_and_warns_on_odd_counts() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", "nvidia.com/gpu.count": "4",
              "nvidia.com/gpu.memory": "40448", "nvidia.com/mig.strategy": "single",
              "nvidia.com/mig.config": "all-3g.40gb"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == 2 and all(profile_counts(g) == {"3g.40gb": 2} for g in node.gpus)
    labels["nvidia.com/gpu.count"] = "3"
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == 2 and node.warnings
    assert sum(len(g.mig) for g in node.gpus) == 3


def test_single_strategy_shared_devices_warn() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", "nvidia.com/gpu.count": "7",
              "nvidia.com/gpu.replicas": "2", "nvidia.com/mig.strategy": "single"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == 1 and len(node.gpus[0].mig) == 7
    assert node.gpus[0].mig[0].memory_mib == 4864  # no device memory label: catalog
    assert any("not modelled" in w for w in node.warnings)


def test_single_strategy_invalid() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-INVALID", "nvidia.com/gpu.count": "0",
              "nvidia.com/mig.strategy": "single"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert node.gpus == () and any("MIG" in w for w in node.warnings)


def test_unknown_product_uses_reported_memory_and_warns() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-Mystery-9000", "nvidia.com/gpu.count": "2",
              "nvidia.com/gpu.memory": "30000"}
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert [(g.mode, g.memory_mib, g.model) for g in node.gpus] == [(Mode.EXCLUSIVE, 30000, None)] * 2
    assert any("unknown product" in w and "30000" in w for w in node.warnings)


def test_no_gpu_labels_no_gpus() -> None:
    node = node_from_k8s(k8s_node(labels={"kubernetes.io/hostname": "n1"}, allocatable={"cpu": "250m"}), CAT)
    assert node.gpus == () and node.cpu_milli == 250 and node.memory_mib is None
    assert node_from_k8s({"metadata": {"name": "bare"}}, CAT).gpus == ()


@pytest.mark.parametrize(("labels", "field"), [
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "eight"}, "metadata.labels[nvidia.com/gpu.count]"),
    ({"nvidia.com/gpu.product": "Tesla-T4"}, "metadata.labels[nvidia.com/gpu.count]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.sharing-strategy": "magic"},
     "metadata.labels[nvidia.com/gpu.sharing-strategy]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/mig.strategy": "both"},
     "metadata.labels[nvidia.com/mig.strategy]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "lots"},
     "metadata.labels[nvidia.com/gpu.memory]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1",
      "nvidia.com/gpu.sharing-strategy": "time-slicing"}, "metadata.labels[nvidia.com/gpu.replicas]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "64",
      "nvidia.com/gpu.sharing-strategy": "mps"}, "metadata.labels[nvidia.com/gpu.replicas]"),
    ({"nvidia.com/gpu.product": "NVIDIA-Mystery", "nvidia.com/gpu.count": "1"},
     "metadata.labels[nvidia.com/gpu.memory]"),
    ({"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "20",
      "nvidia.com/gpu.sharing-strategy": "mps"}, "metadata.labels[nvidia.com/gpu.replicas]"),  # pre-7.5: 16
    (dict(EXAMPLE_A, **{"nvidia.com/mig-1g.5gb.count": "1"}), "metadata.labels[nvidia.com/mig-1g.5gb.count]"),
    (dict(EXAMPLE_A, **{"nvidia.com/mig-3g.40gb.count": "17"}), "metadata.labels[nvidia.com/mig-<profile>.count]"),
    (dict(EXAMPLE_A, **{"nvidia.com/mig-3g.40gb.count": "x"}), "metadata.labels[nvidia.com/mig-3g.40gb.count]"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/mig-1g.5gb.count": "2"},
     "metadata.labels[nvidia.com/gpu.product]"),
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-9g.1tb", "nvidia.com/gpu.count": "2"},
     "metadata.labels[nvidia.com/gpu.product]"),
])
def test_bad_labels_name_the_field(labels: dict[str, str], field: str) -> None:
    with pytest.raises(InputError) as err:
        node_from_k8s(k8s_node(name="gpu-7", labels=labels), CAT)
    assert err.value.obj == "node gpu-7"
    assert err.value.field_name == field


@pytest.mark.parametrize(("obj", "field"), [
    (k8s_node(allocatable={"cpu": "lots"}), "status.allocatable.cpu"),
    (k8s_node(allocatable={"memory": "12Qi"}), "status.allocatable.memory"),
    ({"metadata": {}}, "metadata.name"),
    ({"kind": "Node"}, "metadata"),
    ({"metadata": {"name": "n1", "labels": ["a"]}}, "metadata.labels"),
])
def test_bad_node_object(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        node_from_k8s(obj, CAT)
    assert err.value.field_name == field


# --- the vramfit.io/gpus annotation -----------------------------------------------------------------------------


MIXED_NODE = [
    {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "mode": "mig",
     "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a"}, {"profile": "2g.20gb", "start": 4},
             {"profile": "1g.10gb", "start": 6, "memory_mib": 9728}]},
    {"index": 1, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"},
    {"index": 2, "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "mode": "mps", "replicas": 4},
    {"index": 3, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mps"},
    {"index": 4, "product": "Tesla-T4", "mode": "timeslice", "replicas": 4},
]


def test_annotation_parses_every_mode_and_wins_over_labels() -> None:
    node = node_from_k8s(ann_node(MIXED_NODE, labels=EXAMPLE_B), CAT)
    g0, g1, g2, g3, g4 = node.gpus
    assert g0.mode is Mode.MIG and g0.uuid == "GPU-0" and g0.model == "A100-80GB"
    assert [(m.ref, m.memory_mib, m.uuid) for m in g0.mig] == [
        ("3g.40gb@0", 40192, "MIG-a"), ("2g.20gb@4", 19968, None), ("1g.10gb@6", 9728, None)]
    assert g0.instance("2g.20gb@4") is not None
    assert (g1.mode, g1.memory_mib, g1.replicas) == (Mode.EXCLUSIVE, 81920, None)
    assert (g2.mode, g2.memory_mib, g2.replicas) == (Mode.MPS, 81559, 4)  # node value wins over catalog
    assert (g3.mode, g3.replicas) == (Mode.MPS, None)  # per-pod pinned limits
    assert (g4.mode, g4.replicas, g4.memory_mib) == (Mode.TIMESLICE, 4, 15360)
    assert node.warnings == ()


def test_annotation_sorted_by_index_and_unknown_product_warns() -> None:
    node = node_from_k8s(ann_node([
        {"index": 1, "product": "ACME-X", "memory_mib": 1000, "mode": "exclusive"},
        {"index": 0, "memory_mib": 2000, "mode": "exclusive"},
    ]), CAT)
    assert [g.index for g in node.gpus] == [0, 1]
    assert node.gpus[1].model is None and any("ACME-X" in w for w in node.warnings)


def test_annotation_empty_list_means_no_gpus() -> None:
    node = node_from_k8s(ann_node([], labels=EXAMPLE_B), CAT)
    assert node.gpus == ()


A100 = {"index": 0, "product": "NVIDIA-A100-SXM4-80GB", "mode": "mig"}


@pytest.mark.parametrize(("gpus", "field"), [
    ("{not json", ANN),
    ({"index": 0}, ANN),
    (["gpu"], f"{ANN}[0]"),
    ([{"product": "Tesla-T4", "mode": "exclusive"}], f"{ANN}[0].index"),
    ([{"index": -1, "product": "Tesla-T4", "mode": "exclusive"}], f"{ANN}[0].index"),
    ([{"index": True, "product": "Tesla-T4", "mode": "exclusive"}], f"{ANN}[0].index"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "exclusive"},
      {"index": 0, "product": "Tesla-T4", "mode": "exclusive"}], f"{ANN}[1].index"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "shared"}], f"{ANN}[0].mode"),
    ([{"index": 0, "product": "Tesla-T4"}], f"{ANN}[0].mode"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "exclusive", "colour": "green"}], f"{ANN}[0].colour"),
    ([{"index": 0, "product": 4, "mode": "exclusive"}], f"{ANN}[0].product"),
    ([{"index": 0, "uuid": 7, "product": "Tesla-T4", "mode": "exclusive"}], f"{ANN}[0].uuid"),
    ([{"index": 0, "product": "Tesla-T4", "memory_mib": "15Gi", "mode": "exclusive"}], f"{ANN}[0].memory_mib"),
    ([{"index": 0, "product": "Tesla-T4", "memory_mib": 0, "mode": "exclusive"}], f"{ANN}[0].memory_mib"),
    ([{"index": 0, "product": "ACME-X", "mode": "exclusive"}], f"{ANN}[0].memory_mib"),
    ([{"index": 0, "mode": "exclusive"}], f"{ANN}[0].memory_mib"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "timeslice", "replicas": 0}], f"{ANN}[0].replicas"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "timeslice", "replicas": "4"}], f"{ANN}[0].replicas"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "timeslice"}], f"{ANN}[0].replicas"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "exclusive", "replicas": 2}], f"{ANN}[0].replicas"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "mps", "replicas": 49}], f"{ANN}[0].replicas"),
    ([dict(A100, replicas=2)], f"{ANN}[0].replicas"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "mig", "mig": []}], f"{ANN}[0].mode"),
    ([{"index": 0, "product": "ACME-X", "memory_mib": 100, "mode": "mig"}], f"{ANN}[0].product"),
    ([{"index": 0, "product": "Tesla-T4", "mode": "exclusive", "mig": []}], f"{ANN}[0].mig"),
    ([dict(A100, mode="mps", mig=[{"profile": "1g.10gb", "start": 0}])], f"{ANN}[0].mode"),
    ([{"index": 0, "product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "mode": "exclusive"}], f"{ANN}[0].product"),
    ([dict(A100, mig={"profile": "1g.10gb"})], f"{ANN}[0].mig"),
    ([dict(A100, mig=["1g.10gb@0"])], f"{ANN}[0].mig[0]"),
    ([dict(A100, mig=[{"profile": "1g.5gb", "start": 0}])], f"{ANN}[0].mig[0].profile"),
    ([dict(A100, mig=[{"profile": 3, "start": 0}])], f"{ANN}[0].mig[0].profile"),
    ([dict(A100, mig=[{"profile": "1g.10gb"}])], f"{ANN}[0].mig[0].start"),
    ([dict(A100, mig=[{"profile": "1g.10gb", "start": "0"}])], f"{ANN}[0].mig[0].start"),
    ([dict(A100, mig=[{"profile": "1g.10gb", "start": 0, "size": 1}])], f"{ANN}[0].mig[0].size"),
    ([dict(A100, mig=[{"profile": "1g.10gb", "start": 0, "uuid": 5}])], f"{ANN}[0].mig[0].uuid"),
    ([dict(A100, mig=[{"profile": "1g.10gb", "start": 0, "memory_mib": -1}])], f"{ANN}[0].mig[0].memory_mib"),
    ([dict(A100, mig=[{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 2}])],
     f"{ANN}[0].mig[1].start"),
    ([dict(A100, mig=[{"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 2}])],
     f"{ANN}[0].mig[1].start"),
    ([dict(A100, mig=[{"profile": "1g.10gb", "start": 7}])], f"{ANN}[0].mig[0].start"),
    ([dict(A100, mig=[{"profile": "1g.10gb+me", "start": 0}, {"profile": "1g.10gb+me", "start": 1}])],
     f"{ANN}[0].mig[1].profile"),
    ([dict(A100, mig=[{"profile": "4g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 4},
                      {"profile": "2g.20gb", "start": 6}])], f"{ANN}[0].mig[2].start"),
])
def test_bad_annotation_names_the_field(gpus: Any, field: str) -> None:
    with pytest.raises(InputError) as err:
        node_from_k8s(ann_node(gpus), CAT)
    assert err.value.obj == "node n1"
    assert err.value.field_name == field
    assert str(err.value).startswith(f"node n1: field {field}: ")


def test_layout_error_message_names_the_instance() -> None:
    with pytest.raises(InputError) as err:
        node_from_k8s(ann_node([dict(A100, mig=[{"profile": "3g.40gb", "start": 0},
                                                {"profile": "2g.20gb", "start": 2}])]), CAT)
    assert "overlaps instance 0 (3g.40gb@0)" in err.value.problem


def test_compute_overflow_names_the_mig_list(tmp_path: Path) -> None:
    # A made-up geometry where memory fits but compute does not (no real 7/8 GPU allows that with valid starts).
    path = tmp_path / "fat.yaml"
    path.write_text("""
models:
  - name: Fat
    memory_mib: 4096
    products: [ACME-Fat]
    mig:
      compute_slices: 3
      memory_slices: 4
      profiles:
        - {name: 2g.1gb, compute_slices: 2, memory_slices: 1, max_count: 4}
""")
    cat = load_catalog(str(path))
    gpus = [{"index": 0, "product": "ACME-Fat", "mode": "mig",
             "mig": [{"profile": "2g.1gb", "start": 0}, {"profile": "2g.1gb", "start": 1}]}]
    with pytest.raises(InputError) as err:
        node_from_k8s(ann_node(gpus), cat)
    assert err.value.field_name == f"{ANN}[0].mig" and "compute slices" in err.value.problem


# --- properties -------------------------------------------------------------------------------------------------


@st.composite
def mig_node(draw: st.DrawFn) -> tuple[str, list[tuple[Placement, ...]]]:
    name = draw(st.sampled_from(MIG_MODELS))
    m = CAT.get(name)
    assert m is not None
    layouts = all_layouts(m)
    n = draw(st.integers(min_value=1, max_value=8))
    return name, [layouts[draw(st.integers(min_value=0, max_value=len(layouts) - 1))] for _ in range(n)]


@settings(max_examples=100, deadline=None)
@given(mig_node())
def test_annotation_round_trip(case: tuple[str, list[tuple[Placement, ...]]]) -> None:
    name, layouts = case
    m = CAT.get(name)
    assert m is not None
    gpus = [{"index": i, "product": m.products[0], "mode": "mig",
             "mig": [{"profile": p.profile, "start": p.start} for p in layout]} for i, layout in enumerate(layouts)]
    node = node_from_k8s(ann_node(gpus), CAT)
    assert [tuple(layout_of(g)) for g in node.gpus] == [tuple(sorted(x, key=lambda p: p.start)) for x in layouts]


@settings(max_examples=100, deadline=None)
@given(mig_node())
def test_label_derived_layouts_are_valid(case: tuple[str, list[tuple[Placement, ...]]]) -> None:
    """GFD mixed-strategy labels made from a real node give valid per-GPU layouts with the same instances."""
    name, layouts = case
    m = CAT.get(name)
    assert m is not None
    total = Counter(p.profile for layout in layouts for p in layout)
    labels = {"nvidia.com/gpu.product": m.products[0], "nvidia.com/gpu.count": str(len(layouts)),
              "nvidia.com/gpu.replicas": "0", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/gpu.sharing-strategy": "none"}
    for profile, n in total.items():
        labels[f"nvidia.com/mig-{profile.replace('+', '.')}.count"] = str(n)
    node = node_from_k8s(k8s_node(labels=labels), CAT)
    assert len(node.gpus) == len(layouts)
    got: Counter[str] = Counter()
    for g in node.gpus:
        assert g.mode is Mode.MIG and g.model == m.name
        assert validate_layout(m, layout_of(g)) == []
        got += profile_counts(g)
    assert got == total


def test_every_catalog_product_resolves_to_its_model() -> None:
    for m in CAT.models.values():
        for p in m.products:
            assert product_model(CAT, p) == m, p
