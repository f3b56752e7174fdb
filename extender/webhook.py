"""The mutating admission webhook: `POST /mutate` (and `{url_prefix}/mutate`), `admission.k8s.io/v1`.

For every pod CREATE the API server sends (its matchConditions: pods with any `vramfit.io/` annotation, label
or resource) it first enforces who may write what (README, "Trust model"; the chart's ValidatingAdmissionPolicy
enforces the same on CREATE and UPDATE, and is the authority):

- a pod carrying one of vramfit's records (`vramfit.io/assignment`, `vramfit.io/phase`, `vramfit.io/bound-at`,
  `vramfit.io/assignment-signature`) is denied (403, the annotation named): only vramfit's Binding writes them;
- a pod asking for `vramfit.io/gpu` or `vramfit.io/vram` with `spec.nodeName` already set is denied (403): it
  would skip the scheduler, and so vramfit's booking (the kubelet's mirror pods, created by a node, excepted);
- a pod naming a tenant (label `vramfit.io/tenant`) its namespace does not allow is denied (403, the reason
  from `Tenancy.resolve`).

Then it denies (400, the field named) what would otherwise be ignored or refused later (`keys_denial`): a
`vramfit.io/` key vramfit does not read ("did you mean"), vramfit's resources in requests without an equal
limit, and a `vramfit.io/gpu-models` name no GPU matches (the catalog's models and products, and the
products of the GPUs the cluster has).

Then, for a pod that asks for `vramfit.io/vram` (the resource in any container, or the annotation) it

- parses the pod with `packing.k8s.demand.pod_demand`, the parser the extender places by, and denies a pod it
  cannot read (HTTP 200, `allowed: false`, `status.code` 400, the message naming the field): a typo must fail
  at `kubectl apply`, not as a pod pending forever;
- sets `spec.schedulerName` to `webhook_scheduler_name` when the pod names none or `default-scheduler`
  (a pod naming another scheduler is left alone, with a warning);
- adds `vramfit.io/gpu: "<GPU count>"` to `resources.limits` of every app container requesting
  `vramfit.io/vram` (the first app container when the VRAM comes only from the annotation), and to its
  `requests` when it has a requests map: the kubelet's device manager reads limits only, an extended
  resource needs requests == limits, and without that resource the node agent is never asked to hand the
  container its GPUs. A container that already has the right count is left alone; another count is denied
  (403): the node agent gives each such container exactly the pod's GPUs, so no other count can be served.

Every other pod, and every other operation, is allowed untouched. The handler never raises to the client:
a body that is not an AdmissionReview is HTTP 400 with the reason; a pod it cannot read, or a bug, is a
deny (the webhook runs with `failurePolicy: Fail`, see manifests/25-webhook.yaml, so an unhandled error
would deny anyway, only without a message).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect

from extender import wire
from extender.config import Settings
from extender.dra.gate import gate_ops, needs_gate
from extender.offload import RETRY_AFTER_S, Busy, Offload
from packing.catalog import Catalog
from packing.k8s.demand import (
    ANN_ASSIGNMENT,
    ANN_BOUND_AT,
    ANN_GPUS,
    ANN_MODELS,
    ANN_PHASE,
    ANN_VRAM,
    VRAM_RESOURCE,
    pod_demand,
)
from packing.k8s.pod_keys import (
    MAX_GPU_CONTAINERS,
    check_extended_resources,
    check_limit_env,
    check_pod_keys,
    containers,
    resource_maps,
)
from packing.k8s.quantity import count_value, split_quantity, vram_to_mib
from packing.k8s.trust import ANN_SIGNATURE, LABEL_TENANT, NO_NAMESPACE_RULES, Tenancy
from packing.model import InputError, PodDemand
from packing.model_names import unknown_models_problem

log = logging.getLogger("vramfit.webhook")

ADMISSION_V1 = "admission.k8s.io/v1"
# The resource the node agent serves (nodeagent.allocate.GPU_RESOURCE; not imported: the extender image
# does not need the agent's gRPC stack).
GPU_RESOURCE = "vramfit.io/gpu"
DraGate = Callable[[dict[str, Any], str], bool]  # (pod, namespace) -> it needs vramfit's DRA gate
DEFAULT_SCHEDULER = "default-scheduler"  # what the API server defaults an unset schedulerName to
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
NODES_GROUP = "system:nodes"  # every kubelet's credentials carry it; only a kubelet creates a real mirror pod
# What only vramfit's Binding writes (the bind handshake and its signature): never on a pod a user creates.
VRAMFIT_RECORDS = (ANN_ASSIGNMENT, ANN_PHASE, ANN_BOUND_AT, ANN_SIGNATURE)
_DECIMAL_UNITS = ("M", "G", "T", "P", "E")  # 14G is 10^9-byte gigabytes: a likely slip for 14Gi


# ---- the AdmissionReview, as far as the webhook reads it --------------------------------------------


class GroupVersionKind(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: str = ""
    version: str = ""
    kind: str = ""


class UserInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    username: str = ""
    groups: list[str] = Field(default_factory=list)


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    subResource: str | None = None
    operation: str
    namespace: str | None = None
    name: str | None = None
    userInfo: UserInfo = Field(default_factory=UserInfo)
    # Any, not dict: a request with a uid but an unreadable object gets a deny that says so, not a 400.
    object_: Any = Field(default=None, alias="object")


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore")

    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


@dataclass
class Verdict:
    """What the webhook answers for one request (before it becomes an AdmissionResponse)."""

    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    code: int | None = None
    message: str | None = None
    warnings: list[str] = field(default_factory=list)


def deny(code: int, message: str, warnings: list[str] | None = None) -> Verdict:
    return Verdict(allowed=False, code=code, message=message, warnings=warnings or [])


def response_review(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview the API server expects back: same apiVersion/kind, response.uid = request.uid."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch, separators=(",", ":")).encode()).decode()
    if not verdict.allowed:
        response["status"] = {"code": verdict.code or 403, "message": verdict.message or "denied"}
    if verdict.warnings:
        response["warnings"] = verdict.warnings
    return {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": response}


# ---- reading the pod ---------------------------------------------------------------------------------


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer; `/` in a key (vramfit.io/gpu) must be written `~1`, and `~` as `~0`."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any], section: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, c in enumerate(_as_list(spec.get(section))):
        if isinstance(c, dict):
            yield i, c


def _sections(container: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """`(limits, ...)` then `(requests, ...)`: the order a denial or warning names them in."""
    requests, limits = resource_maps(container)
    yield "limits", limits
    yield "requests", requests


def _names(container: Mapping[str, Any], resource: str) -> bool:
    return any(resource in values for values in resource_maps(container))


def _requests_vram(container: Mapping[str, Any]) -> bool:
    return _names(container, VRAM_RESOURCE)


def _carries_gpu(container: Mapping[str, Any]) -> bool:
    return _names(container, GPU_RESOURCE)


def asks_for_vram(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is vramfit's: `vramfit.io/vram` in any container's resources, or the annotation.
    Tolerant of any shape (the object has not been validated yet when admission runs)."""
    if any(_requests_vram(c) for _, c in containers(_as_dict(pod.get("spec")))):
        return True
    return ANN_VRAM in _as_dict(_as_dict(pod.get("metadata")).get("annotations"))


