"""What vramfit writes into a claim, as `resource.k8s.io/v1` JSON: the allocation (results, configs, node
selector). Field names: kubernetes/api `resource/v1/types.go`; what kube-scheduler's allocator writes, which
this mirrors: dynamic-resource-allocation `structured/internal/incubating/allocator_incubating.go` (dra.md §4–§8)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from packing.dra.allocate import ClaimPicks
from packing.dra.objects import Claim, DeviceClass
from packing.k8s.quantity import format_quantity


def node_selector(node: str) -> dict[str, Any]:
    """The selector kube-scheduler writes for devices of a node-local pool."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def _configs(claim: Claim, classes: dict[str, DeviceClass], requests: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Class configs first (FromClass, one entry per request using the class), then the claim's (FromClaim)."""
    out: list[dict[str, Any]] = []
    for request, class_name in requests:
        cls = classes.get(class_name)
        for c in cls.config if cls is not None else ():
            out.append({"source": "FromClass", "requests": [request],
                        "opaque": {"driver": c.driver, "parameters": c.parameters}})
    for c in claim.config:
        entry: dict[str, Any] = {"source": "FromClaim", "opaque": {"driver": c.driver, "parameters": c.parameters}}
        if c.requests:
            entry["requests"] = list(c.requests)
        out.append(entry)
    return out


def _class_of(claim: Claim, request: str) -> str:
    for r in claim.requests:
        for alt in r.alternatives:
            if alt.name == request:
                return alt.device_class
    return ""


def allocation_json(picks: ClaimPicks, classes: dict[str, DeviceClass],
                    new_share_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> dict[str, Any]:
    """`status.allocation` for one claim's picks. A shareable device's result carries a fresh `shareID` and every
    capacity it consumes (kube-scheduler counts a result without a shareID as the whole device)."""
    results = []
    for p in picks.picks:
        d = p.fit.device.id
        entry: dict[str, Any] = {"request": p.request, "driver": d.driver, "pool": d.pool, "device": d.device}
        if p.fit.consumed is not None:
            entry["shareID"] = new_share_id()
            entry["consumedCapacity"] = {k: format_quantity(v) for k, v in p.fit.consumed.items()}
        results.append(entry)
    used = list(dict.fromkeys((p.request, _class_of(picks.claim, p.request)) for p in picks.picks))
    allocation: dict[str, Any] = {"devices": {"results": results}, "nodeSelector": node_selector(picks.node)}
    configs = _configs(picks.claim, classes, used)
    if configs:
        allocation["devices"]["config"] = configs
    return allocation
