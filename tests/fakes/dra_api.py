"""`resource.k8s.io/v1` and pod updates (scheduling gates) for the fake API server (tests only).

Read from kubernetes/kubernetes (1.37-era copies): `pkg/registry/resource/resourceclaim/strategy.go`,
`pkg/apis/resource/validation/validation.go`, `pkg/apis/core/validation/validation.go` (pod updates,
node selectors, DNS names), `pkg/registry/core/pod/strategy.go`. What the real server does here:

- Kinds: resourceslices and deviceclasses (cluster-scoped), resourceclaims and resourceclaimtemplates
  (namespaced). List, watch, get, create (`generateName` honoured), delete; they share the fake's event
  log and resourceVersion counter. Field selectors: metadata ones, plus spec.nodeName / spec.driver /
  spec.pool.name on slices.
- Claim create drops status (PrepareForCreate). Claim delete with finalizers only sets deletionTimestamp;
  the update that removes the last finalizer removes the object.
- Claim update (PUT or PATCH of the item): resourceVersion precondition (409), status taken from storage,
  spec immutable (422), no new finalizers once deletionTimestamp is set.
- Claim status update (PUT or PATCH of `/status`): spec and metadata generation, labels, annotations,
  finalizers, ownerReferences, deletionTimestamp reset to storage (ResetObjectMetaForStatus); device statuses of
  deallocated devices dropped; validateResourceClaimStatusUpdate's rules (422 Invalid with causes).
- Pod update (PUT or PATCH of the item): scheduling gates may only shrink; other spec changes beyond the
  updatable fields are refused; status is taken from storage.
- An update that changes nothing writes nothing (no new resourceVersion, no event).

Not done: device status content checks (validateDeviceStatus), slice/class/template updates, label
value checks in node selectors, admin-access namespace checks, server-side apply.
"""

from __future__ import annotations

import copy
import json
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fakes.apiserver import (
    MERGE_PATCH,
    PATCH_TYPES,
    ApiError,
    Recorded,
    _json_body,
    _Route,
    bad_request,
    merge_patch,
    now_rfc3339,
    status,
)

if TYPE_CHECKING:
    from fakes.apiserver import FakeApiServer, _Handler