def asks_for_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for vramfit's GPUs at all: VRAM (any form) or `vramfit.io/gpu` in any container."""
    return asks_for_vram(pod) or any(_carries_gpu(c) for _, c in containers(_as_dict(pod.get("spec"))))


def _forged_record(pod: Mapping[str, Any]) -> str | None:
    """The first of vramfit's records the pod carries, if any."""
    annotations = _as_dict(_as_dict(pod.get("metadata")).get("annotations"))
    return next((key for key in VRAMFIT_RECORDS if key in annotations), None)


def _is_mirror(pod: Mapping[str, Any], request: AdmissionRequest) -> bool:
    """The kubelet's mirror of a static pod: the annotation, written by a node. Anyone may write the
    annotation; only a kubelet's credentials are in system:nodes."""
    annotations = _as_dict(_as_dict(pod.get("metadata")).get("annotations"))
    return MIRROR_ANNOTATION in annotations and NODES_GROUP in request.userInfo.groups


def _namespace(pod: Mapping[str, Any], request: AdmissionRequest) -> str:
    """The request's namespace (the API server has checked the object's against it), else the object's."""
    named = _as_dict(pod.get("metadata")).get("namespace")
    return request.namespace or (named if isinstance(named, str) and named else "default")


def _named(pod: dict[str, Any], request: AdmissionRequest) -> dict[str, Any]:
    """The pod as `pod_demand` needs it: a pod created from `generateName` (every Deployment's, Job's ...)
    has no name yet, and the namespace may be only in the request. A copy: the patch is against the original."""
    meta = dict(_as_dict(pod.get("metadata")))
    if not meta.get("name"):
        generated = meta.get("generateName")
        meta["name"] = request.name or (f"{generated}*" if isinstance(generated, str) and generated else "(unnamed)")
    if not meta.get("namespace"):
        meta["namespace"] = request.namespace or "default"
    return {**pod, "metadata": meta}


