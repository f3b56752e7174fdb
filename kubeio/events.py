"""Kubernetes Events on pods (core/v1 Event), posted best effort by the extender and the node agent.

An Event that fails to post must never fail the action it reports on; it is logged and dropped.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as kclient

log = logging.getLogger("vramfit.events")

JSON_HEADERS = {"Content-Type": "application/json"}
MAX_MESSAGE = 1024  # the API server refuses longer Event messages


def rfc3339(at: datetime) -> str:
    """metav1.Time as the API server writes it (seconds, UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(namespace: str, name: str, uid: str, *, reason: str, message: str, event_type: str,
              component: str, instance: str, host: str | None = None) -> dict[str, Any]:
    now = rfc3339(datetime.now(UTC))
    source: dict[str, str] = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid},
        "reason": reason, "message": message[:MAX_MESSAGE], "type": event_type,
        "source": source, "reportingComponent": component, "reportingInstance": instance,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def post(core: kclient.CoreV1Api, event: dict[str, Any], timeout_s: float) -> None:
    namespace = event["metadata"]["namespace"]
    try:
        # The client accepts a plain dict body (serialised as is); its stubs only name the model class.
        # With _preload_content=False the answer is the raw HTTP response, whatever the stubs say.
        resp: Any = core.create_namespaced_event(namespace, event,  # type: ignore[arg-type]
                                                 _request_timeout=timeout_s, _headers=JSON_HEADERS,
                                                 _preload_content=False)
        resp.read()
        resp.release_conn()
    except Exception as exc:  # noqa: BLE001 - best effort by design
        log.info("could not post event %s for %s/%s: %s", event.get("reason"), namespace,
                 event["involvedObject"]["name"], exc)
