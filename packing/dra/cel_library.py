"""The Kubernetes CEL library DRA selectors may call, for cel-python: `quantity` and `semver` (k8s.io/apiserver
pkg/cel/library `quantity.go`, `semverlib.go`) and cel-go's strings extension as Kubernetes enables it. Values
follow Kubernetes' parsers: quantities exact to nano units, semver 2.0 precedence."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes


class SelectorError(ValueError):
    """An expression that does not compile or cannot yield a bool; the message names it."""


class SelectorRuntimeError(ValueError):
    """Evaluating an expression for one device failed (e.g. no such key); the message names both."""


# ---- Quantity ------------------------------------------------------------------------------------------------

_QUANTITY_RE = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?([eEinumkKMGTP]*[+-]?\d*)")
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO = 10**9
_MAX_BINARY = 2**63 - 1
_MAX_EXPONENT = 1000  # far beyond any real quantity; keeps a hostile "1e99999999" from building a huge integer


class CelQuantity:
    """A Kubernetes resource.Quantity inside CEL: its exact value."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CelQuantity):
            return NotImplemented
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.value})"


def _suffix(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a quantity suffix, None if it is not one (resource's suffixHandler.interpret)."""
    if suffix in _DECIMAL_SUFFIX:
        return 10, _DECIMAL_SUFFIX[suffix]
    if suffix in _BINARY_SUFFIX:
        return 2, _BINARY_SUFFIX[suffix]
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?\d+", suffix[1:]):
        exponent = int(suffix[1:])
        if abs(exponent) <= _MAX_EXPONENT:
            return 10, exponent
    return None


def _digitless_is_zero(frac: str, base: int, exponent: int) -> bool:
    # ParseQuantity's int64 fast path reads a mantissa without digits ("Mi", ".") as 0; its decimal path refuses it.
    if base == 2:
        return exponent * 3 // 10 <= 13
    return exponent - len(frac) >= -9


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string; ValueError if resource.ParseQuantity refuses it."""
    match = _QUANTITY_RE.fullmatch(text)
    found = _suffix(match.group(4)) if match and text else None
    if match is None or found is None:
        raise ValueError(f"invalid quantity {text!r}")
    sign, num, frac = match.group(1), match.group(2), match.group(3) or ""
    base, exponent = found
    if not (num or frac):
        if _digitless_is_zero(frac, base, exponent):
            return Fraction(0)
        raise ValueError(f"invalid quantity {text!r}: no digits")
    mantissa = Fraction(int(num + frac or "0"), 10 ** len(frac))
    magnitude = mantissa * Fraction(base) ** exponent
    magnitude = Fraction(-((-magnitude * _NANO).__floor__()), _NANO)  # rounded up to whole nano units
    if base == 2:
        magnitude = min(magnitude, Fraction(_MAX_BINARY))
    return -magnitude if sign == "-" else magnitude


# ---- Semver --------------------------------------------------------------------------------------------------

_SEMVER_RE = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?")


class _Version:
    """A parsed semantic version inside CEL; ordered by semver 2.0 precedence (build metadata ignored)."""

    __slots__ = ("core", "pre")

    def __init__(self, core: tuple[int, int, int], pre: tuple[int | str, ...]) -> None:
        self.core = core
        self.pre = pre

    def compare(self, other: _Version) -> int:
        if self.core != other.core:
            return 1 if self.core > other.core else -1
        if self.pre == other.pre:
            return 0
        if not self.pre or not other.pre:  # a release outranks its pre-releases
            return 1 if not self.pre else -1
        return 1 if _pre_key(self.pre) > _pre_key(other.pre) else -1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Version):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.core, self.pre))

    def __repr__(self) -> str:
        return f"semver({'.'.join(map(str, self.core))}{'-' if self.pre else ''}{'.'.join(map(str, self.pre))})"


def _pre_key(pre: tuple[int | str, ...]) -> tuple[tuple[int, int, str], ...]:
    # numeric identifiers rank below alphanumeric ones; a shorter prefix ranks below (tuple order does that)
    return tuple((0, part, "") if isinstance(part, int) else (1, 0, part) for part in pre)


@functools.lru_cache(maxsize=4096)
def parse_semver(text: str) -> _Version:
    """A strict semver 2.0 string (no "v", no leading zeros); ValueError otherwise."""
    match = _SEMVER_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid semantic version {text!r}")
    core = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    pre = tuple(int(p) if p.isdigit() else p for p in match.group(4).split(".")) if match.group(4) else ()
    return _Version(core, pre)


def _without_leading_zeros(part: str) -> str:
    if len(part) <= 1:
        return part
    stripped = part.lstrip("0")
    return stripped if stripped[:1].isdigit() else "0" + stripped


def _normalized_semver(text: str) -> _Version:
    """semver(text, true): no "v" prefix, missing minor/patch filled with 0, leading zeros dropped."""
    parts = [_without_leading_zeros(p) for p in text.removeprefix("v").split(".", 2)]
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError(f"invalid semantic version {text!r}: a short version cannot have a pre-release")
        parts += ["0"] * (3 - len(parts))
    return parse_semver(".".join(parts))


# ---- the Kubernetes functions ----------------------------------------------------------------------------------


def _as_quantity(value: Any, what: str) -> CelQuantity:
    if isinstance(value, CelQuantity):
        return value
    if isinstance(value, celtypes.IntType) and what == "operand":
        return CelQuantity(Fraction(int(value)))
    raise TypeError(f"no such overload: {what} {value!r} is not a quantity")


def _quantity(text: Any) -> CelQuantity:
    if not isinstance(text, str):
        raise TypeError(f"no such overload: quantity({text!r})")
    return CelQuantity(parse_quantity(str(text)))


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        _quantity(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: Any, normalize: Any = False) -> _Version:
    if not isinstance(text, str):
        raise TypeError(f"no such overload: semver({text!r})")
    return _normalized_semver(str(text)) if normalize else parse_semver(str(text))


def _is_semver(text: Any, normalize: Any = False) -> celtypes.BoolType:
    try:
        _semver(text, normalize)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(left: Any, right: Any) -> int:
    """compareTo for two quantities or two semvers (the one name covers both libraries' overloads)."""
    if isinstance(left, _Version) and isinstance(right, _Version):
        return left.compare(right)
    a, b = _as_quantity(left, "receiver").value, _as_quantity(right, "argument").value
    return (a > b) - (a < b)


def _as_integer(q: Any) -> celtypes.IntType:
    value = _as_quantity(q, "receiver").value
    if value.denominator != 1 or not -(2**63) <= value.numerator < 2**63:
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(value.numerator)


def _is_integer(q: Any) -> celtypes.BoolType:
    value = _as_quantity(q, "receiver").value
    return celtypes.BoolType(value.denominator == 1 and -(2**63) <= value.numerator < 2**63)


def _approximate_float(q: Any) -> celtypes.DoubleType:
    value = _as_quantity(q, "receiver").value
    try:
        return celtypes.DoubleType(float(value))
    except OverflowError:
        return celtypes.DoubleType(float("inf") if value > 0 else float("-inf"))


def _version_part(index: int) -> Callable[[Any], celtypes.IntType]:
    def part(v: Any) -> celtypes.IntType:
        if not isinstance(v, _Version):
            raise TypeError(f"no such overload: {v!r} is not a semver")
        return celtypes.IntType(v.core[index])
    return part


def _index_of(text: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    found = str(text).find(str(sub), int(start))
    return celtypes.IntType(found)


def _substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    s = str(text)
    stop = len(s) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(s):
        raise ValueError(f"substring({start}, {stop}) out of range for a string of {len(s)}")
    return celtypes.StringType(s[int(start):stop])


def _replace(text: Any, old: Any, new: Any, count: Any = -1) -> celtypes.StringType:
    return celtypes.StringType(str(text).replace(str(old), str(new), int(count)))


KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "add": lambda q, o: CelQuantity(_as_quantity(q, "receiver").value + _as_quantity(o, "operand").value),
    "sub": lambda q, o: CelQuantity(_as_quantity(q, "receiver").value - _as_quantity(o, "operand").value),
    "mul": lambda q, n: CelQuantity(_as_quantity(q, "receiver").value * int(n)),
    "sign": lambda q: celtypes.IntType((_as_quantity(q, "receiver").value > 0) - (_as_quantity(q, "receiver").value < 0)),
    "asInteger": _as_integer,
    "isInteger": _is_integer,
    "asApproximateFloat": _approximate_float,
    "major": _version_part(0),
    "minor": _version_part(1),
    "patch": _version_part(2),
    # cel-go strings extension (Unicode code points, as cel-go counts them)
    "split": lambda s, sep: celtypes.ListType([celtypes.StringType(p) for p in str(s).split(str(sep))]),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "join": lambda items, sep="": celtypes.StringType(str(sep).join(str(i) for i in items)),
    "lowerAscii": lambda s: celtypes.StringType("".join(c.lower() if c.isascii() else c for c in str(s))),
    "upperAscii": lambda s: celtypes.StringType("".join(c.upper() if c.isascii() else c for c in str(s))),
    "charAt": lambda s, i: celtypes.StringType(str(s)[int(i):int(i) + 1]),
    "indexOf": _index_of,
    "lastIndexOf": lambda s, sub: celtypes.IntType(str(s).rfind(str(sub))),
    "substring": _substring,
    "replace": _replace,
}

def _reporting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function, its failures returned as CEL error values (cel-python would relabel a raised ValueError)."""

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except (ValueError, TypeError) as err:
            return celpy.CELEvalError(str(err))

    return call


KUBERNETES_FUNCTIONS = {name: _reporting(fn) for name, fn in KUBERNETES_FUNCTIONS.items()}