def _unit_warnings(pod: Mapping[str, Any]) -> Iterator[str]:
    """A decimal unit on VRAM (14G = 13352 MiB) is legal but usually meant as the binary one (14Gi = 14336)."""
    values: list[tuple[str, Any]] = []
    for where, c in containers(_as_dict(pod.get("spec"))):
        values.extend((f"{where}.resources.{part}", v[VRAM_RESOURCE]) for part, v in _sections(c) if VRAM_RESOURCE in v)
    ann = _as_dict(_as_dict(pod.get("metadata")).get("annotations"))
    if ANN_VRAM in ann:
        values.append(("metadata.annotations", ann[ANN_VRAM]))
    seen: set[str] = set()
    for where, raw in values:
        try:
            _, suffix = split_quantity(raw)
            if suffix not in _DECIMAL_UNITS or str(raw) in seen:
                continue
            seen.add(str(raw))
            binary = vram_to_mib(f"{str(raw).strip()}i")
            yield (f"{where}[{VRAM_RESOURCE}]: {raw} is decimal ({vram_to_mib(raw)} MiB); "
                   f"{str(raw).strip()}i would be {binary} MiB")
        except ValueError:
            continue  # the parser has already accepted it; a binary twin out of range is not worth a word


# ---- the decision ------------------------------------------------------------------------------------


def trust_denial(pod: Mapping[str, Any], request: AdmissionRequest, tenancy: Tenancy) -> Verdict | None:
    """What a pod author may not write (README, "Trust model"): vramfit's records, a node for a GPU pod, a
    tenant their namespace does not allow. None when the pod writes none of them."""
    key = _pod_label(pod, request)
    record = _forged_record(pod)
    if record is not None:
        return deny(403, f"vramfit: pod {key}: field metadata.annotations[{record}]: only vramfit's Binding "
                         f"writes it; remove it from the pod")
    if _as_dict(pod.get("spec")).get("nodeName") and asks_for_gpus(pod) and not _is_mirror(pod, request):
        return deny(403, f"vramfit: pod {key}: field spec.nodeName: a pod asking for {GPU_RESOURCE} or "
                         f"{VRAM_RESOURCE} may not name its node; vramfit's scheduler binds it (only a node it "
                         f"placed there gets a GPU from the node agent)")
    labels = _as_dict(_as_dict(pod.get("metadata")).get("labels"))
    try:
        tenancy.resolve(_namespace(pod, request), labels.get(LABEL_TENANT), f"pod {key}")
    except InputError as err:
        return deny(403, f"vramfit: {err}")
    return None


