"""`POST /api/v1/namespaces/{ns}/pods/{name}/eviction` for the fake API server, in the real server's shape.

The body is a policy/v1 Eviction (`metadata.name` the pod's, optional `deleteOptions.preconditions.uid`). As
pkg/registry/core/pod/storage/eviction.go answers: 201 and a Success Status when the pod is deleted; 404 when
there is no such pod; 409 Conflict when the UID precondition names another pod; 429 TooManyRequests (reason
`TooManyRequests`, cause `DisruptionBudget`) when a PodDisruptionBudget allows no disruption now. This fake has
no PDB objects: `set_pdb_blocks(fake, rule)` decides, per (namespace, name), whether one blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

PdbRule = Callable[[str, str], bool]  # (namespace, pod name) -> a PDB blocks its eviction now


def set_pdb_blocks(fake: Any, rule: PdbRule | None) -> None:
    fake.pdb_blocks = rule


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return code, body


def evict(h: Any, rec: Any, route: Any) -> tuple[int, Any]:
    """The route handler (`ROUTES[("POST", "pods", "eviction")]` in fakes.apiserver)."""
    namespace, name = route.namespace, route.name or ""
    if namespace is None:
        return _status(405, "MethodNotAllowed", "the server does not allow this method")
    try:
        body = json.loads(rec.body or b"{}")
    except ValueError as exc:
        return _status(400, "BadRequest", f"error decoding body: {exc}")
    if not isinstance(body, dict) or body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
        return _status(400, "BadRequest", "expected a policy/v1 Eviction")
    if (body.get("metadata") or {}).get("name") != name:
        return _status(400, "BadRequest", "name in URL does not match name in Eviction object")
    pod = h.fake.get_pod(namespace, name)
    details = {"name": name, "kind": "pods"}
    if pod is None:
        return _status(404, "NotFound", f'pods "{name}" not found', details)
    want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
    have = (pod.get("metadata") or {}).get("uid")
    if want and want != have:
        return _status(409, "Conflict", f"Precondition failed: UID in precondition: {want}, UID in object meta: "
                                        f"{have}", details)
    rule: PdbRule | None = getattr(h.fake, "pdb_blocks", None)
    if rule is not None and rule(namespace, name):
        return _status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                       {"causes": [{"reason": "DisruptionBudget",
                                    "message": "The disruption budget needs 1 healthy pods and has 1 currently"}]})
    h.fake.delete_pod_request(namespace, name)
    return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
