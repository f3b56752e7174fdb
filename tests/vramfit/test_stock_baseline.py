"""The `device-plugin` baseline: what kube-scheduler with the stock NVIDIA device plugin does on these nodes."""

from __future__ import annotations

import json
from typing import Any

from packing.catalog import load_catalog
from packing.k8s.snapshot import load_objects
from packing.model import Isolation, PodDemand
from vramfit.stock import simulate_stock

CAT = load_catalog()


def node(name: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "annotations": {"vramfit.io/gpus": json.dumps(gpus)}}}


TS = node("ts", [{"index": 0, "product": "Tesla-T4", "mode": "timeslice", "replicas": 4}])
MIG = node("mig", [{"index": 0, "product": "NVIDIA-A100-SXM4-80GB", "mode": "mig",
                    "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 4},
                            {"profile": "1g.10gb", "start": 6}]}])
WHOLE = node("whole", [{"index": 0, "product": "Tesla-T4", "mode": "exclusive"}])


def pod(name: str, vram: int, tenant: str = "a", iso: Isolation = Isolation.NONE, gpus: int = 1) -> PodDemand:
    return PodDemand(key=f"{tenant}/{name}", vram_mib=vram, gpu_count=gpus, tenant=tenant, isolation=iso,
                     uid=f"u-{name}")


def run(nodes: list[dict[str, Any]], pods: list[PodDemand]) -> dict[str, Any]:
    state, _ = load_objects(nodes, CAT)
    return simulate_stock(state, pods)


def test_a_replica_is_taken_whatever_the_vram_and_the_overcommit_is_reported() -> None:
    doc = run([TS], [pod("big", 14336), pod("big2", 14336, tenant="b")])
    placed = [p for p in doc["placements"] if p["node"]]
    assert len(placed) == 2  # the plugin knows nothing of VRAM: 2 x 14 GiB on one 15 GiB T4
    assert doc["summary"]["over_commits"] == 2  # each exceeds its 3840 MiB replica
    assert doc["summary"]["tenant_mixes"] == 1  # and nothing keeps tenants apart


def test_mig_pods_name_the_smallest_profile_that_holds_them() -> None:
    doc = run([MIG], [pod("small", 9000), pod("mid", 15000), pod("large", 30000), pod("more", 9000)])
    units = {p["pod"]: p["gpus"][0]["mig"] if p["gpus"] else None for p in doc["placements"]}
    assert units == {"a/small": "1g.10gb@6", "a/mid": "2g.20gb@4", "a/large": "3g.40gb@0", "a/more": None}


def test_isolation_is_a_node_selector_and_whole_gpus_are_whole() -> None:
    doc = run([TS, WHOLE], [pod("hw", 4000, iso=Isolation.HARDWARE), pod("hw2", 4000, iso=Isolation.HARDWARE)])
    where = [p["node"] for p in doc["placements"]]
    assert where == ["whole", None]  # never a time-slice replica; one pod per whole GPU
    assert doc["summary"]["stranded_vram_mib"] == 15360 - 4000