def _pod_label(pod: Mapping[str, Any], request: AdmissionRequest) -> str:
    """`namespace/name` as a deny message names the pod (a generated name ends in `*`)."""
    meta = _named(dict(pod), request)["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def keys_denial(pod: Mapping[str, Any], request: AdmissionRequest, catalog: Catalog | None = None,
                seen_products: Callable[[], Iterable[str]] = lambda: ()) -> Verdict | None:
    """What would be silently ignored or refused later, said now (400, the field named): a `vramfit.io/` key
    vramfit does not read (a typo of `vramfit.io/isolation` would otherwise drop the pod to the default
    isolation), vramfit's resources in requests without a limit or unequal to it (the API server's own refusal
    never names vramfit), and a `vramfit.io/gpu-models` name no GPU can match (the pod would wait forever)."""
    who = f"pod {_pod_label(pod, request)}"
    meta, spec = _as_dict(pod.get("metadata")), _as_dict(pod.get("spec"))
    try:
        check_pod_keys(meta, spec, who)
        check_extended_resources(spec, who)
    except InputError as err:
        return deny(400, f"vramfit: {err}")
    raw = _as_dict(meta.get("annotations")).get(ANN_MODELS)
    if catalog is None or not isinstance(raw, str):
        return None  # an unreadable list is pod_demand's to name
    problem = unknown_models_problem(catalog, [m for m in raw.split(",") if m.strip()], seen_products)
    if problem is not None:
        return deny(400, f"vramfit: {who}: field metadata.annotations[{ANN_MODELS}]: {problem}")
    return None


def env_denial(pod: Mapping[str, Any], request: AdmissionRequest) -> Verdict | None:
    """A pod asking for vramfit's GPUs whose containers set a GPU limit themselves (403, the container and the
    variable named): their value would override the one the node agent hands over with the pod's units."""
    if not asks_for_gpus(pod):
        return None
    try:
        check_limit_env(_as_dict(pod.get("spec")), f"pod {_pod_label(pod, request)}")
    except InputError as err:
        return deny(403, f"vramfit: {err}")
    return None


def admit(request: AdmissionRequest, scheduler_name: str, tenancy: Tenancy = NO_NAMESPACE_RULES,
          catalog: Catalog | None = None, seen_products: Callable[[], Iterable[str]] = lambda: (),
          dra_gate: DraGate | None = None) -> Verdict:
    """`admit_pod`, then vramfit's scheduling gate on a pod whose ResourceClaims vramfit allocates (`dra_gate`:
    whether it needs one; None: DRA allocation is off)."""
    verdict = admit_pod(request, scheduler_name, tenancy, catalog, seen_products)
    pod = request.object_
    if verdict.allowed and dra_gate is not None and isinstance(pod, dict) and request.operation == "CREATE" \
            and request.kind.kind == "Pod" and not request.subResource \
            and dra_gate(pod, _namespace(pod, request)):
        verdict.patch.extend(gate_ops(pod))
    return verdict


def admit_pod(request: AdmissionRequest, scheduler_name: str, tenancy: Tenancy = NO_NAMESPACE_RULES,
              catalog: Catalog | None = None, seen_products: Callable[[], Iterable[str]] = lambda: ()) -> Verdict:
    """Allow, mutate or deny one admission request; `tenancy` is the namespaces' rules as last seen, `catalog`
    the GPU models `vramfit.io/gpu-models` may name (with `seen_products`, the GPUs the cluster has now; None:
    not checked). Pure; raises only on a bug (the route catches that)."""
    if request.operation != "CREATE" or request.kind.kind != "Pod" or request.kind.group != "" \
            or request.subResource:
        return Verdict()
    pod = request.object_
    if not isinstance(pod, dict):
        return deny(400, f"vramfit: the request's object is not a pod object (got {type(pod).__name__})")
    settled = _settled_before_demand(pod, request, scheduler_name, tenancy, catalog, seen_products)
    if settled is not None:
        return settled
    try:
        demand = pod_demand(_named(pod, request), tenancy)
    except InputError as err:
        return deny(400, f"vramfit: {err}")
    if demand is None:  # cannot happen after asks_for_vram; allowing untouched is what the pod would get
        return Verdict()
    return _give_gpus(pod, demand, scheduler_name)