GROUP = "resource.k8s.io"
PREFIX = f"/apis/{GROUP}/v1/"
API_VERSION = f"{GROUP}/v1"
DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")
DRA_CLUSTER_SCOPED = ("resourceslices", "deviceclasses")
DRA_ITEM_KIND = {"resourceslices": "ResourceSlice", "deviceclasses": "DeviceClass",
                 "resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}
DRA_LIST_KIND = {k: f"{v}List" for k, v in DRA_ITEM_KIND.items()}
# pkg/registry/resource/*/strategy.go toSelectableFields.
DRA_SELECTABLE = {
    "resourceslices": {"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"},
    "deviceclasses": {"metadata.name"},
    "resourceclaims": {"metadata.name", "metadata.namespace"},
    "resourceclaimtemplates": {"metadata.name", "metadata.namespace"},
}
JSON_PATCH = "application/json-patch+json"
RESERVED_FOR_MAX = 256  # resource.ResourceClaimReservedForMaxSize
RESULTS_MAX = 32  # resource.AllocationResultsMaxSize
CONFIG_MAX = 32  # resource.DeviceConfigMaxSize (allocation config: 2x, class + claim)
POOL_NAME_MAX = 253
# names.SimpleNameGenerator: base cut to 58, then 5 characters from this alphabet.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_BASE = 58

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
UUID_SHAPE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# k8s.io/apimachinery/pkg/util/validation messages.
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
QUALIFIED_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                 "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                 "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
REQUEST_REF_MSG = ("must be the name of a request in the claim or the name of a request and a subrequest "
                   "separated by '/'")
UPDATABLE_POD_SPEC_FIELDS = ",".join((
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
))
_OMIT = object()

# ---- field errors (k8s.io/apimachinery/pkg/util/validation/field) ------------------------------------------

_TYPE_TEXT = {"FieldValueRequired": "Required value", "FieldValueInvalid": "Invalid value",
              "FieldValueForbidden": "Forbidden", "FieldValueTooMany": "Too many",
              "FieldValueTooLong": "Too long", "FieldValueDuplicate": "Duplicate value",
              "FieldValueNotSupported": "Unsupported value"}
_NO_VALUE = ("FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong")


@dataclass(frozen=True)
class FieldError:
    type: str  # the CauseType, e.g. "FieldValueInvalid"
    field: str
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        """field.Error.ErrorBody: the type, the value (Go renders structs as JSON), the detail."""
        text = _TYPE_TEXT[self.type]
        if self.type not in _NO_VALUE and self.value is not _OMIT:
            text += f": {_render(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path, detail=detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, detail=detail)


def too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError("FieldValueTooMany", path, actual, f"must have at most {limit} items")


def invalid_error(kind: str, group: str, name: str, errs: list[FieldError]) -> ApiError:
    """errors.NewInvalid: 422, reason Invalid, one cause per error; the message aggregates them (deduplicated,
    bracketed when more than one)."""
    qualified = f"{kind}.{group}" if group else kind
    texts = list(dict.fromkeys(str(e) for e in errs))
    joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    causes = [{"reason": e.type, "message": e.body(), "field": e.field} for e in errs]
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": causes}
    if group:
        details["group"] = group
    return ApiError(status(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', details))


# ---- name checks ----------------------------------------------------------------------------------------


def dns_label(value: str, path: str) -> list[FieldError]:
    errs = []
    if len(value) > 63:
        errs.append(invalid(path, value, "must be no more than 63 characters"))
    if not DNS1123_LABEL.match(value):
        errs.append(invalid(path, value, LABEL_MSG))
    return errs


def dns_subdomain(value: str, path: str) -> list[FieldError]:
    errs = []
    if len(value) > 253:
        errs.append(invalid(path, value, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN.match(value):
        errs.append(invalid(path, value, SUBDOMAIN_MSG))
    return errs


def driver_name(value: str, path: str) -> list[FieldError]:
    """corevalidation.ValidateCSIDriverName."""
    errs = [required(path)] if not value else []
    if len(value) > 63:
        errs.append(FieldError("FieldValueTooLong", path, value, "must have at most 63 bytes"))
    return errs + [invalid(path, value, e.detail) for e in dns_subdomain(value.lower(), path)]


def pool_name(value: str, path: str) -> list[FieldError]:
    if not value:
        return [required(path)]
    errs = []
    if len(value) > POOL_NAME_MAX:
        errs.append(FieldError("FieldValueTooLong", path, value, f"must have at most {POOL_NAME_MAX} bytes"))
    for part in value.split("/"):
        errs += dns_subdomain(part, path)
    return errs


def share_id(value: str, path: str) -> list[FieldError]:
    """validateUID: google/uuid's Validate, then the normalized lowercase form."""
    if len(value) not in (32, 36, 38, 45):
        return [invalid(path, value, f"error validating uid: invalid UUID length: {len(value)}")]
    if len(value) == 36 and not UUID_SHAPE.match(value):
        return [invalid(path, value, "error validating uid: invalid UUID format")]
    if len(value) != 36 or value != value.lower():
        return [invalid(path, value, "uid must be in RFC 4122 normalized form, "
                                     "`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters")]
    return []


def label_key(key: str, path: str) -> list[FieldError]:
    """ValidateLabelName (qualified name: optional DNS subdomain prefix, then a name part of <= 63)."""
    prefix, _, name = key.rpartition("/")
    errs = []
    if prefix:
        errs += [invalid(path, key, "prefix part " + e.detail) for e in dns_subdomain(prefix, path)]
    if not name:
        errs.append(invalid(path, key, "name part must be non-empty"))
    elif len(name) > 63:
        errs.append(invalid(path, key, "name part must be no more than 63 characters"))
    elif not QUALIFIED_NAME_PART.match(name):
        errs.append(invalid(path, key, QUALIFIED_MSG))
    return errs


# ---- claims -----------------------------------------------------------------------------------------------


def request_names(claim: dict[str, Any]) -> dict[str, set[str] | None]:
    """gatherRequestNames: request -> its firstAvailable subrequest names (None for `exactly`)."""
    out: dict[str, set[str] | None] = {}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        subs = req.get("firstAvailable") or []
        out[str(req.get("name"))] = {str(s.get("name")) for s in subs} if subs else None
    return out


def request_ref(name: str, path: str, names: dict[str, set[str] | None]) -> list[FieldError]:
    segments = name.split("/")
    if len(segments) > 2:
        return [invalid(path, name, REQUEST_REF_MSG)]
    errs = [e for seg in segments for e in dns_label(seg, path)]
    subs = names.get(segments[0], set())
    known = segments[0] in names and (len(segments) == 1 or (subs is not None and segments[1] in subs))
    if not known:
        errs.append(invalid(path, name, REQUEST_REF_MSG))
    return errs


def _result_errors(result: dict[str, Any], path: str, names: dict[str, set[str] | None]) -> list[FieldError]:
    errs = request_ref(str(result.get("request") or ""), f"{path}.request", names)
    errs += driver_name(str(result.get("driver") or ""), f"{path}.driver")
    errs += pool_name(str(result.get("pool") or ""), f"{path}.pool")
    errs += dns_label(str(result.get("device") or ""), f"{path}.device")
    if result.get("shareID") is not None:
        errs += share_id(str(result["shareID"]), f"{path}.shareID")
    return errs


def _config_errors(config: dict[str, Any], path: str, names: dict[str, set[str] | None]) -> list[FieldError]:
    errs = []
    source = config.get("source")
    if not source:
        errs.append(required(f"{path}.source"))
    elif source not in ("FromClass", "FromClaim"):
        errs.append(FieldError("FieldValueNotSupported", f"{path}.source", source,
                               'supported values: "FromClaim", "FromClass"'))
    for k, name in enumerate(config.get("requests") or []):
        errs += request_ref(str(name), f"{path}.requests[{k}]", names)
    opaque = config.get("opaque")
    if opaque is None:
        errs.append(required(f"{path}.opaque"))
    else:
        errs += driver_name(str(opaque.get("driver") or ""), f"{path}.opaque.driver")
    return errs


def node_selector(selector: dict[str, Any], path: str) -> list[FieldError]:
    """corevalidation.ValidateNodeSelector (label values not checked here)."""
    terms = selector.get("nodeSelectorTerms") or []
    if not terms:
        return [required(f"{path}.nodeSelectorTerms", "must have at least one node selector term")]
    errs = []
    for i, term in enumerate(terms):
        tpath = f"{path}.nodeSelectorTerms[{i}]"
        for j, req in enumerate(term.get("matchExpressions") or []):
            errs += _expression_errors(req, f"{tpath}.matchExpressions[{j}]")
        for j, req in enumerate(term.get("matchFields") or []):
            errs += _field_requirement_errors(req, f"{tpath}.matchFields[{j}]")
    return errs


def _expression_errors(req: dict[str, Any], path: str) -> list[FieldError]:
    op, values = req.get("operator"), req.get("values") or []
    errs = []
    if op in ("In", "NotIn") and not values:
        errs.append(required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist") and values:
        errs.append(forbidden(f"{path}.values", "may not be specified when `operator` is 'Exists' or "
                                                "'DoesNotExist'"))
    elif op in ("Gt", "Lt") and len(values) != 1:
        errs.append(required(f"{path}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    elif op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
        errs.append(invalid(f"{path}.operator", op, "not a valid selector operator"))
    return errs + label_key(str(req.get("key") or ""), f"{path}.key")


def _field_requirement_errors(req: dict[str, Any], path: str) -> list[FieldError]:
    op, values = req.get("operator"), req.get("values") or []
    errs = []
    if op in ("In", "NotIn"):
        if len(values) != 1:
            errs.append(required(f"{path}.values", "must be only one value when `operator` is 'In' or 'NotIn' "
                                                   "for node field selector"))
    else:
        errs.append(invalid(f"{path}.operator", op, "not a valid selector operator"))
    if req.get("key") != "metadata.name":
        errs.append(invalid(f"{path}.key", req.get("key"), "not a valid field selector key"))
    else:
        for k, v in enumerate(values):
            errs += [invalid(f"{path}.values[{k}]", v, e.detail) for e in dns_subdomain(str(v), path)]
    return errs


def allocation_errors(allocation: dict[str, Any], names: dict[str, set[str] | None]) -> list[FieldError]:
    """validateAllocationResult, for a newly written allocation."""
    path = "status.allocation.devices"
    devices = allocation.get("devices") or {}
    results = devices.get("results") or []
    errs = [too_many(f"{path}.results", len(results), RESULTS_MAX)] if len(results) > RESULTS_MAX else []
    for i, result in enumerate(results):
        errs += _result_errors(result, f"{path}.results[{i}]", names)
    configs = devices.get("config") or []
    if len(configs) > 2 * CONFIG_MAX:
        errs.append(too_many(f"{path}.config", len(configs), 2 * CONFIG_MAX))
    for i, config in enumerate(configs):
        errs += _config_errors(config, f"{path}.config[{i}]", names)
    if allocation.get("nodeSelector") is not None:
        errs += node_selector(allocation["nodeSelector"], "status.allocation.nodeSelector")
    return errs


def _reserved_for_errors(entries: list[dict[str, Any]]) -> list[FieldError]:
    path = "status.reservedFor"
    errs = [too_many(path, len(entries), RESERVED_FOR_MAX)] if len(entries) > RESERVED_FOR_MAX else []
    seen: set[str] = set()
    for i, ref in enumerate(entries):
        errs += [required(f"{path}[{i}].{f}") for f in ("resource", "name", "uid") if not ref.get(f)]
        uid = str(ref.get("uid") or "")
        if uid and uid in seen:
            errs.append(FieldError("FieldValueDuplicate", f"{path}[{i}]", uid))
        seen.add(uid)
    return errs


def status_update_errors(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """validateResourceClaimStatusUpdate."""
    st, old_st = new.get("status") or {}, old.get("status") or {}
    reserved = st.get("reservedFor") or []
    errs = _reserved_for_errors(reserved)
    allocation, old_allocation = st.get("allocation"), old_st.get("allocation")
    if reserved and allocation is None:
        errs.append(forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
    elif reserved and new["metadata"].get("deletionTimestamp"):
        before = {json.dumps(r, sort_keys=True) for r in old_st.get("reservedFor") or []}
        if any(json.dumps(r, sort_keys=True) not in before for r in reserved):
            errs.append(forbidden("status.reservedFor", "new entries may not be added while "
                                                        "`deallocationRequested` or `deletionTimestamp` are set"))
    if allocation is not None and old_allocation is not None:
        if allocation != old_allocation:
            errs.append(invalid("status.allocation", allocation, "field is immutable"))
    elif allocation is not None:
        errs += allocation_errors(allocation, request_names(new))
    return errs


def _device_ids(allocation: dict[str, Any] | None) -> set[tuple[str, str, str]]:
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return {(str(r.get("driver")), str(r.get("pool")), str(r.get("device"))) for r in results}


def drop_deallocated_devices(new: dict[str, Any], old: dict[str, Any]) -> None:
    """dropDeallocatedStatusDevices: device statuses of devices the update deallocates go with them."""
    st = new.setdefault("status", {})
    gone = _device_ids((old.get("status") or {}).get("allocation")) - _device_ids(st.get("allocation"))
    kept = [d for d in st.get("devices") or []
            if (str(d.get("driver")), str(d.get("pool")), str(d.get("device"))) not in gone]
    if kept:
        st["devices"] = kept
    else:
        st.pop("devices", None)


def default_claim_spec(spec: dict[str, Any]) -> None:
    """SetDefaults: `exactly` requests get allocationMode ExactCount and count 1 (no count for All)."""
    for req in (spec.get("devices") or {}).get("requests") or []:
        for target in [req.get("exactly"), *(req.get("firstAvailable") or [])]:
            if isinstance(target, dict):
                target.setdefault("allocationMode", "ExactCount")
                if target["allocationMode"] == "ExactCount":
                    target.setdefault("count", 1)


# ---- pods -----------------------------------------------------------------------------------------------


def gate_errors(new_spec: dict[str, Any], old_spec: dict[str, Any]) -> list[FieldError]:
    """validateOnlyDeletedSchedulingGates: one error per gate the stored pod lacks."""
    before = {g.get("name") for g in old_spec.get("schedulingGates") or []}
    return [forbidden(f"spec.schedulingGates[{i}].name",
                      f"only deletion is allowed, but found new scheduling gate '{g.get('name')}'")
            for i, g in enumerate(new_spec.get("schedulingGates") or []) if g.get("name") not in before]


def _munged(new_spec: dict[str, Any], old_spec: dict[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """ValidatePodUpdate's copy of the new spec with the updatable fields taken from the old one; a gated pod
    may add to its nodeSelector."""
    spec = copy.deepcopy(new_spec)
    for key in ("containers", "initContainers"):
        for new_c, old_c in zip(spec.get(key) or [], old_spec.get(key) or [], strict=False):
            new_c["image"] = old_c.get("image")
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds"):
        _copy_key(spec, old_spec, key)
    errs: list[FieldError] = []
    if old_spec.get("schedulingGates") and spec.get("nodeSelector") != old_spec.get("nodeSelector"):
        selector, old_selector = spec.get("nodeSelector") or {}, old_spec.get("nodeSelector") or {}
        if any(selector.get(k) != v for k, v in old_selector.items()):
            errs.append(invalid("spec.nodeSelector", selector,
                                "only additions to spec.nodeSelector are allowed (no mutations or deletions)"))
        _copy_key(spec, old_spec, "nodeSelector")
    return spec, errs


def _copy_key(dst: dict[str, Any], src: dict[str, Any], key: str) -> None:
    if key in src:
        dst[key] = copy.deepcopy(src[key])
    else:
        dst.pop(key, None)


def pod_update_errors(new_spec: dict[str, Any], old_spec: dict[str, Any]) -> list[FieldError]:
    for key in ("containers", "initContainers"):
        if len(new_spec.get(key) or []) != len(old_spec.get(key) or []):
            return [forbidden(f"spec.{key}", "pod updates may not add or remove containers")]
    errs = gate_errors(new_spec, old_spec)
    munged, more = _munged(new_spec, old_spec)
    errs += more
    if munged != old_spec:
        # The real message ends with cmp.Diff of the internal PodSpec; this one shows the JSON lines that differ.
        errs.append(forbidden("spec", f"pod updates may not change fields other than {UPDATABLE_POD_SPEC_FIELDS}"
                                      f"\n{_spec_diff(old_spec, munged)}"))
    return errs


def _spec_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    a = json.dumps(old, indent=1, sort_keys=True).splitlines()
    b = json.dumps(new, indent=1, sort_keys=True).splitlines()
    return "\n".join([f"- {line}" for line in a if line not in b] + [f"+ {line}" for line in b if line not in a])


def scheduling_gated_condition(pod: dict[str, Any]) -> None:
    """pod strategy applySchedulingGatedCondition (PrepareForCreate): a pod created with gates gets
    PodScheduled=False, reason SchedulingGated, unless it already has a PodScheduled condition."""
    if not (pod.get("spec") or {}).get("schedulingGates"):
        return
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    if any(c.get("type") == "PodScheduled" for c in conditions):
        return
    conditions.append({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                       "message": "Scheduling is blocked due to non-empty scheduling gates",
                       "lastProbeTime": None, "lastTransitionTime": now_rfc3339()})


# ---- patches ----------------------------------------------------------------------------------------------


def apply_patch(obj: dict[str, Any], content_type: str, body: bytes) -> dict[str, Any]:
    """The patched copy of `obj`: JSON merge patch, strategic merge (as a merge patch, except that
    schedulingGates merge by name), or JSON patch (RFC 6902)."""
    if content_type not in (*PATCH_TYPES, JSON_PATCH):
        raise ApiError(status(415, "UnsupportedMediaType",
                              f"the body of the request was in an unknown format - accepted media types "
                              f"include: {JSON_PATCH}, {MERGE_PATCH}, application/apply-patch+yaml, "
                              "application/strategic-merge-patch+json"))
    try:
        patch = json.loads(body or b"{}")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from None
    out = copy.deepcopy(obj)
    if content_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        for op in patch:
            _json_patch_op(out, op)
        return out
    if not isinstance(patch, dict):
        raise bad_request("error decoding patch: not a JSON object")
    gates = (patch.get("spec") or {}).get("schedulingGates") if content_type != MERGE_PATCH else None
    merge_patch(out, patch)
    if isinstance(gates, list):
        out["spec"]["schedulingGates"] = _merge_by_name((obj.get("spec") or {}).get("schedulingGates") or [], gates)
    return out


def _merge_by_name(old: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strategic merge of a list keyed by name (`$patch: delete` entries remove)."""
    out = [dict(g) for g in old]
    for entry in patch:
        out = [g for g in out if g.get("name") != entry.get("name")]
        if entry.get("$patch") != "delete":
            out.append({k: v for k, v in entry.items() if not k.startswith("$")})
    return out


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _json_patch_op(doc: dict[str, Any], op: dict[str, Any]) -> None:
    parts = _pointer(str(op.get("path", "")))
    if not parts:
        raise bad_request("the server rejected our request due to an error in our request")
    parent: Any = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
        if parent is None:
            raise ApiError(status(422, "Invalid", f"doc is missing path: {op.get('path')}: missing value"))
    last, kind = parts[-1], op.get("op")
    if kind == "test":
        here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
        if here != op.get("value"):
            raise ApiError(status(422, "Invalid", f"testing value {op.get('path')} failed: test failed"))
    elif kind == "remove":
        if isinstance(parent, list):
            parent.pop(int(last))
        else:
            parent.pop(last, None)
    elif kind in ("add", "replace"):
        value = copy.deepcopy(op.get("value"))
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            elif kind == "add":
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            parent[last] = value
    else:
        raise bad_request(f"Unexpected kind: {kind}")


# ---- storage operations on the fake -------------------------------------------------------------------------


def qualified(kind: str) -> str:
    return f"{kind}.{GROUP}"


def _details(kind: str, name: str) -> dict[str, Any]:
    return {"name": name, "group": GROUP, "kind": kind}


def modified_conflict(kind: str, name: str, group: str = GROUP) -> ApiError:
    resource = f"{kind}.{group}" if group else kind
    details = {"name": name, "kind": kind, **({"group": group} if group else {})}
    return ApiError(status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object '
                                            "has been modified; please apply your changes to the latest version "
                                            "and try again", details))


def generated_name(base: str) -> str:
    return base[:_MAX_GENERATED_BASE] + "".join(random.choice(_NAME_ALPHABET) for _ in range(5))


def create(fake: FakeApiServer, kind: str, namespace: str | None, body: dict[str, Any],
           keep_status: bool = False) -> dict[str, Any]:
    """The registry's Create for a resource.k8s.io kind; `keep_status` (test seeding only) keeps a claim's
    status as if earlier status updates had written it."""
    obj = copy.deepcopy(body)
    meta = obj.setdefault("metadata", {})
    if namespace is not None:
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        meta["namespace"] = namespace
    with fake._lock:
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generated_name(str(meta["generateName"]))
        name = str(meta.get("name") or "")
        if not name:
            raise invalid_error(DRA_ITEM_KIND[kind], GROUP, "", [
                required("metadata.name", "name or generateName is required")])
        if fake._find(kind, namespace, name) is not None:
            raise ApiError(status(409, "AlreadyExists", f'{qualified(kind)} "{name}" already exists',
                                  _details(kind, name)))
        obj["apiVersion"], obj["kind"] = API_VERSION, DRA_ITEM_KIND[kind]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        meta.pop("deletionTimestamp", None)
        if kind == "resourceclaims":
            if not keep_status:
                obj.pop("status", None)  # PrepareForCreate: status must not be set by the user
            default_claim_spec(obj.setdefault("spec", {}))
        if kind == "resourceclaimtemplates":
            default_claim_spec(obj.setdefault("spec", {}).setdefault("spec", {}))
        fake._store(kind).append(obj)
        return fake._write(kind, "ADDED", obj, None)


def stored(fake: FakeApiServer, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
    obj = fake._find(kind, namespace, name)
    if obj is None:
        raise ApiError(status(404, "NotFound", f'{qualified(kind)} "{name}" not found', _details(kind, name)))
    return obj


def delete(fake: FakeApiServer, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
    """Store.Delete: with finalizers only deletionTimestamp is set (the object comes back); otherwise gone."""
    with fake._lock:
        obj = stored(fake, kind, namespace, name)
        if obj["metadata"].get("finalizers"):
            if obj["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(obj)
            prev = copy.deepcopy(obj)
            obj["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
            return fake._write(kind, "MODIFIED", obj, prev)
        # The resource.k8s.io registries set ReturnDeletedObject: the answer is the object at its delete.
        fake._store(kind).remove(obj)
        return fake._write(kind, "DELETED", obj, copy.deepcopy(obj))


def _check_version(new: dict[str, Any], old: dict[str, Any], kind: str, group: str) -> None:
    want = str((new.get("metadata") or {}).get("resourceVersion") or "")
    if want and want != old["metadata"].get("resourceVersion"):
        raise modified_conflict(kind, old["metadata"]["name"], group)


def _keep_system_meta(new: dict[str, Any], old: dict[str, Any]) -> None:
    meta = new.setdefault("metadata", {})
    for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "generateName"):
        _copy_key(meta, old["metadata"], key)
    for key in ("apiVersion", "kind"):
        _copy_key(new, old, key)


def _finalizer_errors(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    if not old["metadata"].get("deletionTimestamp"):
        return []
    extra = sorted(set(new["metadata"].get("finalizers") or []) - set(old["metadata"].get("finalizers") or []))
    if not extra:
        return []
    listed = ", ".join(json.dumps(f) for f in extra)
    return [forbidden("metadata.finalizers", "no new finalizers can be added if the object is being deleted, "
                                             f"found new finalizers []string{{{listed}}}")]


def update_claim(fake: FakeApiServer, namespace: str, name: str, body: dict[str, Any],
                 status_only: bool) -> dict[str, Any]:
    """resourceclaimStrategy / resourceclaimStatusStrategy Update (lock held by the caller or taken here)."""
    with fake._lock:
        old = stored(fake, "resourceclaims", namespace, name)
        new = copy.deepcopy(body)
        _check_version(new, old, "resourceclaims", GROUP)
        _keep_system_meta(new, old)
        if status_only:
            new["spec"] = copy.deepcopy(old.get("spec"))
            for key in ("generation", "labels", "annotations", "finalizers", "ownerReferences"):
                _copy_key(new["metadata"], old["metadata"], key)
            drop_deallocated_devices(new, old)
            errs = status_update_errors(new, old)
        else:
            _copy_key(new, old, "status")
            default_claim_spec(new.setdefault("spec", {}))
            errs = _finalizer_errors(new, old)
            if new.get("spec") != old.get("spec"):
                errs.append(invalid("spec", new.get("spec"), "field is immutable"))
        if errs:
            raise invalid_error("ResourceClaim", GROUP, name, errs)
        return _replace(fake, "resourceclaims", old, new)


def _replace(fake: FakeApiServer, kind: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Store the update; no change writes nothing; the last finalizer gone from a deleted object removes it."""
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
    for key in [k for k in ("status",) if new.get(k) == {}]:
        new.pop(key)
    if new == old:
        return copy.deepcopy(old)
    prev = copy.deepcopy(old)
    store = fake._store(kind)
    store[store.index(old)] = new
    if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
        store.remove(new)
        return fake._write(kind, "DELETED", new, prev)
    return fake._write(kind, "MODIFIED", new, prev)


def patch_claim(fake: FakeApiServer, namespace: str, name: str, content_type: str, body: bytes,
                status_only: bool) -> dict[str, Any]:
    with fake._lock:
        patched = apply_patch(stored(fake, "resourceclaims", namespace, name), content_type, body)
        return update_claim(fake, namespace, name, patched, status_only)


def update_pod(fake: FakeApiServer, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """podStrategy update: status kept, ValidatePodUpdate's spec rules."""
    with fake._lock:
        old = fake._find("pods", namespace, name)
        if old is None:
            raise ApiError(status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        new = copy.deepcopy(body)
        _check_version(new, old, "pods", "")
        _keep_system_meta(new, old)
        _copy_key(new, old, "status")
        errs = _finalizer_errors(new, old) + pod_update_errors(new.get("spec") or {}, old.get("spec") or {})
        if errs:
            raise invalid_error("Pod", "", name, errs)
        return _replace(fake, "pods", old, new)


def patch_pod(fake: FakeApiServer, namespace: str, name: str, content_type: str, body: bytes) -> dict[str, Any]:
    with fake._lock:
        old = fake._find("pods", namespace, name)
        if old is None:
            raise ApiError(status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        patched = apply_patch(old, content_type, body)
        want_uid = (patched.get("metadata") or {}).get("uid")
        if want_uid != old["metadata"].get("uid"):
            raise ApiError(status(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": Precondition '
                                                   f"failed: UID in precondition: {want_uid}, UID in object meta: "
                                                   f"{old['metadata'].get('uid')}", {"name": name, "kind": "pods"}))
        return update_pod(fake, namespace, name, patched)


# ---- HTTP routing -------------------------------------------------------------------------------------------


def parse_path(path: str) -> _Route | None:
    """/apis/resource.k8s.io/v1/{resourceslices|deviceclasses}[/{name}], .../resourceclaims (all namespaces),
    .../namespaces/{ns}/{resourceclaims|resourceclaimtemplates}[/{name}[/status]]."""
    rest = path[len(PREFIX):].strip("/").split("/")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in DRA_KINDS or len(rest) > 3:
        return None
    cluster_scoped = rest[0] in DRA_CLUSTER_SCOPED
    if (cluster_scoped and namespace is not None) or (not cluster_scoped and namespace is None and len(rest) > 1):
        return None
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and (sub != "status" or rest[0] != "resourceclaims"):
        return None
    return _Route(rest[0], namespace, rest[1] if len(rest) > 1 else None, sub)


def _needs_namespace(route: _Route) -> str | None:
    if route.kind in DRA_CLUSTER_SCOPED:
        return None
    if route.namespace is None:
        raise ApiError(status(405, "MethodNotAllowed", "the server does not allow this method"))
    return route.namespace


def _check_body_name(body: dict[str, Any], name: str) -> None:
    got = (body.get("metadata") or {}).get("name")
    if got not in (None, name):
        raise bad_request(f"the name of the object ({got}) does not match the name on the URL ({name})")


def _dra_write(h: _Handler, rec: Recorded, route: _Route) -> tuple[int, Any]:
    fake, method, name = h.fake, h.command, route.name or ""
    namespace = _needs_namespace(route)
    if method == "POST" and route.name is None:
        return 201, create(fake, route.kind, namespace, _json_body(rec))
    if method == "DELETE" and route.name and route.sub is None:
        return 200, delete(fake, route.kind, namespace, name)
    if route.kind == "resourceclaims" and route.name and namespace is not None:
        status_only = route.sub == "status"
        if method == "PUT":
            body = _json_body(rec)
            _check_body_name(body, name)
            return 200, update_claim(fake, namespace, name, body, status_only)
        if method == "PATCH":
            content_type = rec.headers.get("content-type", "").split(";")[0].strip()
            return 200, patch_claim(fake, namespace, name, content_type, rec.body, status_only)
    raise ApiError(status(405, "MethodNotAllowed", "the server does not allow this method"))


def answer(h: _Handler, rec: Recorded, list_or_watch: Callable[..., Any]) -> Any:
    """Serve a /apis/resource.k8s.io/v1/ request (the apiserver's list/watch handler is passed in)."""
    route = parse_path(rec.path)
    if route is None:
        raise ApiError(status(404, "NotFound", "the server could not find the requested resource"))
    if h.command == "GET":
        if route.name is None:
            return list_or_watch(h, rec, route)
        with h.fake._lock:
            return 200, copy.deepcopy(stored(h.fake, route.kind, route.namespace, route.name))
    return _dra_write(h, rec, route)


def pod_write(h: _Handler, rec: Recorded, route: _Route) -> tuple[int, Any]:
    """PUT and PATCH of /api/v1/namespaces/{ns}/pods/{name}."""
    namespace = route.namespace
    if namespace is None:
        raise ApiError(status(405, "MethodNotAllowed", "the server does not allow this method"))
    name = route.name or ""
    if h.command == "PUT":
        body = _json_body(rec)
        _check_body_name(body, name)
        return 200, update_pod(h.fake, namespace, name, body)
    content_type = rec.headers.get("content-type", "").split(";")[0].strip()
    return 200, patch_pod(h.fake, namespace, name, content_type, rec.body)
