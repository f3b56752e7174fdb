"""Small emulators of the Kubernetes components that act on DRA claims, driven over HTTP (tests only).

They speak to an API server through the official `kubernetes` client (`CoreV1Api`, `ResourceV1Api`), so a
test of vramfit's allocator can run them against the fake API server as a cluster would:

- `create_template_claims`: the resource-claim controller's template step for one pod
  (pkg/controller/resourceclaim/controller.go `handleClaim`): a claim per template, then
  `pod.status.resourceClaimStatuses`.
- `SchedulerEmulator`: kube-scheduler's DynamicResources plugin for a pod whose claims are already allocated
  (dra.md §6): gated pods are not tried, Filter by each allocation's nodeSelector, PreBind adds the pod to
  `reservedFor` (status update, retried on conflict), then Binding; `deallocate` is PostFilter's undo.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_BASE_LEN = 57  # leaves room for "-" and 5 random characters in a 63-character name
RESERVED_FOR_MAX = 256
CONFLICT = 409
MERGE_PATCH = "application/merge-patch+json"


def _plain(api: kclient.ApiClient, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


def claim_generate_name(pod_name: str, claim_name: str) -> str:
    """`<pod>-<claim>-`, or, above 57 characters, both parts cut in proportion to their length (no hyphen
    at the end, as the controller writes it)."""
    base = f"{pod_name}-{claim_name}-"
    if len(base) <= MAX_BASE_LEN:
        return base
    return f"{pod_name[:len(pod_name) * MAX_BASE_LEN // len(base)]}-" \
           f"{claim_name[:len(claim_name) * MAX_BASE_LEN // len(base)]}"


def _owned_claim(claims: list[dict[str, Any]], pod: dict[str, Any], claim_name: str) -> dict[str, Any] | None:
    uid = pod["metadata"]["uid"]
    for claim in claims:
        meta = claim.get("metadata") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller") and o.get("uid") == uid]
        if owners and (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == claim_name:
            return claim
    return None


def create_template_claims(api: kclient.ApiClient, namespace: str, pod_name: str) -> list[dict[str, str]]:
    """Create the missing claims of a pod's template entries; returns the resourceClaimStatuses written."""
    core, resource = kclient.CoreV1Api(api), kclient.ResourceV1Api(api)
    pod = _plain(api, core.read_namespaced_pod(pod_name, namespace))
    existing = _plain(api, resource.list_namespaced_resource_claim(namespace)).get("items") or []
    statuses = []
    for entry in pod["spec"].get("resourceClaims") or []:
        template_name = entry.get("resourceClaimTemplateName")
        if not template_name:
            continue
        claim = _owned_claim(existing, pod, entry["name"])
        if claim is None:
            template = _plain(api, resource.read_namespaced_resource_claim_template(template_name, namespace))
            claim = _plain(api, resource.create_namespaced_resource_claim(
                namespace, _claim_from_template(pod, entry["name"], template)))
        statuses.append({"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]})
    if statuses:
        core.patch_namespaced_pod_status(pod_name, namespace, {"status": {"resourceClaimStatuses": statuses}},
                                         _content_type=MERGE_PATCH)
    return statuses


def _claim_from_template(pod: dict[str, Any], claim_name: str, template: dict[str, Any]) -> dict[str, Any]:
    template_meta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    annotations[POD_CLAIM_ANNOTATION] = claim_name
    meta: dict[str, Any] = {
        "generateName": claim_generate_name(pod["metadata"]["name"], claim_name),
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                             "uid": pod["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
        "annotations": annotations,
    }
    if template_meta.get("labels"):
        meta["labels"] = dict(template_meta["labels"])
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": (template.get("spec") or {}).get("spec") or {}}


class Unschedulable(Exception):
    """The emulated scheduler would not bind the pod now; the message says why."""


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """resourceclaim.Name for each pod claim; Unschedulable while a template claim is not created yet."""
    recorded = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    names = []
    for entry in pod["spec"].get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names.append(entry["resourceClaimName"])
        elif entry["name"] in recorded:
            if recorded[entry["name"]]:
                names.append(recorded[entry["name"]])
        else:
            raise Unschedulable(f"waiting for resource claim of {entry['name']!r} to be created")
    return names


def _requirement_holds(req: dict[str, Any], value: str | None) -> bool:
    op, values = req.get("operator"), req.get("values") or []
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit():
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def node_matches(selector: dict[str, Any] | None, node: dict[str, Any]) -> bool:
    """A NodeSelector (terms ORed, requirements ANDed); None matches every node."""
    if selector is None:
        return True
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(all(_requirement_holds(r, labels.get(r.get("key"))) for r in term.get("matchExpressions") or [])
               and all(_requirement_holds(r, fields.get(r.get("key"))) for r in term.get("matchFields") or [])
               for term in selector.get("nodeSelectorTerms") or [])


@dataclass
class SchedulerEmulator:
    """kube-scheduler for pods whose claims another component allocated."""

    api: kclient.ApiClient
    max_conflicts: int = 5

    def schedule(self, namespace: str, pod_name: str, node_name: str) -> None:
        """Filter, PreBind and Bind the pod on `node_name`; Unschedulable if the scheduler would not."""
        core, resource = kclient.CoreV1Api(self.api), kclient.ResourceV1Api(self.api)
        pod = _plain(self.api, core.read_namespaced_pod(pod_name, namespace))
        if pod["spec"].get("schedulingGates"):
            raise Unschedulable("pod has scheduling gates")  # PreEnqueue: not tried at all
        node = _plain(self.api, core.read_node(node_name))
        claims = [_plain(self.api, resource.read_namespaced_resource_claim(n, namespace))
                  for n in pod_claim_names(pod)]
        for claim in claims:
            self._filter(claim, pod, node)
        for claim in claims:
            self._reserve(namespace, claim["metadata"]["name"], pod)
        core.create_namespaced_pod_binding(pod_name, namespace, {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name, "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}, _preload_content=False)

    @staticmethod
    def _filter(claim: dict[str, Any], pod: dict[str, Any], node: dict[str, Any]) -> None:
        st = claim.get("status") or {}
        allocation = st.get("allocation")
        if allocation is None:
            raise Unschedulable(f"claim {claim['metadata']['name']} is not allocated")
        reserved = st.get("reservedFor") or []
        mine = any(r.get("uid") == pod["metadata"]["uid"] for r in reserved)
        if len(reserved) >= RESERVED_FOR_MAX and not mine:
            raise Unschedulable("resourceclaim in use")
        if not node_matches(allocation.get("nodeSelector"), node):
            raise Unschedulable("resourceclaim not available on the node")

    def _reserve(self, namespace: str, claim_name: str, pod: dict[str, Any]) -> None:
        """PreBind: append the pod to reservedFor with a status update, re-reading on conflict."""
        resource = kclient.ResourceV1Api(self.api)
        ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        for _ in range(self.max_conflicts):
            claim = _plain(self.api, resource.read_namespaced_resource_claim(claim_name, namespace))
            st = claim.setdefault("status", {})
            if any(r.get("uid") == ref["uid"] for r in st.get("reservedFor") or []):
                return
            st["reservedFor"] = [*(st.get("reservedFor") or []), ref]
            try:
                resource.replace_namespaced_resource_claim_status(claim_name, namespace, claim)
                return
            except ApiException as err:
                if err.status != CONFLICT:
                    raise
        raise Unschedulable(f"claim {claim_name}: still conflicting after {self.max_conflicts} tries")

    def deallocate(self, namespace: str, claim_name: str, pod_uid: str) -> bool:
        """PostFilter: clear allocation, reservedFor and devices of a claim unreserved or reserved only for
        this pod; False if it is in use by another consumer."""
        resource = kclient.ResourceV1Api(self.api)
        for _ in range(self.max_conflicts):
            claim = _plain(self.api, resource.read_namespaced_resource_claim(claim_name, namespace))
            st = claim.get("status") or {}
            if any(r.get("uid") != pod_uid for r in st.get("reservedFor") or []):
                return False
            claim["status"] = {k: v for k, v in st.items() if k not in ("allocation", "reservedFor", "devices")}
            try:
                resource.replace_namespaced_resource_claim_status(claim_name, namespace, claim)
                return True
            except ApiException as err:
                if err.status != CONFLICT:
                    raise
        raise Unschedulable(f"claim {claim_name}: still conflicting after {self.max_conflicts} tries")


def status_body(err: ApiException) -> dict[str, Any]:
    """The metav1.Status an ApiException carries."""
    body: dict[str, Any] = json.loads(err.body)
    return body