def _settled_before_demand(pod: dict[str, Any], request: AdmissionRequest, scheduler_name: str,
                           tenancy: Tenancy, catalog: Catalog | None,
                           seen_products: Callable[[], Iterable[str]]) -> Verdict | None:
    """The verdict when the pod's demand need not be read (denied, a mirror pod, no VRAM asked, another
    scheduler's pod); None to go on."""
    denied = trust_denial(pod, request, tenancy)
    if denied is not None:
        return denied
    if _is_mirror(pod, request):
        # A mirror pod: the kubelet runs its static pod already, whatever the API object says.
        return Verdict()
    denied = keys_denial(pod, request, catalog, seen_products)
    if denied is not None:
        return denied
    if not asks_for_vram(pod):
        return env_denial(pod, request) or Verdict()  # one carrying vramfit.io/gpu alone still gets units
    named = _as_dict(pod.get("spec")).get("schedulerName")
    if named not in (None, "", DEFAULT_SCHEDULER, scheduler_name):
        return Verdict(warnings=[f"vramfit: the pod names scheduler {named!r}, not {scheduler_name!r}; it is left "
                                 f"alone, so vramfit neither places it nor gives its containers {GPU_RESOURCE}"])
    return env_denial(pod, request)


def _give_gpus(pod: dict[str, Any], demand: PodDemand, scheduler_name: str) -> Verdict:
    """The patch sending a VRAM pod to vramfit and giving its app containers `vramfit.io/gpu`, or the denial
    of counts it already carries that disagree with its demand."""
    spec = _as_dict(pod.get("spec"))
    verdict = Verdict()
    if spec.get("schedulerName") != scheduler_name:
        verdict.patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})

    apps = list(_containers(spec, "containers"))
    if not apps:
        return deny(400, f"vramfit: pod {demand.key}: field spec.containers: the pod has no container")
    targets = {i for i, c in apps if _requests_vram(c)}
    if not targets:
        targets = {apps[0][0]}
        verdict.warnings.append(
            f"vramfit: only the annotation {ANN_VRAM} or an init container asks for VRAM; kube-scheduler sends a "
            f"pod to the extender only when it requests one of the extender's managedResources")
    # Any container asking for vramfit.io/gpu gets exactly the pod's GPUs from the node agent; check them all.
    for section in ("initContainers", "containers"):
        for i, c in _containers(spec, section):
            denied = _count_denial(section, i, c, demand, verdict.warnings)
            if denied is not None:
                return denied
    carrying = len(targets | {i for i, c in apps if _carries_gpu(c)}) + sum(
        1 for _, c in _containers(spec, "initContainers") if _carries_gpu(c))
    if carrying > MAX_GPU_CONTAINERS:
        return deny(400, f"vramfit: pod {demand.key}: field spec.containers: {carrying} containers would ask for "
                         f"{GPU_RESOURCE}; at most {MAX_GPU_CONTAINERS} per pod (each takes its own device tickets "
                         f"on the node)", verdict.warnings)
    gpus = str(demand.gpu_count)
    for i, c in apps:
        if i in targets:
            verdict.patch.extend(_gpu_ops(i, c, gpus))
    verdict.warnings.extend(_unit_warnings(pod))
    return verdict


