"""`POST /api/v1/namespaces/{ns}/pods/{name}/eviction` for the fake API server, in the real server's shape.

The body is a policy/v1 Eviction (`metadata.name` the pod's, optional `deleteOptions.preconditions.uid` and
`.resourceVersion`). As pkg/registry/core/pod/storage/eviction.go (EvictionREST.Create) answers:
- 404 when there is no such pod (the store's Get: `pods "<name>" not found`);
- a pod that is Pending, Succeeded, Failed or already deleting skips the PodDisruptionBudget check (canIgnorePDB);
- otherwise 429 TooManyRequests (`Cannot evict pod as it would violate the pod's disruption budget.`, one cause
  of reason `DisruptionBudget`) when a PDB allows no disruption now; the PDB check comes before the delete, so
  a blocked eviction with a stale UID is still 429;
- the delete checks the preconditions (staging/.../registry/rest/delete.go BeforeDelete): 409 Conflict
  `Operation cannot be fulfilled on Pod "<name>": the UID in the precondition (...) does not match ...`;
- success: 201 and a Status `Success` (the create handler fills in code 201).
This fake has no PDB objects: `set_pdb_blocks(fake, rule)` decides, per (namespace, name), whether one blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

PdbRule = Callable[[str, str], bool]  # (namespace, pod name) -> a PDB blocks its eviction now


def set_pdb_blocks(fake: Any, rule: PdbRule | None, pdb_name: str = "budget") -> None:
    fake.pdb_blocks = rule
    fake.pdb_name = pdb_name


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return code, body


def _can_ignore_pdb(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _precondition_conflict(name: str, pod: dict[str, Any], preconditions: dict[str, Any]) -> tuple[int, Any] | None:
    """BeforeDelete's early check; the conflict names the kind (`Pod`), not the resource."""
    meta = pod.get("metadata") or {}
    for field, label, tail in (("uid", "UID", "deleted and then recreated"), ("resourceVersion", "ResourceVersion",
                                                                              "modified")):
        want, have = preconditions.get(field), meta.get(field)
        if want is not None and want != have:
            return _status(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": the {label} in the '
                                            f"precondition ({want}) does not match the {label} in record ({have}). "
                                            f"The object might have been {tail}", {"name": name, "kind": "Pod"})
    return None


def _pdb_blocked(h: Any, namespace: str, name: str) -> tuple[int, Any] | None:
    rule: PdbRule | None = getattr(h.fake, "pdb_blocks", None)
    if rule is None or not rule(namespace, name):
        return None
    pdb = getattr(h.fake, "pdb_name", "budget")
    # checkAndDecrement with DisruptionsAllowed == 0: retryAfterSeconds 0 is omitted from the details
    return _status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                   {"causes": [{"reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb} needs 1 healthy pods and has 1 currently"}]})


def _parse(rec: Any, name: str) -> dict[str, Any] | tuple[int, Any]:
    try:
        body = json.loads(rec.body or b"{}")
    except ValueError as exc:
        return _status(400, "BadRequest", f"error decoding body: {exc}")
    if not isinstance(body, dict) or body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
        return _status(400, "BadRequest", "expected a policy/v1 Eviction")
    if (body.get("metadata") or {}).get("name") != name:
        return _status(400, "BadRequest", "name in URL does not match name in Eviction object")
    return body


def evict(h: Any, rec: Any, route: Any) -> tuple[int, Any]:
    """The route handler (`ROUTES[("POST", "pods", "eviction")]` in fakes.apiserver)."""
    namespace, name = route.namespace, route.name or ""
    if namespace is None:
        return _status(405, "MethodNotAllowed", "the server does not allow this method")
    body = _parse(rec, name)
    if isinstance(body, tuple):
        return body
    pod = h.fake.get_pod(namespace, name)
    if pod is None:
        return _status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
    refused = None if _can_ignore_pdb(pod) else _pdb_blocked(h, namespace, name)
    preconditions = (body.get("deleteOptions") or {}).get("preconditions") or {}
    refused = refused or _precondition_conflict(name, pod, preconditions)
    if refused is not None:
        return refused
    h.fake.delete_pod_request(namespace, name)
    return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
