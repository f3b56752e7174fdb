"""`resource.k8s.io/v1` JSON -> the DRA objects of `packing.dra.objects`. Bad input is an `InputError` naming
the object and the field; what the API server already validated is read, not re-judged."""

from __future__ import annotations

import json
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
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    kind = obj.get("kind") or "object"
    ns = meta.get("namespace")
    return f"{kind} {ns + '/' if isinstance(ns, str) and ns else ''}{meta.get('name', '?')}"


def _map(obj: str, path: str, raw: object) -> Mapping[str, Any]:
    """`raw` as a mapping (absent: empty), else an InputError at `path`: a hand-written snapshot may hold anything."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(obj, path, f"expected a mapping, got {type(raw).__name__}")
    return raw


def _list(obj: str, path: str, raw: object) -> list[Any]:
    """`raw` as a list (absent: empty), else an InputError at `path`."""
    if raw is None:
        return []
    if not isinstance(raw, list | tuple):
        raise InputError(obj, path, f"expected a list, got {type(raw).__name__}")
    return list(raw)


def _list_of_maps(obj: str, path: str, raw: object) -> list[Mapping[str, Any]]:
    """`raw` as a list of mappings (absent: empty), else an InputError at `path` or `path[i]`."""
    items = _list(obj, path, raw)
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InputError(obj, f"{path}[{i}]", f"expected a mapping, got {type(item).__name__}")
    return items


def _strings(obj: str, path: str, raw: object) -> tuple[str, ...]:
    items = _list(obj, path, raw)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(obj, f"{path}[{i}]", f"expected a string, got {type(item).__name__}")
    return tuple(items)


def _whole(obj: str, path: str, raw: object, default: int, least: int) -> int:
    """A whole-number field (absent: `default`), at least `least`."""
    if raw is None:
        return default
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < least:
        raise InputError(obj, path, f"expected a whole number >= {least}, got {raw!r}")
    return raw


def _quantity(obj: str, path: str, raw: object) -> Fraction:
    try:
        return parse_quantity(raw)
    except ValueError as err:
        raise InputError(obj, path, str(err)) from None


def _attribute(obj: str, path: str, raw: object) -> AttrValue | None:
    fields = _map(obj, path, raw)
    present = [k for k in _ATTR_KINDS if k in fields]
    if len(present) != 1:
        return None  # list forms (alpha DRAListTypeAttributes) or nothing: not read by vramfit's selectors
    kind = present[0]
    value = fields[kind]
    if kind == "version":
        return Semver(str(value))
    if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        raise InputError(obj, path, f"int attribute is {value!r}")
    return value  # type: ignore[no-any-return]


def _policy(obj: str, path: str, raw: object) -> RequestPolicy | None:
    fields = _map(obj, path, raw)
    if not fields:
        return None
    rng = _map(obj, f"{path}.validRange", fields.get("validRange"))

    def q(key: str, src: Mapping[str, Any], where: str) -> Fraction | None:
        return _quantity(obj, f"{where}.{key}", src[key]) if src.get(key) is not None else None

    values = tuple(_quantity(obj, f"{path}.validValues[{i}]", v)
                   for i, v in enumerate(_list(obj, f"{path}.validValues", fields.get("validValues"))))
    where = f"{path}.validRange"
    return RequestPolicy(default=q("default", fields, path), min=q("min", rng, where), max=q("max", rng, where),
                         step=q("step", rng, where), valid_values=values)


def _counters(obj: str, path: str, raw: object) -> dict[str, Fraction]:
    """A `counters` map: name -> {value: quantity}."""
    return {str(k): _quantity(obj, f"{path}[{k}].value", _map(obj, f"{path}[{k}]", v).get("value"))
            for k, v in _map(obj, path, raw).items()}


def _capacities(obj: str, path: str, raw: object) -> dict[str, Capacity]:
    out = {}
    for key, val in _map(obj, path, raw).items():
        fields = _map(obj, f"{path}[{key}]", val)
        out[str(key)] = Capacity(_quantity(obj, f"{path}[{key}].value", fields.get("value")),
                                 _policy(obj, f"{path}[{key}].requestPolicy", fields.get("requestPolicy")))
    return out


def _device(obj: str, path: str, raw: Mapping[str, Any], driver: str, pool: str, node: str | None) -> Device:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(obj, f"{path}.name", "a device needs a name")
    attrs: dict[str, AttrValue] = {}
    for key, val in _map(obj, f"{path}.attributes", raw.get("attributes")).items():
        parsed = _attribute(obj, f"{path}.attributes[{key}]", val)
        if parsed is not None:
            attrs[str(key)] = parsed
    uses = _list_of_maps(obj, f"{path}.consumesCounters", raw.get("consumesCounters"))
    consumes = tuple(CounterUse(str(c.get("counterSet", "")),
                                tuple(_counters(obj, f"{path}.consumesCounters[{i}].counters",
                                                c.get("counters")).items()))
                     for i, c in enumerate(uses))
    taints = _list_of_maps(obj, f"{path}.taints", raw.get("taints"))
    tainted = any(t.get("effect") in _TAINT_EFFECTS_BLOCKING for t in taints)
    return Device(DeviceId(driver, pool, name), node, attrs, _capacities(obj, f"{path}.capacity", raw.get("capacity")),
                  bool(raw.get("allowMultipleAllocations")), consumes, tainted,
                  json.dumps(raw.get("capacity"), sort_keys=True, default=str))


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, str, int, int, str | None, tuple[Device, ...],
                                                    dict[str, dict[str, Fraction]]]:
    """One ResourceSlice -> (driver, pool, generation, slice count, node, devices, counter sets)."""
    name = object_name({"kind": "ResourceSlice", **obj})
    spec = _map(name, "spec", obj.get("spec"))
    driver = spec.get("driver")
    pool = _map(name, "spec.pool", spec.get("pool"))
    if not isinstance(driver, str) or not driver or not isinstance(pool.get("name"), str):
        raise InputError(name, "spec.driver / spec.pool.name", "a ResourceSlice needs a driver and a pool name")
    generation = _whole(name, "spec.pool.generation", pool.get("generation"), 0, 0)
    count = _whole(name, "spec.pool.resourceSliceCount", pool.get("resourceSliceCount"), 1, 1)
    node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
    devices = tuple(_device(name, f"spec.devices[{i}]", d, driver, pool["name"], node)
                    for i, d in enumerate(_list_of_maps(name, "spec.devices", spec.get("devices"))))
    counters = {str(cs.get("name")): _counters(name, f"spec.sharedCounters[{i}].counters", cs.get("counters"))
                for i, cs in enumerate(_list_of_maps(name, "spec.sharedCounters", spec.get("sharedCounters")))}
    return driver, pool["name"], generation, count, node, devices, counters


def _configs(obj: str, path: str, raw: object) -> tuple[OpaqueConfig, ...]:
    out = []
    for i, c in enumerate(_list_of_maps(obj, path, raw)):
        opaque = c.get("opaque")
        if not isinstance(opaque, Mapping) or not isinstance(opaque.get("driver"), str):
            raise InputError(obj, f"{path}[{i}].opaque", "a device config needs opaque.driver")
        out.append(OpaqueConfig(_strings(obj, f"{path}[{i}].requests", c.get("requests")), opaque["driver"],
                                opaque.get("parameters")))
    return tuple(out)


def _selectors(obj: str, path: str, raw: object) -> tuple[str, ...]:
    return tuple(_cel(obj, f"{path}[{i}]", s) for i, s in enumerate(_list_of_maps(obj, path, raw)))


def device_class(obj: Mapping[str, Any]) -> DeviceClass:
    name = object_name({"kind": "DeviceClass", **obj})
    spec = _map(name, "spec", obj.get("spec"))
    return DeviceClass(str(_map(name, "metadata", obj.get("metadata")).get("name", "")),
                       _selectors(name, "spec.selectors", spec.get("selectors")),
                       _configs(name, "spec.config", spec.get("config")))


def _cel(obj: str, path: str, raw: Mapping[str, Any]) -> str:
    expr = _map(obj, f"{path}.cel", raw.get("cel")).get("expression")
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
    if mode == "ExactCount" and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise InputError(obj, f"{path}.count", f"expected a whole number >= 1, got {count!r}")
    where = f"{path}.capacity.requests"
    requests = _map(obj, where, _map(obj, f"{path}.capacity", raw.get("capacity")).get("requests"))
    capacity = {str(k): _quantity(obj, f"{where}[{k}]", v) for k, v in requests.items()}
    return ExactRequest(name, cls, _selectors(obj, f"{path}.selectors", raw.get("selectors")),
                        mode == "All", int(count) if mode == "ExactCount" else 0, capacity,
                        bool(raw.get("adminAccess")))


def _name(obj: str, path: str, raw: Mapping[str, Any], what: str) -> str:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(obj, f"{path}.name", f"{what} needs a name")
    return name


def _request(obj: str, i: int, raw: Mapping[str, Any]) -> Request:
    path = f"spec.devices.requests[{i}]"
    name = _name(obj, path, raw, "a request")
    if isinstance(raw.get("exactly"), Mapping):
        return Request(name, (_exact(obj, f"{path}.exactly", name, raw["exactly"]),))
    subs = _list_of_maps(obj, f"{path}.firstAvailable", raw.get("firstAvailable"))
    if not subs:
        raise InputError(obj, path, "a request needs exactly or firstAvailable")
    alternatives = []
    for j, sub in enumerate(subs):
        where = f"{path}.firstAvailable[{j}]"
        alternatives.append(_exact(obj, where, f"{name}/{_name(obj, where, sub, 'a subrequest')}", sub))
    return Request(name, tuple(alternatives))


def _result(obj: str, i: int, raw: Mapping[str, Any]) -> ResultDevice:
    path = f"status.allocation.devices.results[{i}]"
    parts = [raw.get(k) for k in ("request", "driver", "pool", "device")]
    if not all(isinstance(p, str) and p for p in parts):
        raise InputError(obj, path, "a result needs request, driver, pool and device")
    driver = str(parts[1])
    consumed = raw.get("consumedCapacity")
    where = f"{path}.consumedCapacity"
    share = raw.get("shareID")
    return ResultDevice(str(parts[0]), DeviceId(driver, str(parts[2]), str(parts[3])),
                        share if isinstance(share, str) else None,
                        None if consumed is None else
                        {str(k): _quantity(obj, f"{where}[{k}]", v) for k, v in _map(obj, where, consumed).items()})


def selector_node(selector: Mapping[str, Any] | None) -> str | None:
    """The one node a `nodeSelector` names as kube-scheduler writes it (`matchFields metadata.name In [node]`);
    None for any other shape."""
    terms = (selector or {}).get("nodeSelectorTerms") if isinstance(selector, Mapping | None) else None
    if not isinstance(terms, list) or len(terms) != 1 or not isinstance(terms[0], Mapping):
        return None
    fields = terms[0].get("matchFields")
    for field_ in fields if isinstance(fields, list) else ():
        if not isinstance(field_, Mapping):
            continue
        values = field_.get("values")
        if (field_.get("key") == "metadata.name" and field_.get("operator") == "In" and isinstance(values, list)
                and len(values) == 1):
            return str(values[0])
    return None


def _allocation(obj: str, raw: object) -> Allocation | None:
    fields = _map(obj, "status.allocation", raw)
    if not fields:
        return None
    devices = _map(obj, "status.allocation.devices", fields.get("devices"))
    path = "status.allocation.devices.results"
    results = tuple(_result(obj, i, r) for i, r in enumerate(_list_of_maps(obj, path, devices.get("results"))))
    return Allocation(results, selector_node(_map(obj, "status.allocation.nodeSelector", fields.get("nodeSelector"))))


def _constraint(obj: str, path: str, raw: Mapping[str, Any]) -> Constraint:
    attrs = [raw.get(k) for k in ("matchAttribute", "distinctAttribute")]
    for key, value in zip(("matchAttribute", "distinctAttribute"), attrs, strict=True):
        if value is not None and not isinstance(value, str):
            raise InputError(obj, f"{path}.{key}", f"expected an attribute name, got {value!r}")
    return Constraint(_strings(obj, f"{path}.requests", raw.get("requests")), attrs[0], attrs[1])


def _constraints(obj: str, raw: object) -> tuple[Constraint, ...]:
    path = "spec.devices.constraints"
    return tuple(_constraint(obj, f"{path}[{i}]", c) for i, c in enumerate(_list_of_maps(obj, path, raw)))


def claim(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim. Capacity names stay as written: a name without a domain is the device's driver's."""
    name = object_name({"kind": "ResourceClaim", **obj})
    meta = _map(name, "metadata", obj.get("metadata"))
    devices = _map(name, "spec.devices", _map(name, "spec", obj.get("spec")).get("devices"))
    status = _map(name, "status", obj.get("status"))
    owners = _list_of_maps(name, "metadata.ownerReferences", meta.get("ownerReferences"))
    owner = next((o.get("uid") for o in owners if o.get("kind") == "Pod" and o.get("controller")), None)
    requests = _list_of_maps(name, "spec.devices.requests", devices.get("requests"))
    reserved = _list_of_maps(name, "status.reservedFor", status.get("reservedFor"))
    return Claim(ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", ""))), str(meta.get("uid", "")),
                 str(meta.get("resourceVersion", "")),
                 tuple(_request(name, i, r) for i, r in enumerate(requests)),
                 _constraints(name, devices.get("constraints")),
                 _configs(name, "spec.devices.config", devices.get("config")),
                 _allocation(name, status.get("allocation")),
                 tuple(str(r.get("uid", "")) for r in reserved),
                 _strings(name, "metadata.finalizers", meta.get("finalizers")), bool(meta.get("deletionTimestamp")),
                 owner)