def _count_denial(section: str, i: int, c: Mapping[str, Any], demand: PodDemand,
                  warnings: list[str]) -> Verdict | None:
    """The denial of a `vramfit.io/gpu` count in one container that is unreadable or not the pod's GPU count;
    an init container asking for VRAM without the GPU count is warned about (in `warnings`)."""
    for part, values in _sections(c):
        if GPU_RESOURCE not in values:
            continue
        where = f"spec.{section}[{i}].resources.{part}[{GPU_RESOURCE}]"
        try:
            have = count_value(values[GPU_RESOURCE])
        except ValueError as err:
            return deny(400, f"vramfit: pod {demand.key}: field {where}: {err}", warnings)
        if have != demand.gpu_count:
            return deny(403, f"vramfit: pod {demand.key}: field {where}: is {have}, but the pod asks for "
                             f"{demand.gpu_count} GPU(s) (annotation {ANN_GPUS}, default 1); leave "
                             f"{GPU_RESOURCE} out and the webhook sets it", warnings)
    if section == "initContainers" and _requests_vram(c) and not _carries_gpu(c):
        warnings.append(f"vramfit: spec.initContainers[{i}] requests {VRAM_RESOURCE} but only app "
                        f"containers get {GPU_RESOURCE}: it sees no GPU unless it asks for it")
    return None


def _gpu_ops(index: int, container: Mapping[str, Any], gpus: str) -> list[dict[str, Any]]:
    """JSON Patch ops giving one app container `vramfit.io/gpu: gpus`, creating `resources`/`limits` when
    missing. Counts already present were checked equal by the caller."""
    base = ("spec", "containers", index, "resources")
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return [{"op": "add", "path": pointer(*base), "value": {"limits": {GPU_RESOURCE: gpus}}}]
    ops: list[dict[str, Any]] = []
    limits = resources.get("limits")
    if not isinstance(limits, dict):
        ops.append({"op": "add", "path": pointer(*base, "limits"), "value": {GPU_RESOURCE: gpus}})
    elif GPU_RESOURCE not in limits:
        ops.append({"op": "add", "path": pointer(*base, "limits", GPU_RESOURCE), "value": gpus})
    requests = resources.get("requests")
    # Without a requests map the API server defaults requests from limits; with one, it must match them.
    if isinstance(requests, dict) and GPU_RESOURCE not in requests:
        ops.append({"op": "add", "path": pointer(*base, "requests", GPU_RESOURCE), "value": gpus})
    return ops


# ---- HTTP --------------------------------------------------------------------------------------------

# How many reviews are decoded and judged at once (each off the event loop), and how many more may wait: a
# flood is refused (503) past that, never queued without bound, and the bodies held stay bounded too.
WEBHOOK_WORKERS = 2
WEBHOOK_WAITING = 32
BODY_TIMEOUT_S = 10.0  # the API server writes a review at once; a body still trickling in after this is not its


class BodyTooLarge(wire.WireError):
    pass


