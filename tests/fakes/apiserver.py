"""A stateful loopback stand-in for the kube-apiserver paths vramfit and its node agent use (tests only).

No kube-apiserver binary exists on these machines; this one keeps the semantics vramfit depends on, read
from the real server (pkg/registry/core/pod/storage, staging/src/k8s.io/apiserver):

- One global resourceVersion counter (etcd's revision). Every write (binding, patch, create, delete,
  status update, event) bumps it and stamps the object's `metadata.resourceVersion`; every write to a pod
  or node appends ADDED / MODIFIED / DELETED to that kind's event log (the watch cache), which keeps the
  last `history` events.
- Lists answer the current objects with the current resourceVersion; watches (`?watch=true`) stream the
  log after `resourceVersion` as chunked JSON lines, then stay open delivering new events until
  `timeoutSeconds`. No resourceVersion (or "0") starts with ADDED for every current object. A version
  older than the retained log gets one ERROR event carrying a 410 `Expired` Status, as the watch cache
  answers ("too old resource version: R (oldest)"). `allowWatchBookmarks=true` adds a BOOKMARK with the
  current version before the stream ends (and every `bookmark_interval_s`, if set).
- `fieldSelector` on lists and watches (`spec.nodeName=X`, `==`, `!=`, comma-joined): a watched object
  entering the selection arrives as ADDED, leaving it as DELETED, like the cacher's filtered watchers.
- Binding (`POST .../pods/{name}/binding`): `metadata.uid` and `metadata.resourceVersion` are preconditions
  (409 Conflict with the storage error's text), a pod being deleted or already assigned is a 409 on
  `pods/binding`, a target not a Node or without a name is a 500 (the validation's errors are not a Status);
  otherwise spec.nodeName, the Binding's annotations merged in, and PodScheduled=True are
  written in one update (one MODIFIED event). The answer is a Success Status, 201.
- PATCH of pods (also `/status`) and nodes with `application/merge-patch+json` or
  `application/strategic-merge-patch+json`; anything else is 415. Strategic merge is treated as a JSON
  merge patch, which is exact for the maps patched here (annotations, labels, status fields) but replaces
  lists wholesale. A `metadata.uid` in a patch is a precondition, as the kubelet's status patches use it.
- Errors are `metav1.Status` objects with the real reasons and messages.

- `resource.k8s.io/v1` (slices, classes, claims, claim templates) and pod updates (PUT/PATCH: scheduling
  gates only shrink, other spec changes refused; a pod created with gates gets PodScheduled=False
  SchedulingGated, as the pod strategy's PrepareForCreate writes it) are served by `fakes.dra_api` through
  the same storage, log and watches; PATCH there also takes `application/json-patch+json`.

Scripted watches (`watch_scripts`) stay for tests of the reflector's edge cases: while a script is queued
for a kind, a watch of that kind answers it instead of the log.

Test helpers are plain methods (no HTTP): `add_pod`, `delete_pod`, `patch_pod`, `set_pod_status`,
`add_node`, `get_pod`, `get_node`, `events_posted`, `compact`, `recorded`, and for DRA `add_slice`,
`add_device_class`, `add_claim` (keeps the status given), `add_claim_template`, `get_claim`, `patch_claim`,
`delete_claim`. Every request is recorded.
"""

from __future__ import annotations

import copy
import json
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CORE_KINDS = ("nodes", "pods", "namespaces")
# resource.k8s.io/v1, served by fakes.dra_api through the same storage, event log and watches.
DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")
KINDS = CORE_KINDS + DRA_KINDS
CLUSTER_SCOPED = ("nodes", "namespaces", "resourceslices", "deviceclasses")
LEASES_PREFIX = "/apis/coordination.k8s.io/v1/namespaces/"
DRA_PREFIX = "/apis/resource.k8s.io/v1/"
ITEM_KIND = {"nodes": "Node", "pods": "Pod", "namespaces": "Namespace", "resourceslices": "ResourceSlice",
             "deviceclasses": "DeviceClass", "resourceclaims": "ResourceClaim",
             "resourceclaimtemplates": "ResourceClaimTemplate"}
