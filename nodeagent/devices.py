"""The devices the agent advertises for `vramfit.io/gpu`, and their health.

A device ID is only a ticket: the kubelet counts them, the agent's answer comes from the pod's assignment.
A pod asking for k GPUs holds one place on each of k GPUs, but the kubelet allocates every container's
`vramfit.io/gpu` limit separately and kube-scheduler sums the app containers' requests (plus sidecars; a
plain init container's devices are reused), so a pod whose c containers ask takes up to c * k tickets.
Each GPU therefore gets TICKETS_PER_PLACE tickets for each pod it can hold at once (1 whole, one per MIG
instance, MPS/time-slice replicas, or the MPS client limit): the count never limits what vramfit places as
long as no pod has more than TICKETS_PER_PLACE containers asking for `vramfit.io/gpu`. IDs are
`<GPU-UUID>::<n>` (NVIDIA's replica form), so the kubelet's pod-resources view and DCGM can tell which
physical GPU a ticket belongs to.
A GPU that goes missing or unhealthy keeps its IDs, reported Unhealthy: the kubelet stops handing them out
but keeps the accounting of the pods that hold them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packing.k8s.pod_keys import MAX_GPU_CONTAINERS
from packing.model import MPS_MAX_CLIENTS

TICKETS_PER_PLACE = MAX_GPU_CONTAINERS  # each container asking for vramfit.io/gpu takes its own tickets

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def slots(gpu: Mapping[str, Any]) -> int:
    """How many pods one published GPU can hold at once."""
    mode = gpu.get("mode")
    if mode == "mig":
        return len(gpu.get("mig") or [])
    if mode in ("mps", "timeslice"):
        return int(gpu.get("replicas") or MPS_MAX_CLIENTS)
    return 1


def tickets(gpu: Mapping[str, Any]) -> int:
    """How many device IDs one published GPU is advertised with."""
    return slots(gpu) * TICKETS_PER_PLACE


def device_id(gpu_uuid: str, n: int) -> str:
    return f"{gpu_uuid}::{n}"


def gpu_of(device: str) -> str:
    """The GPU UUID a device ID belongs to."""
    return device.rsplit("::", 1)[0]


@dataclass(frozen=True)
class Device:
    id: str
    health: str


class DeviceTable:
    """The advertised list: the current hardware's tickets, plus earlier ones kept as Unhealthy."""

    def __init__(self) -> None:
        self._known: dict[str, str] = {}  # id -> health, insertion-ordered

    def update(self, published: Iterable[Mapping[str, Any]]) -> bool:
        """Take the newly published GPUs; returns True when the list the kubelet sees changed."""
        healthy = [device_id(str(g["uuid"]), n) for g in published for n in range(tickets(g))]
        now = dict.fromkeys(healthy, HEALTHY)
        for old in self._known:
            if old not in now:
                now[old] = UNHEALTHY
        changed = now != self._known
        self._known = now
        return changed

    def devices(self) -> list[Device]:
        return [Device(i, h) for i, h in self._known.items()]
