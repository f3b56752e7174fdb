"""Compare what the kubelet handed out (pod-resources API, `v1.List`) with what the agent answered.

The agent answers Allocate for the pod it identified; the kubelet records which container got which device
IDs. If the two disagree — the kubelet shows a container with `vramfit.io/gpu` devices the agent never
answered, or other device IDs than the ones in the answer — the container may hold units that are not its
pod's. Each divergence is counted and reported as an Event on the pod.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from nodeagent.allocate import GPU_RESOURCE
from nodeagent.api import podresources_v1_pb2 as prpb
from nodeagent.api import podresources_v1_pb2_grpc as prpb_grpc
from nodeagent.ledger import Ledger

log = logging.getLogger("vramfit.node.reconcile")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class Divergence:
    namespace: str
    pod: str
    container: str
    kubelet_devices: tuple[str, ...]
    answered_devices: tuple[str, ...] | None  # None: the agent never answered this container

    @property
    def message(self) -> str:
        kubelet = ",".join(self.kubelet_devices)
        if self.answered_devices is None:
            return (f"container {self.container} holds {GPU_RESOURCE} devices {kubelet} that vramfit's node "
                    "agent never answered for this pod")
        return (f"container {self.container} holds {GPU_RESOURCE} devices {kubelet}, but vramfit answered "
                f"Allocate for {','.join(self.answered_devices)}")


def list_pod_devices(socket_path: str, timeout_s: float = 5.0) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """(namespace, pod, container) -> device IDs of `vramfit.io/gpu`, from the kubelet's pod-resources API."""
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        resp = prpb_grpc.PodResourcesListerStub(channel).List(prpb.ListPodResourcesRequest(), timeout=timeout_s)
    out: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for pod in resp.pod_resources:
        for c in pod.containers:
            ids = tuple(i for d in c.devices if d.resource_name == GPU_RESOURCE for i in d.device_ids)
            if ids:
                out[(pod.namespace, pod.name, c.name)] = ids
    return out


def compare(kubelet: dict[tuple[str, str, str], tuple[str, ...]], ledger: Ledger) -> list[Divergence]:
    answers = ledger.by_container()
    out: list[Divergence] = []
    for (ns, name, container), ids in sorted(kubelet.items()):
        answer = answers.get((f"{ns}/{name}", container))
        if answer is None:
            out.append(Divergence(ns, name, container, ids, None))
        elif sorted(answer.device_ids) != sorted(ids):
            out.append(Divergence(ns, name, container, ids, answer.device_ids))
    return out


class Reconciler:
    """One pass: list, compare, report each new divergence once (Event) and set the gauge."""

    def __init__(self, socket_path: str, ledger: Ledger, report: Callable[[Divergence], None],
                 on_result: Callable[[str, int], None]) -> None:
        self.socket_path = socket_path
        self.ledger = ledger
        self.report = report
        self.on_result = on_result
        self._reported: set[Divergence] = set()

    def run_once(self) -> list[Divergence] | None:
        try:
            kubelet = list_pod_devices(self.socket_path)
        except grpc.RpcError as err:
            log.warning("pod-resources List failed: %s", err.code() if hasattr(err, "code") else err)
            self.on_result("unreachable", 0)
            return None
        found = compare(kubelet, self.ledger)
        for d in found:
            if d not in self._reported:
                log.error("divergence: pod %s/%s %s", d.namespace, d.pod, d.message)
                self.report(d)
        self._reported = set(found)
        self.on_result("divergent" if found else "ok", len(found))
        return found