LIST_KIND = {kind: f"{item}List" for kind, item in ITEM_KIND.items()}
API_VERSION = {kind: "resource.k8s.io/v1" if kind in DRA_KINDS else "v1" for kind in KINDS}
# The namespaces a new cluster has (the API server creates them at start).
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set on every Namespace by the API server
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH)
# Field selectors the real server supports for these kinds (pkg/registry/core/{pod,node} ToSelectableFields).
SELECTABLE = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
             "status.nominatedNodeName"},
    "nodes": {"metadata.name", "spec.unschedulable"},
    "namespaces": {"metadata.name", "status.phase"},
    # pkg/registry/resource/*/strategy.go
    "resourceslices": {"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"},
    "deviceclasses": {"metadata.name"},
    "resourceclaims": {"metadata.name", "metadata.namespace"},
    "resourceclaimtemplates": {"metadata.name", "metadata.namespace"},
}
DEFAULT_WATCH_TIMEOUT_S = 30.0
_POLL_S = 0.25  # a waiting watch checks this often whether its client hung up


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `metav1.Status` failure object as the API server writes it."""
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


class ApiError(Exception):
    """Answer the request with this Status."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body["message"])
        self.code = int(body["code"])
        self.body = body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}))


def conflict(resource: str, name: str, why: str) -> ApiError:
    """errors.NewConflict: 'Operation cannot be fulfilled on <resource> "<name>": <why>'."""
    return ApiError(status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                           {"name": name, "kind": resource}))


def bad_request(message: str) -> ApiError:
    return ApiError(status(400, "BadRequest", message))


def _precondition_failed(namespace: str, name: str, what: str, wanted: str, actual: str) -> ApiError:
    # storage.Preconditions.Check -> NewInvalidObjError -> InterpretUpdateError -> NewConflict("pods").
    return conflict("pods", name, f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{name}, "
                                  f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {what} in "
                                  f"precondition: {wanted}, {what} in object meta: {actual}")


def _check_binding_target(target: Mapping[str, Any]) -> None:
    """ValidatePodBinding. BindingREST.Create returns its field errors as a plain aggregate (not a StatusError),
    so the server answers 500 with no reason: ErrorToAPIStatus's fallback."""
    errs = []
    if target.get("kind") not in (None, "", "Node"):
        errs.append(f'target.kind: Unsupported value: "{target["kind"]}": supported values: "Node", "<empty>"')
    if not target.get("name"):
        errs.append("target.name: Required value")
    if errs:
        body = status(500, "", errs[0] if len(errs) == 1 else f"[{', '.join(errs)}]")
        del body["reason"]  # StatusReasonUnknown is "", omitted from the JSON
        raise ApiError(body)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WatchScript:
    """What one watch call answers: these lines, then either a clean end or a cut mid-line."""

    events: list[dict[str, Any]]
    break_midway: bool = False  # send half of one more line and drop the connection
    hold_s: float = 0.0  # keep the stream open this long after the events (bounded)
    http_status: int = 200  # non-200: answer with a Status object instead of a stream (e.g. 410 Gone)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class _Event:
    rv: int
    type: str
    obj: dict[str, Any]  # the object after the write (for DELETED: its last state, at the delete's version)
    prev: dict[str, Any] | None  # before the write (None for ADDED)


