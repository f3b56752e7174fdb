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


def _in_range(policy: RequestPolicy) -> bool:
    return any(v is not None for v in (policy.min, policy.max, policy.step))


def _rounded(policy: RequestPolicy, asked: Fraction) -> Fraction:
    """`asked` rounded up as the policy says (calculateConsumedCapacity): to `min`, then to the next `step` above
    it; or to the first valid value at or above it; else as asked. Whether the result is allowed is `_violates`."""
    if policy.min is not None:  # a validRange always has a min (API validation)
        if asked < policy.min or not policy.step:
            return max(asked, policy.min)
        return policy.min + policy.step * ceil((asked - policy.min) / policy.step)
    return next((v for v in policy.valid_values if v >= asked), asked)


def _violates(policy: RequestPolicy, value: Fraction) -> bool:
    """Whether consuming `value` breaks the policy (violatesPolicy): the default is always allowed."""
    if policy.default is not None and value == policy.default:
        return False
    if _in_range(policy):
        if policy.max is not None and value > policy.max:
            return True
        step = policy.step
        return policy.min is not None and step is not None and step > 0 and (value - policy.min) % step != 0
    return bool(policy.valid_values) and value not in policy.valid_values


def _one(cap: Capacity, asked: Fraction | None) -> Fraction | None:
    """What one allocation consumes of `cap` (None: the policy forbids it): the default or the whole value when
    not asked, else the request rounded up; either way checked against the policy, as upstream does."""
    if cap.policy is None:
        return cap.value if asked is None else asked
    if asked is None:
        took = cap.policy.default if cap.policy.default is not None else cap.value
    else:
        took = _rounded(cap.policy, asked)
    return None if _violates(cap.policy, took) else took


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
            asked_text = "no request" if key not in named else f"request {named[key]}"
            return f"device {device.id}: {key} ({asked_text}) breaks its request policy"
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


MEMORY = "memory"  # the capacity that holds a device's VRAM, in bytes (NVIDIA's driver; dra.md §7)


def memory_of(capacities: Mapping[str, Fraction]) -> Fraction | None:
    """The memory among capacities named bare or with a domain (`memory`, `gpu.nvidia.com/memory`); None: absent."""
    return next((v for k, v in capacities.items() if k.rpartition("/")[2] == MEMORY), None)
