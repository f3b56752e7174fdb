"""Consumable capacity (packing.dra.capacity; dra.md §5, KEP-5075): what one allocation of a shareable device
consumes. The cases mirror kubernetes/dynamic-resource-allocation `structured/internal/incubating/
consumable_capacity_test.go` (calculateConsumedCapacity, violatesPolicy, GetConsumedCapacityFromRequest), with
`consumption` standing for calculate-then-check: a policy violation is a refusal (a str)."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from dra_objects import NV
from hypothesis import given
from hypothesis import strategies as st

from packing.dra.capacity import consumption, satisfies
from packing.dra.objects import Capacity, Device, DeviceId, RequestPolicy
from packing.k8s.quantity import bytes_to_mib, format_quantity, parse_quantity

MI = 2**20


def device(caps: dict[str, Capacity], shared: bool = True) -> Device:
    return Device(DeviceId("driver-a", "pool-1", "device-1"), "n", {}, caps, shared)


def one(value: F, policy: RequestPolicy | None, asked: F | None) -> F | str:
    """What one capacity `capacity-0` consumes for `asked` (None: not requested)."""
    got = consumption(device({"capacity-0": Capacity(value, policy)}), {} if asked is None else {"capacity-0": asked})
    return got if isinstance(got, str) else got["capacity-0"]


def rng(min_: F | None = None, max_: F | None = None, step: F | None = None, default: F | None = None
        ) -> RequestPolicy:
    return RequestPolicy(default=default, min=min_, max=max_, step=step)


# testCalculateConsumedCapacity
@pytest.mark.parametrize("asked, value, policy, expected", [
    pytest.param(None, F(1), RequestPolicy(), F(1), id="empty"),
    pytest.param(None, F(2), rng(F(1), default=F(1)), F(1), id="min in range"),
    pytest.param(None, F(2), RequestPolicy(default=F(1), valid_values=(F(1),)), F(1), id="default in set"),
    pytest.param(F(2), F(2), rng(F(1), default=F(1)), F(2), id="more than min in range"),
    pytest.param(F(1), F(2), rng(F(2), default=F(1)), F(2), id="less than min in range"),
    pytest.param(F(2), F(3), rng(F(1), step=F(2), default=F(1)), F(3), id="with step (round up)"),
    pytest.param(F(2), F(2), rng(F(1), step=F(1), default=F(1)), F(2), id="with step (no remaining)"),
    pytest.param(F(1, 4), F(1), rng(F(1, 5), F(1), F(1, 10), F(1, 5)), F(3, 10), id="fractional step round up"),
    pytest.param(F(2, 5), F(1), rng(F(1, 5), F(1), F(1, 10), F(1, 5)), F(2, 5), id="fractional step aligned"),
    pytest.param(F(2), F(3), RequestPolicy(default=F(1), valid_values=(F(1), F(2), F(3))), F(2),
                 id="valid value in set"),
    pytest.param(F(2), F(3), RequestPolicy(default=F(1), valid_values=(F(1), F(3))), F(3), id="set (round up)"),
    pytest.param(F(2), F(4), rng(F(0)), F(2), id="range without step: as asked"),
    pytest.param(F(2), F(4), None, F(2), id="no policy: as asked"),
    pytest.param(None, F(4), None, F(4), id="no policy, not asked: the whole value"),
])
def test_calculate_consumed_capacity(asked: F | None, value: F, policy: RequestPolicy, expected: F) -> None:
    assert one(value, policy, asked) == expected


# testViolateCapacityRequestPolicy and the "larger than set" case (passes through rounding, then violates)
@pytest.mark.parametrize("asked, policy", [
    pytest.param(F(2), rng(F(1), F(1), default=F(1)), id="more than maximum"),
    pytest.param(F(2), RequestPolicy(default=F(1), valid_values=(F(1),)), id="not in set"),
    pytest.param(F(3), RequestPolicy(default=F(1), valid_values=(F(1), F(2))), id="larger than set"),
    pytest.param(F(81921 * MI), rng(F(MI), F(80 * 1024 * MI), F(MI), F(80 * 1024 * MI)), id="above max"),
    pytest.param(F(80 * 1024 * MI - 1), rng(F(0), F(80 * 1024 * MI - 2), F(MI)), id="rounded above max"),
])
def test_policy_violations_are_refused(asked: F, policy: RequestPolicy) -> None:
    got = one(F(10**12), policy, asked)
    assert isinstance(got, str) and "request policy" in got


@pytest.mark.parametrize("asked, policy, expected", [
    pytest.param(F(1), rng(F(1), F(2), default=F(1)), F(1), id="less than maximum"),
    pytest.param(F(1), RequestPolicy(default=F(1), valid_values=(F(1),)), F(1), id="in set"),
    pytest.param(F(3, 10), rng(F(1, 5), F(1), F(1, 10), F(1, 5)), F(3, 10), id="fractional step aligned (0.3)"),
])
def test_policy_kept(asked: F, policy: RequestPolicy, expected: F) -> None:
    assert one(F(10), policy, asked) == expected


def test_a_rounded_value_equal_to_the_default_is_always_allowed() -> None:
    # violatesPolicy exempts the default before the max check: 3 rounds to the step 4, the default, above max 2
    assert one(F(10), rng(F(0), F(2), F(4), default=F(4)), F(3)) == F(4)
    assert isinstance(one(F(10), rng(F(0), F(2), F(4), default=F(0)), F(3)), str)


def test_an_unrequested_value_is_checked_too() -> None:
    # no default: the whole value is consumed, and it must fit the policy like any request (CmpRequestOverCapacity)
    got = one(F(5), rng(F(0), step=F(2)), None)
    assert isinstance(got, str) and "no request" in got and "request policy" in got
    assert one(F(5), rng(F(0), step=F(2), default=F(2)), None) == F(2)


def test_get_consumed_capacity_from_request() -> None:
    # requested with a default -> the request; not requested with a default -> the default; neither -> value
    caps = {"capacity-0": Capacity(F(2), rng(F(1), default=F(2))),
            "capacity-1": Capacity(F(2), rng(F(1), default=F(1))),
            "dummy": Capacity(F(1))}
    assert consumption(device(caps), {"capacity-0": F(1), "dummy": F(1)}) == \
        {"capacity-0": F(1), "capacity-1": F(1), "dummy": F(1)}


def test_request_naming_a_missing_capacity_is_refused() -> None:
    got = consumption(device({"capacity-0": Capacity(F(2))}), {"capacity-9": F(1)})
    assert isinstance(got, str) and "no capacity capacity-9" in got


def test_qualified_names_in_the_drivers_domain_match_bare_capacities() -> None:
    # resolve-qualified-name-uses-driver-domain: `driver-a/memory` is the device's `memory`
    d = device({"memory": Capacity(F(8), rng(F(0), step=F(1), default=F(0)))})
    assert consumption(d, {"driver-a/memory": F(3)}) == {"memory": F(3)}
    assert isinstance(consumption(d, {"driver-b/memory": F(3)}), str)


def test_consumption_above_the_value_is_refused() -> None:
    got = one(F(4), rng(F(0), step=F(1)), F(5))
    assert isinstance(got, str) and "the device has 4" in got
    # not requested, no default: the whole value is consumed, exactly what the device has
    assert one(F(4), rng(F(0), step=F(1)), None) == F(4)


# NVIDIA's consumable-shares policies (dra.md §7)
GPU = F(80 * 1024 * MI)
MEMORY_MODE = rng(F(MI), GPU, F(MI), GPU)  # `--consumable-shares=memory`: no request takes the whole GPU
COUNT_MODE = rng(F(0), GPU, F(MI), F(0))  # `unlimited` and `N`


def test_nvidia_memory_mode() -> None:
    assert one(GPU, MEMORY_MODE, None) == GPU
    assert one(GPU, MEMORY_MODE, F(14 * 1024 * MI)) == F(14 * 1024 * MI)
    assert one(GPU, MEMORY_MODE, F(1)) == F(MI)  # below min: min
    assert one(GPU, MEMORY_MODE, F(MI + 1)) == F(2 * MI)
    assert isinstance(one(GPU, MEMORY_MODE, GPU + 1), str)


def test_nvidia_count_mode_with_shares() -> None:
    d = device({"memory": Capacity(GPU, COUNT_MODE),
                "shares": Capacity(F(4), rng(F(1), F(4), F(1), F(1)))})
    assert consumption(d, {}) == {"memory": F(0), "shares": F(1)}
    assert consumption(d, {"memory": F(3 * MI + 5), "shares": F(2)}) == {"memory": F(4 * MI), "shares": F(2)}
    assert isinstance(consumption(d, {"shares": F(5)}), str)


@given(asked=st.integers(0, 2**40), mn=st.integers(0, 2**30), step=st.integers(1, 2**30))
def test_range_rounding_is_the_smallest_step_at_or_above(asked: int, mn: int, step: int) -> None:
    got = one(F(2**42), rng(F(mn), step=F(step)), F(asked))
    assert not isinstance(got, str)
    assert got >= asked and got >= mn and (got - mn) % step == 0
    assert got == mn or got - step < max(asked, mn)


def test_exclusive_device_capacity_is_a_filter() -> None:
    d = device({"memory": Capacity(F(80))}, shared=False)
    assert satisfies(d, {"memory": F(80)}) is None
    assert satisfies(d, {f"{NV}/memory": F(1)}) is not None or d.id.driver != NV  # other domain: no capacity
    assert "the request asks 81" in (satisfies(d, {"memory": F(81)}) or "")
    assert "no capacity" in (satisfies(d, {"shares": F(1)}) or "")


def test_to_mib_rounds_up() -> None:
    assert (bytes_to_mib(F(0)), bytes_to_mib(F(1)), bytes_to_mib(F(MI)), bytes_to_mib(F(MI + 1))) == (0, 1, 1, 2)


# consumedCapacity is written back with format_quantity: it must read back as exactly what was consumed
@given(nano=st.integers(-(10**24), 10**24))
def test_format_quantity_round_trips_whole_nano_units(nano: int) -> None:
    q = F(nano, 10**9)
    assert parse_quantity(format_quantity(q)) == q


@pytest.mark.parametrize("value, text", [
    (F(14 * 2**30), "14Gi"), (F(1000), "1000"), (F(0), "0"), (F(3, 2), "1500m"), (F(1, 400), "2500u"),
    (F(7, 10**9), "7n"), (F(-3, 2), "-1500m"), (F(123456789, 10**8), "1234567890n"),
])
def test_format_quantity_forms(value: F, text: str) -> None:
    assert format_quantity(value) == text


def test_format_quantity_rounds_a_finer_fraction_up_to_nano() -> None:
    assert format_quantity(F(1, 3)) == "333333334n"
    assert format_quantity(F(10**9 - 1, 10**9) + F(1, 10**12)) == "1"  # rounding up may reach a whole number
    assert format_quantity(F(-1, 3)) == "-333333334n"  # away from zero
    assert parse_quantity(format_quantity(F(2, 3))) >= F(2, 3)