async def _read_capped(request: Request, cap: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body, at most `cap` bytes (BodyTooLarge beyond, as soon as Content-Length or the bytes say so), all of
    it within `timeout_s` (TimeoutError after)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        raise BodyTooLarge(f"request body of {length} bytes exceeds the webhook's {cap}-byte limit (an "
                           f"AdmissionReview from the API server is never that large)")
    chunks: list[bytes] = []
    size = 0
    async with asyncio.timeout(timeout_s):
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise BodyTooLarge(f"request body exceeds the webhook's {cap}-byte limit (an AdmissionReview "
                                   f"from the API server is never that large)")
            chunks.append(chunk)
    return b"".join(chunks)


def handle(body: bytes, scheduler_name: str, tenancy: Tenancy = NO_NAMESPACE_RULES, catalog: Catalog | None = None,
           seen_products: Callable[[], Iterable[str]] = lambda: (), dra_gate: DraGate | None = None
           ) -> tuple[int, bytes]:
    """One webhook call: body in, (HTTP status, JSON body) out. Never raises. CPU-bound (decoding is most of
    it): the route runs it off the event loop."""
    try:
        review = wire.parse(AdmissionReview, body)
    except wire.WireError as err:
        return 400, wire.dumps({"Error": str(err)})
    request = review.request
    try:
        verdict = admit(request, scheduler_name, tenancy, catalog, seen_products, dra_gate)
    except Exception as err:  # noqa: BLE001 - a bug must still answer this request, and say so
        log.exception("webhook failed on request %s", request.uid)
        verdict = deny(500, f"vramfit webhook: internal error: {type(err).__name__}: {err}")
    if not verdict.allowed:
        log.info("denied pod %s/%s: %s", request.namespace or "", request.name or "(generated)", verdict.message)
    return 200, wire.dumps(response_review(request.uid, verdict))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(wire.dumps({"Error": message}), status_code=status, media_type="application/json",
                    headers=headers)


def _tenancy(request: Request) -> Tenancy:
    """The namespaces' tenancy rules as the store last saw them (replaced whole, so safe to read from here)."""
    services = getattr(request.app.state, "services", None)
    return getattr(getattr(services, "store", None), "tenancy", NO_NAMESPACE_RULES)


def _catalog(request: Request) -> tuple[Catalog | None, Callable[[], Iterable[str]]]:
    """The store's GPU catalog, and the products of the GPUs it holds now (read only when the catalog alone
    does not know a name a pod writes)."""
    store = getattr(getattr(request.app.state, "services", None), "store", None)
    catalog = getattr(store, "catalog", None)
    if store is None or not isinstance(catalog, Catalog):
        return None, lambda: ()

    def seen() -> list[str]:
        with store.lock:
            return [g.product for n in store.state.nodes() for g in n.gpus]

    return catalog, seen


def _dra_gate(request: Request) -> DraGate | None:
    """Whether a pod needs vramfit's DRA gate, by the store's claims and templates; None when DRA is off."""
    store = getattr(getattr(request.app.state, "services", None), "store", None)
    book = getattr(store, "dra", None)
    if store is None or book is None:
        return None

    def gate(pod: dict[str, Any], namespace: str) -> bool:
        with store.lock:
            return needs_gate(pod, namespace, book.classes_of, book.managed)

    return gate


def add_webhook_routes(app: FastAPI, settings: Settings) -> None:
    """`POST /mutate`, and the same under the configured url_prefix. Bodies are capped at
    `webhook_max_body_bytes` (413) and decoded on the webhook's own bounded executor (`app.state.webhook`),
    so neither a large review nor a flood of them holds up the verbs and probes on the event loop."""
    offload = Offload("webhook", WEBHOOK_WORKERS, WEBHOOK_WAITING)
    app.state.webhook = offload
    cap = min(settings.webhook_max_body_bytes, settings.max_body_bytes)

    async def mutate(request: Request) -> Response:
        try:
            async with offload.admit() as slot:
                try:
                    body = await _read_capped(request, cap)
                except BodyTooLarge as err:
                    return _error(413, str(err), {"connection": "close"})
                except TimeoutError:
                    return _error(408, f"request body not received within {BODY_TIMEOUT_S:g} s",
                                  {"connection": "close"})
                except ClientDisconnect:
                    return Response(status_code=499)  # the API server gave up (timeoutSeconds); nobody reads this
                status, content = await slot.run(handle, body, settings.webhook_scheduler_name,
                                                 _tenancy(request), *_catalog(request), _dra_gate(request))
        except Busy as err:
            return _error(503, f"vramfit webhook: {err}", {"retry-after": str(RETRY_AFTER_S)})
        return Response(content, status_code=status, media_type="application/json")

    for path in dict.fromkeys(["/mutate", f"{settings.url_prefix}/mutate"]):
        app.add_api_route(path, mutate, methods=["POST"], name=f"mutate{path.replace('/', '_')}")