@dataclass(frozen=True)
class _Selector:
    """A parsed fieldSelector: (path, want equal?, value) terms, all of which must hold."""

    terms: tuple[tuple[str, bool, str], ...] = ()
    namespace: str | None = None  # from a namespaced path

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return all((_field(obj, path) == value) == equal for path, equal, value in self.terms)


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_field_selector(kind: str, text: str, namespace: str | None) -> _Selector:
    terms: list[tuple[str, bool, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        op = next((o for o in ("!=", "==", "=") if o in raw), None)
        if op is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{raw}'")
        path, value = raw.split(op, 1)
        equal = op != "!="
        path = path.strip()
        if path not in SELECTABLE[kind]:
            raise bad_request(f'field label not supported: {path}')
        terms.append((path, equal, value.strip()))
    return _Selector(tuple(terms), namespace)


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386), in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        elif isinstance(value, dict):
            target[key] = {}
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class FakeApiServer:
    """Start with `start()`; `url` is `http://127.0.0.1:<port>`. Thread-safe; stop with `stop()`.

    `nodes` and `pods` are the live objects (the server's storage), stamped with resourceVersions at start."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # Namespace objects; the system ones are added when missing, as a real cluster has them.
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    resource_version: int = 1000  # the global counter: the last version written
    watch_scripts: dict[str, list[WatchScript]] = field(
        default_factory=lambda: {"nodes": [], "pods": [], "namespaces": []})
    # Optional hooks: (recorded request) -> (code, body dict) to inject failures; None = default handling.
    on_patch: Callable[[Recorded], tuple[int, dict[str, Any]] | None] | None = None
    on_binding: Callable[[Recorded], tuple[int, dict[str, Any]] | None] | None = None
    requests: list[Recorded] = field(default_factory=list)
    history: int = 1000  # watch events kept per kind; a watch from before them gets 410 Expired
    bookmark_interval_s: float | None = None  # None: one BOOKMARK as a bookmark-enabled watch ends

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._log: dict[str, deque[_Event]] = {k: deque() for k in KINDS}
        self._dra: dict[str, list[dict[str, Any]]] = {k: [] for k in DRA_KINDS}  # resource.k8s.io objects
        self._events: list[dict[str, Any]] = []
        have = {(o.get("metadata") or {}).get("name") for o in self.namespaces}
        self.namespaces.extend(namespace_object(n) for n in SYSTEM_NAMESPACES if n not in have)
        for ns in self.namespaces:
            _namespace_defaults(ns)
        # Initial objects were written before the log begins: versions up to the counter, none watchable.
        objs = [*self.nodes, *self.pods, *self.namespaces]
        first = self.resource_version - len(objs) + 1
        for k, obj in enumerate(objs):
            obj.setdefault("metadata", {})["resourceVersion"] = str(first + k)
        self._leases: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> coordination/v1 Lease
        self.lease_outage = False  # True: every Lease request fails with 503 (a partitioned replica's view)
        # Kinds whose LISTs (not watches) fail with a 500 "etcdserver: request timed out", as an overloaded etcd
        # answers; only for clients whose User-Agent contains `failing_lists_agent`, if set.
        self.failing_lists: set[str] = set()
        self.failing_lists_agent: str | None = None
        self._floor = {k: self.resource_version for k in KINDS}  # a watch from below this has expired
        self._last = {k: self.resource_version for k in KINDS}  # version of each kind's latest event

    # ---- storage (lock held) ----------------------------------------------------------------------
    def _store(self, kind: str) -> list[dict[str, Any]]:
        if kind in DRA_KINDS:
            return self._dra[kind]
        return {"nodes": self.nodes, "pods": self.pods, "namespaces": self.namespaces}[kind]

    def _find(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        for obj in self._store(kind):
            meta = obj.get("metadata") or {}
            if meta.get("name") == name and (kind in CLUSTER_SCOPED or meta.get("namespace") == namespace):
                return obj
        return None

    def _find_pod(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._find("pods", namespace, name)

    def _bump(self) -> int:
        self.resource_version += 1
        return self.resource_version

    def _write(self, kind: str, etype: str, obj: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any]:
        """Stamp a new version on `obj` (already in storage, or just removed) and log the event."""
        rv = self._bump()
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        log = self._log[kind]
        log.append(_Event(rv, etype, copy.deepcopy(obj), prev))
        self._last[kind] = rv
        while len(log) > self.history:
            self._floor[kind] = log.popleft().rv
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = str(meta.get("name") or "")
        if not name:
            raise ApiError(status(422, "Invalid", f"{ITEM_KIND[kind]} \"\" is invalid: metadata.name: Required value"))
        if self._find(kind, meta.get("namespace"), name) is not None:
            raise ApiError(status(409, "AlreadyExists", f'{kind} "{name}" already exists',
                                  {"name": name, "kind": kind}))
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        if kind == "pods":
            meta.setdefault("namespace", "default")
            obj.setdefault("spec", {})
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            dra_api.scheduling_gated_condition(obj)
        if kind == "namespaces":
            _namespace_defaults(obj)
        self._store(kind).append(obj)
        return self._write(kind, "ADDED", obj, None)

    def _modify(self, kind: str, namespace: str | None, name: str,
                change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        obj = self._find(kind, namespace, name)
        if obj is None:
            raise not_found(kind, name)
        prev = copy.deepcopy(obj)
        change(obj)
        return self._write(kind, "MODIFIED", obj, prev)

    def _delete(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._find(kind, namespace, name)
        if obj is None:
            raise not_found(kind, name)
        self._store(kind).remove(obj)
        return self._write(kind, "DELETED", obj, copy.deepcopy(obj))

    # ---- test helpers (no HTTP) ------------------------------------------------------------------
    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod (uid and creationTimestamp filled in when missing); returns the stored copy."""
        with self._lock:
            return self._create("pods", pod)

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return self._create("nodes", node)

    def add_namespace(self, name: str, *, labels: dict[str, str] | None = None,
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a Namespace (ADDED); returns the stored copy."""
        with self._lock:
            return self._create("namespaces", namespace_object(name, labels, annotations))

    def patch_namespace(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of a Namespace (MODIFIED), as `kubectl label/annotate ns` writes."""
        with self._lock:
            return self._modify("namespaces", None, name, lambda ns: merge_patch(ns, patch))

    def delete_pod(self, namespace: str, name: str, *, graceful: bool = False) -> None:
        """Remove the pod (DELETED); `graceful`: only set deletionTimestamp (MODIFIED), as for a bound pod
        whose kubelet has not yet finished it."""
        with self._lock:
            if graceful:
                self._modify("pods", namespace, name,
                             lambda p: p["metadata"].setdefault("deletionTimestamp", now_rfc3339()))
            else:
                self._delete("pods", namespace, name)

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch, as a controller would write one."""
        with self._lock:
            return self._modify("pods", namespace, name, lambda p: merge_patch(p, patch))

    def set_pod_status(self, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
        """Write status fields as the kubelet would (e.g. startTime="...", phase="Running"); None removes."""
        with self._lock:
            return self._modify("pods", namespace, name, lambda p: merge_patch(p.setdefault("status", {}), fields))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._find("pods", namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    # resource.k8s.io/v1 (no HTTP): created as the registry would; a claim keeps the status it is given.
    def add_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return dra_api.create(self, "resourceslices", None, obj)

    def add_device_class(self, obj: dict[str, Any]) -> dict[str, Any]:
        return dra_api.create(self, "deviceclasses", None, obj)

    def add_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
        return dra_api.create(self, "resourceclaims", namespace, obj, keep_status=True)

    def add_claim_template(self, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
        return dra_api.create(self, "resourceclaimtemplates", namespace, obj)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._find("resourceclaims", namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    def patch_claim(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of a claim with no checks (another writer's change, MODIFIED)."""
        with self._lock:
            return self._modify("resourceclaims", namespace, name, lambda c: merge_patch(c, patch))

    def delete_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """As DELETE does: with finalizers only deletionTimestamp is set."""
        return dra_api.delete(self, "resourceclaims", namespace, name)

    def delete_slice(self, name: str) -> dict[str, Any]:
        """A ResourceSlice deleted (its driver went away), as DELETE does."""
        return dra_api.delete(self, "resourceslices", None, name)

    def get_node(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._find("nodes", None, name)
            return copy.deepcopy(obj) if obj is not None else None

    def events_posted(self) -> list[dict[str, Any]]:
        """The Event objects clients created, in order."""
        with self._lock:
            return copy.deepcopy(self._events)

    def compact(self) -> None:
        """Drop the retained watch history (etcd compaction): a watch from any older version gets 410."""
        with self._lock:
            for kind in KINDS:
                self._log[kind].clear()
                self._floor[kind] = self.resource_version

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            lease = self._leases.get((namespace, name))
            return copy.deepcopy(lease) if lease is not None else None

    # ---- coordination.k8s.io/v1 Leases (what leader election uses: get, create, update) -----------
    # Optimistic concurrency as the registry does it (pkg/registry/coordination/lease/strategy.go): an update
    # must carry the stored resourceVersion (a stale one is 409 Conflict "the object has been modified"; none is
    # 422, AllowUnconditionalUpdate is false), and a PUT of a missing Lease creates it (AllowCreateOnUpdate).
    def lease_get(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            lease = self._leases.get((namespace, name))
            if lease is None:
                raise ApiError(status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found',
                                      {"name": name, "group": "coordination.k8s.io", "kind": "leases"}))
            return copy.deepcopy(lease)

    def lease_create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            meta = body.setdefault("metadata", {})
            name = str(meta.get("name") or "")
            if (namespace, name) in self._leases:
                raise ApiError(status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists',
                                      {"name": name, "group": "coordination.k8s.io", "kind": "leases"}))
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=str(self._bump()),
                        creationTimestamp=now_rfc3339())
            body.setdefault("apiVersion", "coordination.k8s.io/v1")
            body.setdefault("kind", "Lease")
            self._leases[(namespace, name)] = copy.deepcopy(body)
            return copy.deepcopy(body)

    def lease_update(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            current = self._leases.get((namespace, name))
            if current is None:
                # leaseStrategy.AllowCreateOnUpdate is true: a PUT of a missing Lease creates it.
                body.setdefault("metadata", {})["name"] = name
                return self.lease_create(namespace, body)
            rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
            if not rv:
                raise ApiError(status(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                      "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"))
            if rv != current["metadata"]["resourceVersion"]:
                raise ApiError(status(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io '
                                      f'"{name}": the object has been modified; please apply your changes to the '
                                      "latest version and try again",
                                      {"name": name, "group": "coordination.k8s.io", "kind": "leases"}))
            updated = copy.deepcopy(body)
            updated["metadata"] = dict(current["metadata"], resourceVersion=str(self._bump()))
            self._leases[(namespace, name)] = updated
            return copy.deepcopy(updated)

    def recorded(self, method: str, suffix: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    # ---- request handling (called by the HTTP handler) -------------------------------------------
    def list_objects(self, kind: str, selector: _Selector) -> dict[str, Any]:
        with self._lock:
            items = [copy.deepcopy(o) for o in self._store(kind) if selector.matches(o)]
            rv = str(self.resource_version)
        return {"kind": LIST_KIND[kind], "apiVersion": API_VERSION[kind], "metadata": {"resourceVersion": rv},
                "items": items}

    def get_object(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self._find(kind, namespace, name)
            if obj is None:
                raise not_found(kind, name)
            return copy.deepcopy(obj)

    def patch_object(self, kind: str, namespace: str | None, name: str, content_type: str, body: bytes,
                     status_only: bool = False) -> dict[str, Any]:
        if content_type not in PATCH_TYPES:
            raise ApiError(status(415, "UnsupportedMediaType",
                                  f"the body of the request was in an unknown format - accepted media types "
                                  f"include: application/json-patch+json, {MERGE_PATCH}, "
                                  f"application/apply-patch+yaml, {STRATEGIC_MERGE_PATCH}"))
        try:
            patch = json.loads(body or b"{}")
        except ValueError as exc:
            raise bad_request(f"error decoding patch: {exc}") from None
        if not isinstance(patch, dict):
            raise bad_request("error decoding patch: not a JSON object")

        def change(obj: dict[str, Any]) -> None:
            want_uid = (patch.get("metadata") or {}).get("uid")
            have_uid = (obj.get("metadata") or {}).get("uid")
            if want_uid and want_uid != have_uid:
                raise conflict(kind, name, f"Precondition failed: UID in precondition: {want_uid}, "
                                           f"UID in object meta: {have_uid}")
            # The status subresource writes status only; the main resource leaves status alone
            # (the pod and node strategies' PrepareForUpdate copy the other part back).
            if status_only:
                merge_patch(obj.setdefault("status", {}), patch.get("status") or {})
            else:
                merge_patch(obj, {k: v for k, v in patch.items() if k != "status"})

        with self._lock:
            return self._modify(kind, namespace, name, change)

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if meta.get("namespace") not in (None, namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace
        with self._lock:
            return self._create("pods", body)

    def delete_pod_request(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return self._delete("pods", namespace, name)

    def bind(self, namespace: str, name: str, binding: dict[str, Any]) -> dict[str, Any]:
        """BindingREST.Create -> assignPod -> setPodHostAndAnnotations, in one update."""
        meta = binding.get("metadata") or {}
        if meta.get("name") != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        _check_binding_target(target)
        want_uid = str(meta.get("uid") or "")
        want_rv = str(meta.get("resourceVersion") or "")
        with self._lock:
            pod = self._find("pods", namespace, name)
            if pod is None:
                raise not_found("pods", name)
            pmeta = pod["metadata"]
            if want_uid and want_uid != pmeta.get("uid"):
                raise _precondition_failed(namespace, name, "UID", want_uid, str(pmeta.get("uid")))
            if want_rv and want_rv != pmeta.get("resourceVersion"):
                raise _precondition_failed(namespace, name, "ResourceVersion", want_rv,
                                           str(pmeta.get("resourceVersion")))
            spec = pod.setdefault("spec", {})
            if pmeta.get("deletionTimestamp"):
                raise conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
            if spec.get("nodeName"):
                raise conflict("pods/binding", name,
                               f'pod {name} is already assigned to node "{spec["nodeName"]}"')
            if spec.get("schedulingGates"):
                raise conflict("pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates")

            def assign(p: dict[str, Any]) -> None:
                p["spec"]["nodeName"] = target["name"]
                annotations = p["metadata"].get("annotations") or {}
                annotations.update({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()})
                p["metadata"]["annotations"] = annotations
                _set_scheduled(p.setdefault("status", {}))

            self._modify("pods", namespace, name, assign)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def record_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            event = copy.deepcopy(event)
            meta = event.setdefault("metadata", {})
            meta["namespace"] = namespace
            meta.setdefault("name", f"{meta.get('generateName') or 'event.'}{uuid.uuid4().hex[:10]}")
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(self._bump())
            self._events.append(event)
            return copy.deepcopy(event)

    # ---- watches ----------------------------------------------------------------------------------
    def watch_start(self, kind: str, since: str, selector: _Selector) -> tuple[list[dict[str, Any]], int]:
        """The events a new watch sends first, and the version it continues from. Raises ApiError (410)
        only as the ERROR event the caller streams."""
        with self._lock:
            if since in ("", "0"):  # "any version": the current state as ADDED, then what follows
                objs = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self._store(kind)
                        if selector.matches(o)]
                return objs, self._last[kind]
            try:
                rv = int(since)
            except ValueError:
                raise bad_request(f'resourceVersion: Invalid value: "{since}": strconv.ParseUint: '
                                  'parsing: invalid syntax') from None
            if rv < self._floor[kind]:
                raise ApiError(status(410, "Expired", f"too old resource version: {rv} ({self._floor[kind]})"))
            return self._events_after(kind, rv, selector), max(rv, self._last[kind])

    def _events_after(self, kind: str, rv: int, selector: _Selector) -> list[dict[str, Any]]:
        out = []
        for ev in self._log[kind]:
            if ev.rv > rv:
                line = _filtered(ev, selector)
                if line is not None:
                    out.append(line)
        return out

    def watch_next(self, kind: str, after: int, selector: _Selector,
                   timeout_s: float) -> tuple[list[dict[str, Any]], int]:
        """Block until events after `after` exist (or the timeout, or stop); returns them and the new mark."""
        with self._cond:
            if self._last[kind] <= after and not self._stopping.is_set():
                self._cond.wait(timeout_s)
            return self._events_after(kind, after, selector), max(after, self._last[kind])

    def bookmark(self, kind: str) -> dict[str, Any]:
        with self._lock:
            rv = str(self.resource_version)
        return {"type": "BOOKMARK", "object": {"kind": ITEM_KIND[kind], "apiVersion": API_VERSION[kind],
                                               "metadata": {"resourceVersion": rv}}}

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeApiServer:
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="fake-apiserver")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()  # open watches end now
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def namespace_object(name: str, labels: dict[str, str] | None = None,
                     annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}}


def _namespace_defaults(obj: dict[str, Any]) -> None:
    """What the API server sets on every Namespace: uid, creationTimestamp, the name label, phase Active."""
    meta = obj.setdefault("metadata", {})
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", now_rfc3339())
    meta.setdefault("labels", {})[LABEL_NAMESPACE_NAME] = str(meta.get("name") or "")
    obj.setdefault("status", {}).setdefault("phase", "Active")


def _set_scheduled(status_obj: dict[str, Any]) -> None:
    """podutil.UpdatePodCondition with PodScheduled=True: the condition is replaced; its transition time
    moves only if the status changed."""
    conditions = status_obj.setdefault("conditions", [])
    new = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    for k, cond in enumerate(conditions):
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "True":
                new["lastTransitionTime"] = cond.get("lastTransitionTime")
            conditions[k] = new
            return
    conditions.append(new)


def _filtered(ev: _Event, selector: _Selector) -> dict[str, Any] | None:
    """The event as a filtered watcher sees it (cacher's convertToWatchEvent)."""
    now = ev.type != "DELETED" and selector.matches(ev.obj)
    before = ev.prev is not None and selector.matches(ev.prev)
    if now and before:
        return {"type": "MODIFIED", "object": copy.deepcopy(ev.obj)}
    if now:
        return {"type": "ADDED", "object": copy.deepcopy(ev.obj)}
    if before:  # left the selection (or was deleted): DELETED with its last matching state at this version
        gone = copy.deepcopy(ev.prev)
        assert gone is not None
        gone.setdefault("metadata", {})["resourceVersion"] = str(ev.rv)
        return {"type": "DELETED", "object": gone}
    return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up mid-stream on purpose in these tests


@dataclass(frozen=True)
class _Route:
    kind: str  # "nodes" | "pods" | "events"
    namespace: str | None
    name: str | None
    sub: str | None  # "binding" | "status" | None


def parse_path(path: str) -> _Route | None:
    """/api/v1/{nodes|pods}[/{name}[/{sub}]], /api/v1/namespaces[/{name}] and
    /api/v1/namespaces/{ns}/{pods|events}[/{name}[/{sub}]]."""
    parts = path.strip("/").split("/")
    if parts[:2] != ["api", "v1"]:
        return None
    rest = parts[2:]
    if rest and rest[0] == "namespaces" and len(rest) <= 2:
        return _Route("namespaces", None, rest[1] if len(rest) == 2 else None, None)
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in ("nodes", "pods", "events") or len(rest) > 3:
        return None
    if rest[0] == "nodes" and namespace is not None:
        return None
    return _Route(rest[0], namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


def _method_not_allowed() -> ApiError:
    return ApiError(status(405, "MethodNotAllowed", "the server does not allow this method"))


def _no_such_resource() -> ApiError:
    return ApiError(status(404, "NotFound", "the server could not find the requested resource"))


def _namespaced(route: _Route) -> str:
    """Creates, bindings and deletes exist only under /namespaces/{ns}/ (cluster-wide paths are read-only)."""
    if route.namespace is None:
        raise _method_not_allowed()
    return route.namespace


def _shape(route: _Route) -> str:
    """The part of a resource a path names: its collection, one item, or an item's subresource."""
    if route.name is None:
        return "collection"
    return route.sub or "item"


def _unrouted(method: str, route: _Route) -> ApiError:
    # A known resource answers an unserved verb with 405; a GET of an unknown subresource is a 404
    # (events are write-only here, so any GET of them is a 405).
    if method == "GET" and route.kind != "events":
        return _no_such_resource()
    return _method_not_allowed()


_Answer = tuple[int, Any] | None
_RouteHandler = Callable[["_Handler", Recorded, _Route], _Answer]


def _get_item(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    return 200, h.fake.get_object(route.kind, route.namespace, route.name or "")


def _list_or_watch(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    fake = h.fake
    selector = parse_field_selector(route.kind, _q(rec, "fieldSelector"), route.namespace)
    if _q(rec, "watch") in ("true", "1"):
        h.watch(rec, route.kind, selector)
        return None
    agent = fake.failing_lists_agent
    if route.kind in fake.failing_lists and (agent is None or agent in rec.headers.get("user-agent", "")):
        raise ApiError(status(500, "InternalError", "Internal error occurred: etcdserver: request timed out"))
    return 200, fake.list_objects(route.kind, selector)


def _patch_item(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    content_type = rec.headers.get("content-type", "").split(";")[0].strip()
    return 200, h.fake.patch_object(route.kind, route.namespace, route.name or "", content_type, rec.body,
                                    status_only=route.sub == "status")


def _create_event(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    return 201, h.fake.record_event(_namespaced(route), _json_body(rec))


def _create_pod(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    return 201, h.fake.create_pod(_namespaced(route), _json_body(rec))


def _bind_pod(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    namespace = _namespaced(route)
    injected = h.fake.on_binding(rec) if h.fake.on_binding else None
    if injected is not None:
        return injected
    return 201, h.fake.bind(namespace, route.name or "", _json_body(rec))


def _delete_pod(h: _Handler, rec: Recorded, route: _Route) -> _Answer:
    return 200, h.fake.delete_pod_request(_namespaced(route), route.name or "")


# (method, resource, shape) -> handler; everything else is _unrouted. Only Leases are replaced (PUT) by
# vramfit, and they are served before routing.
ROUTES: dict[tuple[str, str, str], _RouteHandler] = {
    **{("GET", kind, "collection"): _list_or_watch for kind in CORE_KINDS},
    **{("GET", kind, "item"): _get_item for kind in CORE_KINDS},
    **{("PATCH", kind, shape): _patch_item for kind in CORE_KINDS for shape in ("item", "status")},
    # Pod updates check the spec rules (scheduling gates only shrink): fakes.dra_api.
    ("PATCH", "pods", "item"): lambda h, rec, route: dra_api.pod_write(h, rec, route),
    ("PUT", "pods", "item"): lambda h, rec, route: dra_api.pod_write(h, rec, route),
    ("POST", "events", "collection"): _create_event,
    ("POST", "pods", "collection"): _create_pod,
    ("POST", "pods", "binding"): _bind_pod,
    ("DELETE", "pods", "item"): _delete_pod,
    ("POST", "pods", "eviction"): lambda h, rec, route: eviction_api.evict(h, rec, route),
}


def _json_body(rec: Recorded) -> dict[str, Any]:
    try:
        body = json.loads(rec.body or b"{}")
    except ValueError as exc:
        raise bad_request(f"error decoding body: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("error decoding body: not a JSON object")
    return body


def _answer_lease(fake: FakeApiServer, method: str, rec: Recorded) -> tuple[int, Any]:
    if fake.lease_outage:
        raise ApiError(status(503, "ServiceUnavailable", "the server is currently unable to handle the request"))
    parts = rec.path[len(LEASES_PREFIX):].strip("/").split("/")
    if len(parts) < 2 or parts[1] != "leases" or len(parts) > 3:
        raise _no_such_resource()
    namespace, name = parts[0], parts[2] if len(parts) == 3 else None
    if method == "GET" and name:
        return 200, fake.lease_get(namespace, name)
    if method == "POST" and name is None:
        return 201, fake.lease_create(namespace, _json_body(rec))
    if method == "PUT" and name:
        return 200, fake.lease_update(namespace, name, _json_body(rec))
    raise _method_not_allowed()


def _answer(h: _Handler, rec: Recorded) -> _Answer:
    if rec.path.startswith(LEASES_PREFIX):
        return _answer_lease(h.fake, h.command, rec)
    injected = h.fake.on_patch(rec) if h.command == "PATCH" and h.fake.on_patch else None
    if injected is not None:
        return injected
    if rec.path.startswith(DRA_PREFIX):
        return dra_api.answer(h, rec, _list_or_watch)
    route = parse_path(rec.path)
    if route is None:
        raise _no_such_resource()
    handler = ROUTES.get((h.command, route.kind, _shape(route)))
    if handler is None:
        raise _unrouted(h.command, route)
    return handler(h, rec, route)


class _Handler(BaseHTTPRequestHandler):
    """Records each request, then answers it from ROUTES; `fake` is set per server by _handler_for."""

    protocol_version = "HTTP/1.1"
    fake: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # -- plumbing -----------------------------------------------------------------------------------
    def _record(self) -> Recorded:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rec = Recorded(self.command, parts.path, parse_qs(parts.query),
                       {k.lower(): v for k, v in self.headers.items()}, body)
        with self.fake._lock:
            self.fake.requests.append(rec)
        return rec

    def _send(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self) -> None:
        rec = self._record()
        try:
            result = _answer(self, rec)
        except ApiError as err:
            self._send(err.code, err.body)
            return
        if result is not None:
            self._send(*result)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815 - stdlib naming

    # -- watch streams ------------------------------------------------------------------------------
    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _lines(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._chunk(json.dumps(event).encode() + b"\n")

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def watch(self, rec: Recorded, kind: str, selector: _Selector) -> None:
        with self.fake._lock:
            scripts = self.fake.watch_scripts.get(kind, [])
            script = scripts.pop(0) if scripts else None
        try:
            if script is not None:
                self._scripted(script)
            else:
                self._live(rec, kind, selector)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream

    def _scripted(self, script: WatchScript) -> None:
        if script.http_status != 200:
            reason = "Expired" if script.http_status == 410 else "InternalError"
            self._send(script.http_status, status(script.http_status, reason,
                                                  "too old resource version: 1 (1000)"))
            return
        self._open_stream()
        self._lines(script.events)
        if script.break_midway:
            self._chunk(b'{"type":"MODIFIED","object":{"metadata":')
            self.close_connection = True
            self.wfile.flush()
            return  # no terminating chunk: the client sees a truncated stream
        self.fake.stopping.wait(script.hold_s)
        self._end_stream()

    def _live(self, rec: Recorded, kind: str, selector: _Selector) -> None:
        timeout_s = float(_q(rec, "timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = _q(rec, "allowWatchBookmarks") == "true"
        try:
            first, mark = self.fake.watch_start(kind, _q(rec, "resourceVersion"), selector)
        except ApiError as err:
            if err.code != 410:
                raise
            # The watch cache answers an expired version inside the stream, as one ERROR event.
            self._open_stream()
            self._lines([{"type": "ERROR", "object": err.body}])
            self._end_stream()
            return
        self._open_stream()
        self._lines(first)
        deadline = time.monotonic() + timeout_s
        next_bookmark = time.monotonic() + (self.fake.bookmark_interval_s or timeout_s + 1)
        while not self.fake.stopping.is_set():
            now = time.monotonic()
            if now >= deadline or self._client_gone():
                break
            if bookmarks and now >= next_bookmark:
                self._lines([self.fake.bookmark(kind)])
                next_bookmark = now + (self.fake.bookmark_interval_s or timeout_s + 1)
            wait = min(deadline, next_bookmark) - now
            events, mark = self.fake.watch_next(kind, mark, selector, max(0.0, min(wait, _POLL_S)))
            self._lines(events)
        if self.fake.stopping.is_set() or self._client_gone():
            self.close_connection = True
            return
        if bookmarks:
            self._lines([self.fake.bookmark(kind)])
        self._end_stream()

    def _client_gone(self) -> bool:
        """A watch client sends nothing after its request: a readable socket means it hung up."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


def _handler_for(fake: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"fake": fake})


def _q(rec: Recorded, name: str) -> str:
    values = rec.query.get(name)
    return values[0] if values else ""


# Imported last: dra_api builds on the names above (the handlers reach it only at request time).
from fakes import dra_api, eviction_api  # noqa: E402
