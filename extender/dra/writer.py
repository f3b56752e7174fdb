"""The API writes of DRA allocation, in the order kube-scheduler's own allocator makes them (dra.md §4, §8):

1. plain update of the claim: add the finalizer `resource.kubernetes.io/delete-protection` (a status write
   resets finalizers, so it cannot carry it), with the claim's resourceVersion as precondition;
2. `resourceclaims/status` update: `status.allocation`, with the resourceVersion the first write returned
   (409: someone changed the claim; 422: it is allocated already — both end this attempt, nothing half-written
   is left but the finalizer, which the claim controller and `release` honour);
3. once every claim of the pod is allocated: the pod updated without the gate `vramfit.io/allocate`.

Bodies are raw JSON (`_preload_content=False`): the v1 claim model's name would trip the typed client."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from kubeio.events import JSON_HEADERS, pod_event, post
from packing.dra.objects import FINALIZER
from packing.dra.pod_claims import without_gate

log = logging.getLogger("vramfit.dra")


class WriteFailed(Exception):
    """A write was refused (conflict, invalid, fenced); `code` is the HTTP status (0: fenced)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _body(resp: Any) -> dict[str, Any]:
    data = resp.data if hasattr(resp, "data") else resp.read()
    return json.loads(data) if data else {}


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


class ClaimWriter:
    def __init__(self, api: kclient.ApiClient, *, component: str = "vramfit-scheduler", timeout_s: float = 5.0,
                 fence: Callable[[], bool] | None = None) -> None:
        self.api = api
        self.core = kclient.CoreV1Api(api)
        self.resource = kclient.ResourceV1Api(api)
        self.component = component
        self.timeout_s = timeout_s
        self.fence = fence  # leader election's write fence: nothing is written while it says False

    def _check_fence(self) -> None:
        if self.fence is not None and not self.fence():
            raise WriteFailed(0, "not the leader (or the lease is not fresh): nothing written")

    def _call(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        self._check_fence()
        try:
            return _body(fn(*args, _preload_content=False, _request_timeout=self.timeout_s, _headers=JSON_HEADERS))
        except ApiException as exc:
            raise WriteFailed(int(exc.status or 500), _message(exc)) from None

    def protect(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Add the finalizer by a plain update (no-op when present); returns the claim as stored."""
        meta = claim.get("metadata") or {}
        if FINALIZER in (meta.get("finalizers") or ()):
            return claim
        body = copy.deepcopy(claim)
        body["metadata"]["finalizers"] = [*(meta.get("finalizers") or ()), FINALIZER]
        return self._call(self.resource.replace_namespaced_resource_claim, meta["name"], meta["namespace"], body)

    def allocate(self, claim: dict[str, Any], allocation: dict[str, Any]) -> dict[str, Any]:
        """Write `status.allocation` (the claim's resourceVersion is the precondition)."""
        body = copy.deepcopy(claim)
        body.setdefault("status", {})["allocation"] = allocation
        meta = claim["metadata"]
        return self._call(self.resource.replace_namespaced_resource_claim_status, meta["name"], meta["namespace"],
                          body)

    def deallocate(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Clear the allocation (and devices) of an unreserved claim, then drop vramfit's finalizer."""
        meta = claim["metadata"]
        body = copy.deepcopy(claim)
        status = body.setdefault("status", {})
        status.pop("allocation", None)
        status.pop("devices", None)
        stored = self._call(self.resource.replace_namespaced_resource_claim_status, meta["name"], meta["namespace"],
                            body)
        return self.unprotect(stored)

    def unprotect(self, claim: dict[str, Any]) -> dict[str, Any]:
        meta = claim.get("metadata") or {}
        if FINALIZER not in (meta.get("finalizers") or ()):
            return claim
        body = copy.deepcopy(claim)
        body["metadata"]["finalizers"] = [f for f in meta.get("finalizers") or () if f != FINALIZER]
        return self._call(self.resource.replace_namespaced_resource_claim, meta["name"], meta["namespace"], body)

    def ungate(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod without vramfit's gate (a replace with its resourceVersion: gates may only be removed)."""
        body = copy.deepcopy(pod)
        body["spec"]["schedulingGates"] = without_gate(pod)
        if not body["spec"]["schedulingGates"]:
            del body["spec"]["schedulingGates"]
        meta = pod["metadata"]
        return self._call(self.core.replace_namespaced_pod, meta["name"], meta["namespace"], body)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.core.read_namespaced_pod, name, namespace)

    def say_waiting(self, pod: dict[str, Any], reason: str) -> None:
        """A Warning Event on a pod whose claims vramfit cannot allocate (best effort)."""
        meta = pod.get("metadata") or {}
        event = pod_event(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                          reason="FailedAllocation", message=f"vramfit cannot allocate its claims: {reason}",
                          event_type="Warning", component=self.component, instance=self.component)
        post(self.core, event, self.timeout_s)

    def set_condition(self, pod: dict[str, Any], reason: str) -> None:
        """Pod condition `vramfit.io/ClaimsAllocated` False with the reason (a status patch; best effort)."""
        meta = pod.get("metadata") or {}
        patch = {"status": {"conditions": [{"type": CONDITION, "status": "False", "reason": "CannotAllocate",
                                            "message": reason[:1024]}]}}
        try:
            self._check_fence()
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], patch, _preload_content=False,
                                                  _request_timeout=self.timeout_s)
        except (ApiException, WriteFailed) as exc:
            log.info("could not set %s on %s/%s: %s", CONDITION, meta.get("namespace"), meta.get("name"), exc)


CONDITION = "vramfit.io/ClaimsAllocated"
