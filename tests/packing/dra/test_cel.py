"""DRA CEL selectors against one device, with Kubernetes' semantics (compile.go, the quantity and semver libraries)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.dra.cel import (
    CelDevice,
    SelectorError,
    SelectorRuntimeError,
    Semver,
    compile_selector,
    device_matches,
    parse_quantity,
    qualify,
)

GI = 2**30
NV = "gpu.nvidia.com"


def gpu(memory: int = 80 * GI, product: str = "NVIDIA A100-SXM4-80GB", cc: str = "8.0.0", kind: str = "gpu",
        allow_multiple: bool = False) -> CelDevice:
    return CelDevice(
        driver=NV,
        attributes={f"{NV}/type": kind, f"{NV}/productName": product, f"{NV}/cudaComputeCapability": Semver(cc),
                    f"{NV}/index": 0, f"{NV}/uuid": "GPU-1", "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
                    f"{NV}/mig": kind == "mig"},
        capacity={f"{NV}/memory": Fraction(memory)},
        allow_multiple=allow_multiple,
    )


def test_nvidia_device_class_expressions() -> None:
    gpu_class = f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'"
    mig_class = f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'mig'"
    assert device_matches(gpu_class, gpu())
    assert not device_matches(mig_class, gpu())
    assert device_matches(mig_class, gpu(kind="mig"))
    other = CelDevice(driver="gpu.example.com", attributes={"gpu.example.com/type": "gpu"}, capacity={})
    assert not device_matches(gpu_class, other)


def test_product_name_and_other_domains() -> None:
    assert device_matches(f"device.attributes['{NV}'].productName == 'NVIDIA A100-SXM4-80GB'", gpu())
    assert not device_matches(f"device.attributes['{NV}'].productName == 'NVIDIA H100'", gpu())
    assert device_matches("device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:3b')", gpu())
    assert device_matches(f"device.attributes['{NV}'].index == 0 && device.attributes['{NV}'].mig == false", gpu())


def test_capacity_is_a_quantity() -> None:
    at_least_40 = f"device.capacity['{NV}'].memory.compareTo(quantity('40Gi')) >= 0"
    assert device_matches(at_least_40, gpu(memory=80 * GI))
    assert device_matches(at_least_40, gpu(memory=40 * GI))
    assert not device_matches(at_least_40, gpu(memory=40 * GI - 1))
    assert device_matches(f"device.capacity['{NV}'].memory.isGreaterThan(quantity('40G'))", gpu(memory=40 * GI))
    assert not device_matches(f"device.capacity['{NV}'].memory.isLessThan(quantity('40Gi'))", gpu(memory=40 * GI))
    assert device_matches(f"device.capacity['{NV}'].memory == quantity('80Gi')", gpu())
    assert device_matches(f"device.capacity['{NV}'].memory.sub(quantity('80Gi')).sign() == 0", gpu())
    assert device_matches(f"device.capacity['{NV}'].memory.add(1).asInteger() == {80 * GI + 1}", gpu())


def test_quantity_library() -> None:
    for expression in ["quantity('200M').compareTo(quantity('0.2G')) == 0",
                       "quantity('50M').compareTo(quantity('50Mi')) == -1",
                       "quantity('50k').add(quantity('20k')) == quantity('70k')",
                       "quantity('50k').sub(20000) == quantity('30k')",
                       "quantity('50k').add(20).sub(quantity('100k')).sub(-50000) == quantity('20')",
                       "quantity('50k').sub(20000).asApproximateFloat() == 30000.0",
                       "quantity('50000000G').isInteger()",
                       "!quantity('9999999999999999999999999999999999999G').isInteger()",
                       "!quantity('1.5').isInteger()",
                       "quantity('-1m').sign() == -1",
                       "isQuantity('1.3Gi') && !isQuantity('1,3G') && !isQuantity('200K') && !isQuantity('Three')"]:
        assert device_matches(expression, gpu()), expression
    with pytest.raises(SelectorRuntimeError, match="cannot convert value to integer"):
        device_matches("quantity('1.5').asInteger() == 1", gpu())
    with pytest.raises(SelectorRuntimeError, match="invalid quantity"):
        device_matches("quantity('200K').sign() == 1", gpu())


def test_quantity_parsing_follows_kubernetes() -> None:
    assert parse_quantity("1.5Gi") == Fraction(3 * 2**29)
    assert parse_quantity("100m") == Fraction(1, 10)
    assert parse_quantity("1e3") == 1000 and parse_quantity("1E-3") == Fraction(1, 1000)
    assert parse_quantity("0.1n") == Fraction(1, 10**9)  # rounded up to a whole nano unit
    assert parse_quantity("-0.1n") == Fraction(-1, 10**9)
    assert parse_quantity("1.G") == 10**9
    assert parse_quantity("9Ei") == 2**63 - 1  # binary values are capped
    for bad in ["", "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 "]:
        with pytest.raises(ValueError):
            parse_quantity(bad)


def test_semver_attribute() -> None:
    cc = f"device.attributes['{NV}'].cudaComputeCapability"
    assert device_matches(f"{cc}.isGreaterThan(semver('7.5.0'))", gpu(cc="8.0.0"))
    assert not device_matches(f"{cc}.isGreaterThan(semver('8.0.0'))", gpu(cc="8.0.0"))
    assert device_matches(f"{cc}.compareTo(semver('9.0.0')) < 0", gpu(cc="8.9.0"))
    assert device_matches(f"{cc} == semver('8.0.0+build.1')", gpu(cc="8.0.0"))
    assert device_matches(f"{cc}.major() == 8 && {cc}.minor() == 6 && {cc}.patch() == 1", gpu(cc="8.6.1"))
    assert device_matches("semver('1.0.0-alpha').isLessThan(semver('1.0.0-alpha.1'))", gpu())
    assert device_matches("semver('1.0.0-alpha.beta').isLessThan(semver('1.0.0-beta.2'))", gpu())
    assert device_matches("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))", gpu())
    assert device_matches("semver('v1.2', true) == semver('1.2.0') && isSemver('01.1.1', true)", gpu())
    assert device_matches("isSemver('1.0.0') && !isSemver('v1.0') && !isSemver('01.1.1')", gpu())
    with pytest.raises(SelectorRuntimeError, match="semantic version"):
        device_matches(f"{cc}.major() == 8", gpu(cc="8.0"))


def test_allow_multiple_allocations() -> None:
    assert device_matches("device.allowMultipleAllocations", gpu(allow_multiple=True))
    assert not device_matches("device.allowMultipleAllocations", gpu())


def test_missing_attribute_is_a_runtime_error() -> None:
    with pytest.raises(SelectorRuntimeError, match="nope") as err:
        device_matches(f"device.attributes['{NV}'].nope == 'x'", gpu())
    assert "gpu.nvidia.com" in str(err.value) and "nope ==" in str(err.value)
    # any domain reads as an empty map, so the failure is the attribute's, and has() guards it
    with pytest.raises(SelectorRuntimeError, match="no such"):
        device_matches("device.attributes['other.com'].a == 1", gpu())
    assert not device_matches("has(device.attributes['other.com'].a)", gpu())
    assert not device_matches("'other.com' in device.attributes", gpu())
    assert device_matches(f"device.attributes['{NV}'].nope == 'x' || true", gpu())


def test_unqualified_names_take_the_driver_domain() -> None:
    assert qualify("memory", NV) == f"{NV}/memory"
    assert qualify("resource.kubernetes.io/pciBusID", NV) == "resource.kubernetes.io/pciBusID"
    device = CelDevice(driver=NV, attributes={"type": "gpu"}, capacity={"memory": Fraction(GI)})
    assert device_matches(f"device.attributes['{NV}'].type == 'gpu'", device)
    assert device_matches(f"device.capacity['{NV}'].memory == quantity('1Gi')", device)


def test_compile_errors() -> None:
    for bad in ["device.driver ==", "device.attributes[", "1 +* 2"]:
        with pytest.raises(SelectorError, match="does not compile"):
            compile_selector(bad)
    for not_bool in ["device.driver", "'gpu'", "1 + 2", f"device.capacity['{NV}'].memory.compareTo(quantity('1'))",
                     "quantity('1')", "[true]"]:
        with pytest.raises(SelectorError, match="must evaluate to bool"):
            compile_selector(not_bool)
    with pytest.raises(SelectorError, match="nosuch"):
        compile_selector("nosuch(device.driver)")
    with pytest.raises(SelectorError, match="no field"):
        compile_selector("device.drivr == 'x'")
    assert compile_selector("device.driver == 'x'") is compile_selector("device.driver == 'x'")


def test_dyn_result_that_is_not_bool_fails_at_evaluation() -> None:
    # an attribute is `dyn` in Kubernetes: the type check passes, the evaluation fails
    with pytest.raises(SelectorRuntimeError, match="not bool"):
        device_matches(f"device.attributes['{NV}'].productName", gpu())
    assert device_matches(f"device.attributes['{NV}'].mig || true", gpu())


def test_strings_extension_and_macros() -> None:
    assert device_matches(f"device.attributes['{NV}'].productName.split('-')[0] == 'NVIDIA A100'", gpu())
    assert device_matches(f"device.attributes['{NV}'].productName.lowerAscii().contains('a100')", gpu())
    assert device_matches("['a', 'b'].join(',') == 'a,b' && '  x '.trim() == 'x'", gpu())
    assert device_matches(f"['{NV}'].exists(d, device.attributes[d].type == 'gpu')", gpu())
    assert device_matches("[1, 2, 3].all(x, x > 0) && [1, 2].map(x, x * 2) == [2, 4]", gpu())


_SUFFIXES = ["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "e-2", "n", "u"]


def _quantity_text(sign: str, whole: int, frac: str, suffix: str) -> str:
    return f"{sign}{whole}{'.' + frac if frac else ''}{suffix}"


_quantities = st.builds(_quantity_text, st.sampled_from(["", "-", "+"]), st.integers(0, 10**6),
                        st.text("0123456789", max_size=4), st.sampled_from(_SUFFIXES))


@given(_quantities, _quantities)
def test_quantity_compare_agrees_with_fractions(a: str, b: str) -> None:
    fa, fb = parse_quantity(a), parse_quantity(b)
    expected = (fa > fb) - (fa < fb)
    assert device_matches(f"quantity('{a}').compareTo(quantity('{b}')) == {expected}", gpu())
    assert device_matches(f"quantity('{a}').isLessThan(quantity('{b}')) == {str(fa < fb).lower()}", gpu())


@given(st.sampled_from(["", "-"]), st.integers(0, 10**6), st.text("0123456789", max_size=4),
       st.sampled_from(_SUFFIXES))
def test_parsed_quantity_is_exact_up_to_nano(sign: str, whole: int, frac: str, suffix: str) -> None:
    scale = {"": 1, "m": Fraction(1, 10**3), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10,
             "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "e3": 10**3, "e-2": Fraction(1, 100), "n": Fraction(1, 10**9),
             "u": Fraction(1, 10**6)}[suffix]
    exact = (whole + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)) * scale
    value = parse_quantity(_quantity_text(sign, whole, frac, suffix))
    assert abs(value) >= exact and abs(value) - exact < Fraction(1, 10**9)
    assert (abs(value) * 10**9).denominator == 1
