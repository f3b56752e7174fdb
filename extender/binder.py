"""Write a placement to the API server: annotate the pod, then bind it.

Responses are not decoded into the client's typed models (`_preload_content=False`): only the status
matters, and typed decoding would break on fields newer than the client.

Order matters: the device plugin reads `vramfit.io/assignment` when the kubelet starts the containers,
and the kubelet only sees the pod after the Binding sets `spec.nodeName`; so the annotation must land
first. The PATCH carries `metadata.uid` as a precondition (as the kubelet does for status patches), so a
pod deleted and re-created under the same name is never annotated with a stale assignment; the Binding
carries the UID for the same reason.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from packing.model import Assignment

log = logging.getLogger("vramfit.binder")

ASSIGNMENT_ANNOTATION = "vramfit.io/assignment"
PATCH_CONTENT_TYPE = "application/strategic-merge-patch+json"
# kubernetes-client 37's generated POST methods ignore `_content_type` (no consumes list in the spec) and send
# no Content-Type at all, which the API server refuses (415); an explicit header is honoured.
JSON_HEADERS = {"Content-Type": "application/json"}


class BindError(Exception):
    """The API refused or failed; the message is shown to the user in the FailedScheduling event."""


class Binder(Protocol):
    blocking: bool  # True: bind does network I/O and must run off the event loop

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None: ...


def assignment_patch(uid: str, assignment: Assignment) -> dict[str, Any]:
    """The PATCH body: the assignment annotation plus the UID precondition."""
    return {
        "metadata": {
            "uid": uid,
            "annotations": {ASSIGNMENT_ANNOTATION: json.dumps(assignment.to_annotation(), separators=(",", ":"))},
        }
    }


def binding_body(name: str, uid: str, node: str) -> kclient.V1Binding:
    return kclient.V1Binding(
        api_version="v1",
        kind="Binding",
        metadata=kclient.V1ObjectMeta(name=name, uid=uid),
        target=kclient.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )


def _done(resp: Any) -> None:
    # Read the body before handing the connection back: a pooled connection with unread bytes would
    # feed them to the next request as its status line.
    resp.read()
    resp.release_conn()


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return f"{body['message']} (HTTP {exc.status})"
    except ValueError:
        pass
    return f"HTTP {exc.status} {exc.reason or ''}".strip()


class KubeBinder:
    """Binder against a real API server with the official client."""

    blocking = True

    def __init__(self, api: kclient.ApiClient, *, emit_events: bool = True,
                 reporting_component: str = "vramfit-scheduler", timeout_s: float = 10.0) -> None:
        self.core = kclient.CoreV1Api(api)
        self.emit_events = emit_events
        self.component = reporting_component
        self.timeout_s = timeout_s

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        try:
            _done(self.core.patch_namespaced_pod(
                name, namespace, assignment_patch(uid, assignment),
                _content_type=PATCH_CONTENT_TYPE, _request_timeout=self.timeout_s, _preload_content=False,
            ))
        except ApiException as exc:
            raise BindError(f"annotating pod {namespace}/{name}: {_api_message(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - transport errors become a readable bind error
            raise BindError(f"annotating pod {namespace}/{name}: {type(exc).__name__}: {exc}") from None
        try:
            _done(self.core.create_namespaced_pod_binding(
                name, namespace, binding_body(name, uid, assignment.node), _request_timeout=self.timeout_s,
                _headers=JSON_HEADERS, _preload_content=False,
            ))
        except ApiException as exc:
            raise BindError(f"binding pod {namespace}/{name} to {assignment.node}: {_api_message(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise BindError(f"binding pod {namespace}/{name} to {assignment.node}: "
                            f"{type(exc).__name__}: {exc}") from None
        if self.emit_events:
            self._event(namespace, name, uid, assignment)

    def _event(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        # Best effort: an Event that fails to post must not fail a bind that succeeded.
        units = ", ".join(f"GPU {g.index}" + (f" MIG {g.mig}" if g.mig else "") + f" ({g.vram_mib} MiB)"
                          for g in assignment.gpus)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                               "uid": uid},
            "reason": "VramfitAssigned",
            "message": f"Assigned to {assignment.node}: {units}",
            "type": "Normal",
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            # The client accepts a plain dict body (serialised as is); its stubs only name the model class.
            _done(self.core.create_namespaced_event(namespace, event,  # type: ignore[arg-type]
                                              _request_timeout=self.timeout_s,
                                              _headers=JSON_HEADERS,
                                              _preload_content=False))
        except Exception as exc:  # noqa: BLE001
            log.info("could not post event for %s/%s: %s", namespace, name, exc)


class MemoryBinder:
    """Snapshot / dry-run mode: nothing to write; the store's in-memory state is the only effect."""

    blocking = False

    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, str, Assignment]] = {}

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        self.bound[uid] = (namespace, name, assignment)
