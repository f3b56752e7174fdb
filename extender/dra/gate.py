"""The webhook's DRA step: a new pod whose claims ask for a DeviceClass vramfit manages gets the scheduling gate
`vramfit.io/allocate` (gates can only be set at creation: dra.md §6). A claim or template the store has not
seen yet counts as managed: the allocator removes the gate at once from a pod with nothing to allocate, while a
pod let through ungated would be allocated by kube-scheduler's first fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from packing.dra.objects import GATE

# (namespace, entry of spec.resourceClaims) -> the DeviceClasses it asks for; None: not known yet
ClassLookup = Callable[[str, Mapping[str, Any]], frozenset[str] | None]


def needs_gate(pod: Mapping[str, Any], namespace: str, classes_of: ClassLookup, managed: frozenset[str]) -> bool:
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        asked = classes_of(namespace, entry)
        if asked is None or asked & managed:
            return True
    return False


def gate_ops(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON Patch operations adding vramfit's gate (none when the pod carries it already)."""
    gates = (pod.get("spec") or {}).get("schedulingGates")
    if any(g.get("name") == GATE for g in gates or ()):
        return []
    if not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
