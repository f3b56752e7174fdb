"""`resource.k8s.io/v1` JSON -> the DRA objects of `packing.dra.objects`. Bad input is an `InputError` naming
the object and the field; what the API server already validated is read, not re-judged."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from packing.dra.cel import Semver
from packing.dra.objects import (
    Allocation,
    AttrValue,
    Capacity,
    Claim,
    ClaimRef,
    Constraint,
    CounterUse,
    Device,
    DeviceClass,
    DeviceId,
    ExactRequest,
    OpaqueConfig,
    Request,
    RequestPolicy,
    ResultDevice,
)
from packing.k8s.quantity import parse_quantity
from packing.model import InputError

_ATTR_KINDS = ("int", "bool", "string", "version")
_TAINT_EFFECTS_BLOCKING = ("NoSchedule", "NoExecute")


def object_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    kind = obj.get("kind") or "object"
    ns = meta.get("namespace")
    return f"{kind} {ns + '/' if ns else ''}{meta.get('name', '?')}"


def _quantity(obj: str, path: str, raw: object) -> Fraction:
    try:
        return parse_quantity(raw)
    except ValueError as err:
        raise InputError(obj, path, str(err)) from None


def _attribute(obj: str, path: str, raw: Mapping[str, Any]) -> AttrValue | None:
    present = [k for k in _ATTR_KINDS if k in raw]
    if len(present) != 1:
        return None  # list forms (alpha DRAListTypeAttributes) or nothing: not read by vramfit's selectors
    kind = present[0]
    value = raw[kind]
    if kind == "version":
        return Semver(str(value))
    if kind == "int" and not isinstance(value, int):
        raise InputError(obj, path, f"int attribute is {value!r}")
    return value  # type: ignore[no-any-return]


def _policy(obj: str, path: str, raw: Mapping[str, Any] | None) -> RequestPolicy | None:
    if not raw:
        return None
    rng = raw.get("validRange") or {}

    def q(key: str, src: Mapping[str, Any]) -> Fraction | None:
        return _quantity(obj, f"{path}.{key}", src[key]) if src.get(key) is not None else None

    values = tuple(_quantity(obj, f"{path}.validValues", v) for v in raw.get("validValues") or ())
    return RequestPolicy(default=q("default", raw), min=q("min", rng), max=q("max", rng), step=q("step", rng),
                         valid_values=values)


def _device(obj: str, path: str, raw: Mapping[str, Any], driver: str, pool: str, node: str | None) -> Device:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(obj, f"{path}.name", "a device needs a name")
    attrs: dict[str, AttrValue] = {}
    for key, val in (raw.get("attributes") or {}).items():
        parsed = _attribute(obj, f"{path}.attributes[{key}]", val or {})
        if parsed is not None:
            attrs[key] = parsed
    caps = {key: Capacity(_quantity(obj, f"{path}.capacity[{key}].value", (val or {}).get("value")),
                                           _policy(obj, f"{path}.capacity[{key}].requestPolicy",
                                                   (val or {}).get("requestPolicy")))
            for key, val in (raw.get("capacity") or {}).items()}
    consumes = tuple(CounterUse(str(c.get("counterSet", "")),
                                tuple((str(k), _quantity(obj, f"{path}.consumesCounters", (v or {}).get("value")))
                                      for k, v in (c.get("counters") or {}).items()))
                     for c in raw.get("consumesCounters") or ())
    tainted = any(t.get("effect") in _TAINT_EFFECTS_BLOCKING for t in raw.get("taints") or ())
    return Device(DeviceId(driver, pool, name), node, attrs, caps, bool(raw.get("allowMultipleAllocations")),
                  consumes, tainted)


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, str, int, int, str | None, tuple[Device, ...],
                                                    dict[str, dict[str, Fraction]]]:
    """One ResourceSlice -> (driver, pool, generation, slice count, node, devices, counter sets)."""
    name = object_name({"kind": "ResourceSlice", **obj})
    spec = obj.get("spec") or {}
    driver = spec.get("driver")
    pool = spec.get("pool") or {}
    if not isinstance(driver, str) or not driver or not isinstance(pool.get("name"), str):
        raise InputError(name, "spec.driver / spec.pool.name", "a ResourceSlice needs a driver and a pool name")
    node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
    devices = tuple(_device(name, f"spec.devices[{i}]", d, driver, pool["name"], node)
                    for i, d in enumerate(spec.get("devices") or ()))
    counters = {str(cs.get("name")): {str(k): _quantity(name, "spec.sharedCounters", (v or {}).get("value"))
                                      for k, v in (cs.get("counters") or {}).items()}
                for cs in spec.get("sharedCounters") or ()}
    return (driver, pool["name"], int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 1), node,
            devices, counters)


def _configs(obj: str, path: str, raw: Any) -> tuple[OpaqueConfig, ...]:
    out = []
    for i, c in enumerate(raw or ()):
        opaque = (c or {}).get("opaque")
        if not isinstance(opaque, Mapping) or not isinstance(opaque.get("driver"), str):
            raise InputError(obj, f"{path}[{i}].opaque", "a device config needs opaque.driver")
        out.append(OpaqueConfig(tuple(c.get("requests") or ()), opaque["driver"], opaque.get("parameters")))
    return tuple(out)


def device_class(obj: Mapping[str, Any]) -> DeviceClass:
    name = object_name({"kind": "DeviceClass", **obj})
    spec = obj.get("spec") or {}
    selectors = tuple(_cel(name, f"spec.selectors[{i}]", s) for i, s in enumerate(spec.get("selectors") or ()))
    return DeviceClass((obj.get("metadata") or {}).get("name", ""), selectors,
                       _configs(name, "spec.config", spec.get("config")))


def _cel(obj: str, path: str, raw: Mapping[str, Any]) -> str:
    expr = ((raw or {}).get("cel") or {}).get("expression")
    if not isinstance(expr, str):
        raise InputError(obj, f"{path}.cel.expression", "a selector needs a CEL expression")
    return expr


def _exact(obj: str, path: str, name: str, raw: Mapping[str, Any]) -> ExactRequest:
    cls = raw.get("deviceClassName")
    if not isinstance(cls, str) or not cls:
        raise InputError(obj, f"{path}.deviceClassName", "a request needs a device class")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise InputError(obj, f"{path}.allocationMode", f"unknown allocation mode {mode!r}")
    count = raw.get("count", 1)
    if mode == "ExactCount" and (not isinstance(count, int) or count < 1):
        raise InputError(obj, f"{path}.count", f"expected a whole number >= 1, got {count!r}")
    requests = ((raw.get("capacity") or {}).get("requests") or {})
    capacity = {k: _quantity(obj, f"{path}.capacity.requests[{k}]", v) for k, v in requests.items()}
    return ExactRequest(name, cls, tuple(_cel(obj, f"{path}.selectors[{i}]", s)
                                         for i, s in enumerate(raw.get("selectors") or ())),
                        mode == "All", int(count) if mode == "ExactCount" else 0, capacity,
                        bool(raw.get("adminAccess")))


def _request(obj: str, i: int, raw: Mapping[str, Any]) -> Request:
    name = raw.get("name")
    path = f"spec.devices.requests[{i}]"
    if not isinstance(name, str) or not name:
        raise InputError(obj, f"{path}.name", "a request needs a name")
    if isinstance(raw.get("exactly"), Mapping):
        return Request(name, (_exact(obj, f"{path}.exactly", name, raw["exactly"]),))
    subs = raw.get("firstAvailable")
    if not subs:
        raise InputError(obj, path, "a request needs exactly or firstAvailable")
    return Request(name, tuple(_exact(obj, f"{path}.firstAvailable[{j}]", f"{name}/{s.get('name', '')}", s)
                               for j, s in enumerate(subs)))


def _result(obj: str, i: int, raw: Mapping[str, Any]) -> ResultDevice:
    path = f"status.allocation.devices.results[{i}]"
    parts = [raw.get(k) for k in ("request", "driver", "pool", "device")]
    if not all(isinstance(p, str) and p for p in parts):
        raise InputError(obj, path, "a result needs request, driver, pool and device")
    driver = str(parts[1])
    consumed = raw.get("consumedCapacity")
    return ResultDevice(str(parts[0]), DeviceId(driver, str(parts[2]), str(parts[3])), raw.get("shareID"),
                        {k: _quantity(obj, f"{path}.consumedCapacity[{k}]", v)
                         for k, v in consumed.items()} if isinstance(consumed, Mapping) else None)


def selector_node(selector: Mapping[str, Any] | None) -> str | None:
    """The one node a `nodeSelector` names as kube-scheduler writes it (`matchFields metadata.name In [node]`)."""
    terms: list[Any] = list((selector or {}).get("nodeSelectorTerms") or ())
    if len(terms) != 1:
        return None
    for field_ in terms[0].get("matchFields") or ():
        values: list[Any] = list(field_.get("values") or ())
        if field_.get("key") == "metadata.name" and field_.get("operator") == "In" and len(values) == 1:
            return str(values[0])
    return None


def _allocation(obj: str, raw: Mapping[str, Any] | None) -> Allocation | None:
    if not raw:
        return None
    results = tuple(_result(obj, i, r) for i, r in enumerate((raw.get("devices") or {}).get("results") or ()))
    return Allocation(results, selector_node(raw.get("nodeSelector")))


def claim(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim. Capacity names stay as written: a name without a domain is the device's driver's."""
    name = object_name({"kind": "ResourceClaim", **obj})
    meta = obj.get("metadata") or {}
    devices = (obj.get("spec") or {}).get("devices") or {}
    status = obj.get("status") or {}
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or ()
                  if o.get("kind") == "Pod" and o.get("controller")), None)
    constraints = tuple(Constraint(tuple(c.get("requests") or ()), c.get("matchAttribute"), c.get("distinctAttribute"))
                        for c in devices.get("constraints") or ())
    return Claim(ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", ""))), str(meta.get("uid", "")),
                 str(meta.get("resourceVersion", "")),
                 tuple(_request(name, i, r) for i, r in enumerate(devices.get("requests") or ())),
                 constraints, _configs(name, "spec.devices.config", devices.get("config")),
                 _allocation(name, status.get("allocation")),
                 tuple(str(r.get("uid", "")) for r in status.get("reservedFor") or ()),
                 tuple(meta.get("finalizers") or ()), bool(meta.get("deletionTimestamp")), owner)
