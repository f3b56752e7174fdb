"""Write what the agent knows onto the Node and the pods' events (the agent's only API writes).

- `vramfit.io/gpus`: the hardware as published (the extender's inventory source, first in precedence);
- `vramfit.io/node-health`: GPUs left out as unhealthy or missing, and each MPS daemon's health;
- Events on pods for refused Allocates and divergences from the kubelet.
Node writes are JSON merge patches of the annotations only, sent only when their content changed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from kubernetes import client as kclient

from kubeio import events

log = logging.getLogger("vramfit.node.publish")

ANN_GPUS = "vramfit.io/gpus"
ANN_HEALTH = "vramfit.io/node-health"
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "vramfit-node"


class Publisher(Protocol):
    def publish(self, annotations: dict[str, str]) -> None: ...

    def event(self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool) -> None: ...


def annotations_for(gpus: list[dict[str, Any]], health: dict[str, Any]) -> dict[str, str]:
    return {ANN_GPUS: json.dumps(gpus, separators=(",", ":"), sort_keys=True),
            ANN_HEALTH: json.dumps(health, separators=(",", ":"), sort_keys=True)}


class KubePublisher:
    def __init__(self, api: kclient.ApiClient, node_name: str, timeout_s: float = 10.0) -> None:
        self.core = kclient.CoreV1Api(api)
        self.node_name = node_name
        self.timeout_s = timeout_s
        self._last: dict[str, str] | None = None

    def publish(self, annotations: dict[str, str]) -> None:
        if annotations == self._last:
            return
        resp: Any = self.core.patch_node(self.node_name, {"metadata": {"annotations": annotations}},
                                          _content_type=MERGE_PATCH, _request_timeout=self.timeout_s,
                                          _preload_content=False)
        resp.read()
        resp.release_conn()
        self._last = dict(annotations)
        log.info("published %s on node %s", ", ".join(sorted(annotations)), self.node_name)

    def event(self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool) -> None:
        events.post(self.core, events.pod_event(namespace, pod, uid, reason=reason, message=message,
                                                event_type="Warning" if warning else "Normal",
                                                component=COMPONENT, instance=self.node_name,
                                                host=self.node_name), self.timeout_s)


class LogPublisher:
    """Dry run: nothing is written; what would be is logged and kept for inspection."""

    def __init__(self) -> None:
        self.published: dict[str, str] = {}
        self.events: list[tuple[str, str, str, str]] = []

    def publish(self, annotations: dict[str, str]) -> None:
        if annotations != self.published:
            log.info("dry run: node annotations %s", annotations)
        self.published = dict(annotations)

    def event(self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool) -> None:
        log.info("dry run: event %s on %s/%s: %s", reason, namespace, pod, message)
        self.events.append((namespace, pod, reason, message))
