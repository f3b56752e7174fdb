"""Consumable capacity (KEP-5075, dra.md §5): what one allocation of a device takes for what a request asks.

On a device that allows multiple allocations every capacity is consumed: a requested one rounded up by its
`requestPolicy`, the others at the policy's `default` (else the full value). On an exclusive device a capacity
request is only a filter: the device must have at least that much. Source: kubernetes/dynamic-resource-allocation
`structured/internal/incubating/consumable_capacity.go`."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from math import ceil

from packing.dra.objects import Capacity, Device, RequestPolicy

MIB = 1 << 20


def _rounded(policy: RequestPolicy, asked: Fraction) -> Fraction | None:
    """`asked` rounded up as the policy says; None: the policy allows no value that large."""
    if policy.default is not None and asked == policy.default:
        return asked
    if policy.valid_values:
        return next((v for v in policy.valid_values if v >= asked), None)
    value = asked
    if policy.min is not None:
        value = max(value, policy.min)
        if policy.step:
            value = policy.min + policy.step * ceil((value - policy.min) / policy.step)
    if policy.max is not None and value > policy.max:
        return None
    return value


def _one(cap: Capacity, asked: Fraction | None) -> Fraction | None:
    if asked is None:
        if cap.policy is not None and cap.policy.default is not None:
            return cap.policy.default
        return cap.value
    if cap.policy is None:
        return asked
    return _rounded(cap.policy, asked)


def consumption(device: Device, asked: Mapping[str, Fraction]) -> dict[str, Fraction] | str:
    """Every capacity one allocation of a shareable device consumes, by its published name; or why it cannot."""
    named: dict[str, Fraction] = {}
    for name, value in asked.items():
        found = device.capacity_of(name)
        if found is None:
            return f"device {device.id} has no capacity {name}"
        named[found[0]] = value
    out: dict[str, Fraction] = {}
    for key, cap in device.capacity.items():
        took = _one(cap, named.get(key))
        if took is None:
            return f"device {device.id}: {key} request {named.get(key)} breaks its request policy"
        if took > cap.value:
            return f"device {device.id}: {key} needs {took}, the device has {cap.value}"
        out[key] = took
    return out


def satisfies(device: Device, asked: Mapping[str, Fraction]) -> str | None:
    """Why an exclusive device does not have what the request asks (None: it has)."""
    for name, value in asked.items():
        found = device.capacity_of(name)
        if found is None:
            return f"device {device.id} has no capacity {name}"
        if found[1].value < value:
            return f"device {device.id}: {name} is {found[1].value}, the request asks {value}"
    return None


def to_mib(value: Fraction) -> int:
    """Bytes -> whole MiB, rounded up: the books never count less than a share consumes."""
    return int(ceil(value / MIB))
