"""Kubernetes objects and waits the queue tests share (test_extender_queue, test_plan_worker)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import waiting

from packing.catalog import load_catalog

CATALOG = load_catalog()
T4, A100 = "NVIDIA-T4", "NVIDIA-A100-SXM4-80GB"


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """waiting.wait_for, with room for a worker process to start and plan on a busy machine."""
    waiting.wait_for(cond, timeout_s)


def node(name: str, product: str, n: int = 1) -> dict[str, Any]:
    gpus = [{"index": i, "product": product, "mode": "exclusive"} for i in range(n)]
    return {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                                         "labels": {"kubernetes.io/hostname": name},
                                         "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "spec": {}, "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                   "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def pod(name: str, vram_mib: int = 8000, *, models: str | None = None, created: str = "2026-05-04T10:00:00Z",
        node_name: str | None = None, assignment: dict[str, Any] | None = None) -> dict[str, Any]:
    ann = {"vramfit.io/gpu-models": models} if models else {}
    if assignment is not None:
        ann["vramfit.io/assignment"] = json.dumps(assignment)
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"requests": {"vramfit.io/vram": str(vram_mib)},
                                                          "limits": {"vramfit.io/vram": str(vram_mib)}}}],
                            "schedulerName": "vramfit-scheduler"}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                                        "resourceVersion": "7", "creationTimestamp": created, "annotations": ann},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}
