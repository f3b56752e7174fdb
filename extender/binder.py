"""Write a placement to the API server: one Binding that carries the assignment.

The API server merges a Binding's `metadata.annotations` into the pod in the same storage update that sets
`spec.nodeName` and the PodScheduled condition (`BindingREST.setPodHostAndAnnotations` in
pkg/registry/core/pod/storage), so no reader (the kubelet, the node agent, a restarted extender) can see the
pod bound without its assignment, or annotated but unbound. It also means the extender needs `create` on
`pods/binding` only, no `patch` on pods.

Annotations written (`binding_annotations`):
- `vramfit.io/assignment`: the chosen units (read back by `packing.k8s.demand` after a restart, and by the node
  agent at Allocate);
- `vramfit.io/phase: allocating`: the node agent's cue: at the kubelet's Allocate call it looks for the one
  pod bound to its node in this phase that the kubelet has not admitted yet (`extender.admission` keeps
  that pod unique per node);
- `vramfit.io/bound-at`: RFC 3339 UTC, so anyone can tell a stale allocating pod from a young one;
- `vramfit.io/assignment-signature` (with a signing key): HMAC over the pod UID, the node and the exact
  assignment text (`packing.k8s.trust.sign`). The node agent hands out units, and the extender books them after
  a restart, only for an assignment whose signature verifies: anyone who can edit a pod can write the others.

Preconditions: the Binding carries the pod's UID and the resourceVersion the store last saw. A pod deleted
and re-created under the same name is never bound with a stale assignment (409, UID). A pod merely updated
since the watch delivered it (the scheduler writes its PodScheduled condition, a controller a label) gets
409 on the resourceVersion alone: that one is re-checked with a GET, and if the pod is the same (UID) and
still unbound the Binding is retried once with the fresh resourceVersion. Every other 409 (UID changed,
already assigned, being deleted) is a `BindError` with the API's own message.

Responses are not decoded into the client's typed models (`_preload_content=False`): only the status
matters, and typed decoding would break on fields newer than the client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from kubeio import events
from kubeio.events import rfc3339
from packing.k8s.demand import ANN_ASSIGNMENT, ANN_BOUND_AT, ANN_PHASE, PHASE_ALLOCATING
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys, sign
from packing.model import Assignment

if TYPE_CHECKING:
    from extender.admission import AdmissionGate

log = logging.getLogger("vramfit.binder")

ASSIGNMENT_ANNOTATION = ANN_ASSIGNMENT
PHASE_ANNOTATION = ANN_PHASE
BOUND_AT_ANNOTATION = ANN_BOUND_AT
# kubernetes-client 37's generated POST methods ignore `_content_type` (no consumes list in the spec) and send
# no Content-Type at all, which the API server refuses (415); an explicit header is honoured.
JSON_HEADERS = {"Content-Type": "application/json"}
CONFLICT = 409
NOT_FOUND = 404


class BindError(Exception):
    """The API refused or failed; the message is shown to the user in the FailedScheduling event."""


class BindOutcomeUnknown(BindError):
    """The Binding was sent but its answer was lost, and the pod could not be re-read: it may be bound. The
    caller keeps the units booked (the pod's watch event confirms them, or the reservation expires) rather
    than offering them to another pod."""


class Binder(Protocol):
    """Writes a placement. `blocking`: bind does network I/O and must run off the event loop.

    A binder against a live cluster may also carry `admission` (an `AdmissionGate`, or None): the service
    then serialises binds per node and waits for the node's previous pod to be admitted. Snapshot binders
    have none: there is no kubelet to wait for."""

    blocking: bool

    def bind(self, namespace: str, name: str, uid: str, resource_version: str, assignment: Assignment) -> None: ...


def binding_annotations(assignment: Assignment, bound_at: datetime, *, uid: str = "",
                        keys: SigningKeys | None = None) -> dict[str, str]:
    """What the Binding merges into the pod's annotations; signed for pod `uid` when `keys` are given."""
    text = json.dumps(assignment.to_annotation(), separators=(",", ":"))
    annotations = {
        ASSIGNMENT_ANNOTATION: text,
        PHASE_ANNOTATION: PHASE_ALLOCATING,
        BOUND_AT_ANNOTATION: rfc3339(bound_at),
    }
    if keys is not None:
        annotations[ANN_SIGNATURE] = sign(keys, uid, assignment.node, text)
    return annotations


def binding_body(name: str, uid: str, resource_version: str, node: str,
                 annotations: dict[str, str]) -> kclient.V1Binding:
    return kclient.V1Binding(
        api_version="v1",
        kind="Binding",
        # An empty resourceVersion is left out: the API then checks the UID only.
        metadata=kclient.V1ObjectMeta(name=name, uid=uid or None, resource_version=resource_version or None,
                                      annotations=annotations),
        target=kclient.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )


def _done(resp: Any) -> None:
    # Read the body before handing the connection back: a pooled connection with unread bytes would
    # feed them to the next request as its status line.
    resp.read()
    resp.release_conn()


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except ValueError:
        pass
    return ""


def _api_message(exc: ApiException) -> str:
    message = _status_message(exc)
    if message:
        return f"{message} (HTTP {exc.status})"
    return f"HTTP {exc.status} {exc.reason or ''}".strip()


def only_version_moved(exc: ApiException) -> bool:
    """A 409 from the resourceVersion precondition alone (the UID one is checked first and says "UID")."""
    return exc.status == CONFLICT and "ResourceVersion in precondition" in _status_message(exc)


class KubeBinder:
    """Binder against a real API server with the official client.

    It also serves the bind gate (`read_pod`, `post_event`); `cli.run_serve` attaches the gate as
    `admission` once both exist."""

    blocking = True

    def __init__(self, api: kclient.ApiClient, *, emit_events: bool = True,
                 reporting_component: str = "vramfit-scheduler", timeout_s: float = 10.0,
                 keys: SigningKeys | None = None) -> None:
        self.core = kclient.CoreV1Api(api)
        self.keys = keys  # signs each Binding's assignment (None: unsigned, `allow_unsigned`)
        self.emit_events = emit_events
        self.component = reporting_component
        self.timeout_s = timeout_s
        self.admission: AdmissionGate | None = None
        # Leader election's write fence (extender.leader): a Binding is created only while it says True, and
        # `cli.run_serve` caps timeout_s to the lease's write budget so the write lands inside the term.
        self.fence: Callable[[], bool] | None = None

    def bind(self, namespace: str, name: str, uid: str, resource_version: str, assignment: Assignment) -> None:
        where = f"binding pod {namespace}/{name} to {assignment.node}"
        annotations = binding_annotations(assignment, datetime.now(UTC), uid=uid, keys=self.keys)
        moved = self._create_binding(where, namespace, name, uid, resource_version, assignment.node, annotations)
        if moved is not None:
            fresh = self._fresh_version(where, namespace, name, uid, moved)
            again = self._create_binding(where, namespace, name, uid, fresh, assignment.node, annotations)
            if again is not None:  # updated again in between: give up, the scheduler retries the pod
                raise BindError(f"{where}: {_api_message(again)}")
        if self.emit_events:
            units = ", ".join(f"GPU {g.index}" + (f" MIG {g.mig}" if g.mig else "") + f" ({g.vram_mib} MiB)"
                              for g in assignment.gpus)
            self.post_event(namespace, name, uid, reason="VramfitAssigned",
                            message=f"Assigned to {assignment.node}: {units}", event_type="Normal")

    def _create_binding(self, where: str, namespace: str, name: str, uid: str, resource_version: str, node: str,
                        annotations: dict[str, str]) -> ApiException | None:
        """POST the Binding. None: bound. The ApiException: only the resourceVersion precondition failed.
        Raises BindError for everything else."""
        body = binding_body(name, uid, resource_version, node, annotations)
        if self.fence is not None and not self.fence():
            raise BindError(f"{where}: this replica does not hold a fresh leader lease; not writing")
        try:
            _done(self.core.create_namespaced_pod_binding(name, namespace, body, _request_timeout=self.timeout_s,
                                                          _headers=JSON_HEADERS, _preload_content=False))
        except ApiException as exc:
            if resource_version and only_version_moved(exc):
                return exc
            raise BindError(f"{where}: {_api_message(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - the request may or may not have been applied
            self._settle_lost_answer(where, namespace, name, uid, node, annotations, exc)
        return None

    def _settle_lost_answer(self, where: str, namespace: str, name: str, uid: str, node: str,
                            annotations: dict[str, str], exc: Exception) -> None:
        """A transport error after the Binding was sent: the API server may have applied it. Re-read the pod:
        bound here with our assignment -> it worked (return); anything else -> BindError; unreadable ->
        BindOutcomeUnknown (the units must stay booked)."""
        lost = f"{where}: {type(exc).__name__}: {exc}"
        try:
            pod = self.read_pod(namespace, name)
        except Exception as again:  # noqa: BLE001
            raise BindOutcomeUnknown(f"{lost}; re-reading the pod failed too ({type(again).__name__})") from None
        if pod is None or (uid and str((pod.get("metadata") or {}).get("uid") or "") != uid):
            raise BindError(f"{lost}; the pod is gone") from None
        bound_to = (pod.get("spec") or {}).get("nodeName")
        ours = (pod.get("metadata") or {}).get("annotations", {}).get(ASSIGNMENT_ANNOTATION)
        if bound_to == node and ours == annotations[ASSIGNMENT_ANNOTATION]:
            log.warning("%s: the answer was lost but the Binding was applied (%s)", where, type(exc).__name__)
            return
        if bound_to:
            raise BindError(f"{lost}; the pod is bound to {bound_to} by another writer") from None
        raise BindError(lost) from None

    def _fresh_version(self, where: str, namespace: str, name: str, uid: str, conflict: ApiException) -> str:
        """The pod's current resourceVersion, if it is still the same pod and still unbound."""
        try:
            pod = self.read_pod(namespace, name)
        except Exception as exc:  # noqa: BLE001
            raise BindError(f"{where}: {_api_message(conflict)}; re-reading the pod failed: "
                            f"{type(exc).__name__}: {exc}") from None
        if pod is None:
            raise BindError(f"{where}: the pod was deleted")
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise BindError(f"{where}: the pod was re-created (UID {meta.get('uid')}, not {uid})")
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            raise BindError(f'{where}: pod {name} is already assigned to node "{bound_to}"')
        return str(meta.get("resourceVersion") or "")

    # ---- for the bind gate (and the assignment Event) ----------------------------------------------
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API has it now; None when it does not exist. Other failures raise."""
        try:
            # Untyped on purpose: with _preload_content=False the client hands back the raw response.
            resp: Any = self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout_s,
                                                      _preload_content=False)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise
        try:
            obj: dict[str, Any] = json.loads(resp.data)
        finally:
            resp.release_conn()
        return obj

    def post_event(self, namespace: str, name: str, uid: str, *, reason: str, message: str,
                   event_type: str = "Normal") -> None:
        """Best effort: an Event that fails to post must not fail the bind it reports on."""
        events.post(self.core, events.pod_event(namespace, name, uid, reason=reason, message=message,
                                                event_type=event_type, component=self.component,
                                                instance=self.component), self.timeout_s)


class MemoryBinder:
    """Snapshot / dry-run mode: nothing to write; the store's in-memory state is the only effect.

    No `admission` gate: without a kubelet nothing is ever admitted, so nothing is waited for."""

    blocking = False
    admission = None

    def __init__(self, keys: SigningKeys | None = None) -> None:
        self.keys = keys
        self.bound: dict[str, tuple[str, str, Assignment]] = {}
        self.annotations: dict[str, dict[str, str]] = {}  # pod UID -> what a Binding would have carried

    def bind(self, namespace: str, name: str, uid: str, resource_version: str, assignment: Assignment) -> None:
        self.bound[uid] = (namespace, name, assignment)
        self.annotations[uid] = binding_annotations(assignment, datetime.now(UTC), uid=uid, keys=self.keys)
