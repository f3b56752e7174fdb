"""Which devices a request may get: its class's selectors, its own selectors (CEL, `packing.dra.cel`) and its
capacity requests, as kube-scheduler's allocator judges a device. Results are cached per selector set and device
object, so a changed slice re-evaluates only its own devices."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from packing.dra.capacity import consumption, satisfies
from packing.dra.cel import SelectorError, SelectorRuntimeError, device_matches
from packing.dra.objects import Device, DeviceClass, DeviceId, ExactRequest


class RequestError(ValueError):
    """A request that cannot be judged: unknown class, a selector that does not compile or fails to evaluate."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
# Macros that iterate a map's keys can read a value without naming it: no fingerprint for such selectors.
_ITERATING = (".all(", ".exists(", ".exists_one(", ".map(", ".filter(", " in device")


def _read_names(selectors: tuple[str, ...]) -> frozenset[str] | None:
    """Every name the selectors can read (CEL reads map values by literal keys), None when they iterate."""
    text = " ".join(selectors)
    if any(m in text for m in _ITERATING):
        return None
    return frozenset(_NAME.findall(text)) | frozenset(s.strip("'\"") for s in re.findall(r"'[^']*'|\"[^\"]*\"", text))


def _fingerprint(names: frozenset[str], device: Device) -> tuple[object, ...]:
    """What a selector reading only `names` can see of a device: devices alike in it get one verdict, so 8 GPUs
    of one product are judged once, not 8 times (cel-python evaluates a few thousand selectors a second)."""
    attrs = tuple(sorted((k, v) for k, v in device.attributes.items() if k.rpartition("/")[2] in names or k in names))
    caps = tuple(sorted((k, c.value) for k, c in device.capacity.items()
                        if k.rpartition("/")[2] in names or k in names))
    return (device.id.driver, device.allow_multiple, attrs, caps)


@dataclass
class SelectorCache:
    """(selectors) -> device id -> (the device object judged, the verdict); and (selectors) -> what a selector
    can read of a device -> the verdict."""

    verdicts: dict[tuple[str, ...], dict[DeviceId, tuple[Device, bool]]] = field(default_factory=dict)
    # (a device's published capacities, what a request asks) -> what one allocation consumes, or why not
    capacity: dict[tuple[str, tuple[tuple[str, Fraction], ...]], dict[str, Fraction] | str | None] = field(
        default_factory=dict)
    alike: dict[tuple[str, ...], dict[tuple[object, ...], bool]] = field(default_factory=dict)
    names: dict[tuple[str, ...], frozenset[str] | None] = field(default_factory=dict)

    def matches(self, selectors: tuple[str, ...], device: Device) -> bool:
        seen = self.verdicts.setdefault(selectors, {})
        hit = seen.get(device.id)
        if hit is not None and hit[0] is device:
            return hit[1]
        if selectors not in self.names:
            self.names[selectors] = _read_names(selectors)
        names = self.names[selectors]
        if names is None:
            verdict = _all_match(selectors, device)
        else:
            alike = self.alike.setdefault(selectors, {})
            key = _fingerprint(names, device)
            if key not in alike:
                alike[key] = _all_match(selectors, device)
            verdict = alike[key]
        seen[device.id] = (device, verdict)
        return verdict

    def forget(self, gone: Iterable[DeviceId]) -> None:
        for seen in self.verdicts.values():
            for d in gone:
                seen.pop(d, None)


def _all_match(selectors: tuple[str, ...], device: Device) -> bool:
    cel = device.cel()
    try:
        return all(device_matches(expr, cel) for expr in selectors)
    except SelectorError as err:
        raise RequestError(str(err)) from None
    except SelectorRuntimeError as err:
        # kube-scheduler fails the claim on a selector's runtime error ("CEL runtime error")
        raise RequestError(str(err)) from None


@dataclass(frozen=True)
class DeviceFit:
    """A device a request may get, with what one allocation of it consumes (shareable devices only)."""

    device: Device
    consumed: dict[str, Fraction] | None


def request_selectors(req: ExactRequest, classes: dict[str, DeviceClass]) -> tuple[str, ...]:
    cls = classes.get(req.device_class)
    if cls is None:
        raise RequestError(f"request {req.name}: DeviceClass {req.device_class} does not exist")
    return cls.selectors + req.selectors


def device_fit(req: ExactRequest, device: Device, selectors: tuple[str, ...], cache: SelectorCache) -> DeviceFit | None:
    """The device as this request would take it; None when it may not (tainted, selectors, capacity)."""
    if device.tainted or not cache.matches(selectors, device):
        return None
    return capacity_fit(req, device, cache)


def capacity_fit(req: ExactRequest, device: Device, cache: SelectorCache) -> DeviceFit | None:
    """The device as this request's capacity asks it (selectors aside); judged once per published capacities."""
    key = (device.capacity_key, tuple(sorted(req.capacity.items())))
    if not device.capacity_key or key not in cache.capacity:
        took = consumption(device, req.capacity) if device.allow_multiple else satisfies(device, req.capacity)
        if not device.capacity_key:
            return _fit(device, took)
        cache.capacity[key] = took
    return _fit(device, cache.capacity[key])


def _fit(device: Device, took: dict[str, Fraction] | str | None) -> DeviceFit | None:
    """`consumption`'s answer (shareable devices) or `satisfies`' (exclusive) as a DeviceFit; None: refused."""
    if isinstance(took, str):
        return None
    return DeviceFit(device, took if device.allow_multiple else None)
