"""DRA CEL selectors (DeviceClass `spec.selectors[].cel.expression`, a claim request's `selectors[].cel.expression`)
evaluated against one device, as kube-scheduler's allocator does.

cel-python evaluates the CEL; this module adds what Kubernetes adds (facts from
k8s.io/dynamic-resource-allocation/cel/compile.go and k8s.io/apiserver/pkg/cel/library):

- the `device` variable: `driver`, `allowMultipleAllocations`, `attributes[<domain>].<name>` and
  `capacity[<domain>].<name>`. A name without a domain takes the driver's; looking up a domain the device has
  nothing in gives an empty map (so `device.attributes['x.com'].a` fails with "no such key", and
  `has(...)` / `in` can guard it);
- `quantity(...)` / `isQuantity` and the Quantity methods, with resource.ParseQuantity's rules (values rounded up to
  nano units, binary ones capped at 2^63-1), exact here as `Fraction`s;
- `semver(...)` / `isSemver` and the Semver methods (semver 2.0; build metadata ignored in comparisons);
- some of cel-go's strings extension (`split`, `trim`, `join`, `lowerAscii`, ...), as in the base environment.

The result must be a bool. Kubernetes type-checks at compile time; cel-python does not, so an expression whose
type is evident (a literal, `device.driver`, a known function's result) is refused when compiled, and any other
non-bool result fails when evaluated, as a `dyn` result does in Kubernetes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import lark
from celpy import celtypes


@dataclass(frozen=True)
class Semver:
    """A DRA `version` attribute, e.g. "8.0.0" (semver 2.0)."""

    text: str


AttrValue = int | bool | str | Semver


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


class _Quantity:
    """A Kubernetes resource.Quantity inside CEL: its exact value."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Quantity):
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


def _as_quantity(value: Any, what: str) -> _Quantity:
    if isinstance(value, _Quantity):
        return value
    if isinstance(value, celtypes.IntType) and what == "operand":
        return _Quantity(Fraction(int(value)))
    raise TypeError(f"no such overload: {what} {value!r} is not a quantity")


def _quantity(text: Any) -> _Quantity:
    if not isinstance(text, str):
        raise TypeError(f"no such overload: quantity({text!r})")
    return _Quantity(parse_quantity(str(text)))


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
    "add": lambda q, o: _Quantity(_as_quantity(q, "receiver").value + _as_quantity(o, "operand").value),
    "sub": lambda q, o: _Quantity(_as_quantity(q, "receiver").value - _as_quantity(o, "operand").value),
    "mul": lambda q, n: _Quantity(_as_quantity(q, "receiver").value * int(n)),
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

# What cel-python's standard environment and its macros answer to; any other call fails to compile.
_MACROS = frozenset({"has", "dyn", "all", "exists", "exists_one", "map", "filter"})
_KNOWN_CALLS = frozenset(celpy.evaluation.base_functions) | _MACROS | frozenset(KUBERNETES_FUNCTIONS)
# In Kubernetes' base environment but not here: refused by name, so nobody mistakes this for a typo of theirs.
_UNSUPPORTED = frozenset({"bind", "url", "ip", "cidr", "isURL", "isIP", "isCIDR", "isSorted", "sum", "min", "max",
                          "reverse", "quote", "format", "sets", "div", "divInt", "optMap", "orValue", "value"})


# ---- static checks --------------------------------------------------------------------------------------------

_WRAPPERS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary",
                       "member", "primary", "paren_expr"})
_RETURNS = {"quantity": "quantity", "semver": "semver", "add": "quantity", "sub": "quantity", "mul": "quantity",
            "compareTo": "int", "sign": "int", "asInteger": "int", "major": "int", "minor": "int", "patch": "int",
            "size": "int", "indexOf": "int", "lastIndexOf": "int", "asApproximateFloat": "double",
            "split": "list", "map": "list", "filter": "list", "trim": "string", "join": "string",
            "lowerAscii": "string", "upperAscii": "string", "charAt": "string", "substring": "string",
            "replace": "string", "string": "string", "int": "int", "uint": "uint", "double": "double",
            "bytes": "bytes"}
_DEVICE_FIELDS = {"driver": "string", "allowMultipleAllocations": "bool", "attributes": "map", "capacity": "map"}


def _unwrap(node: lark.Tree) -> lark.Tree:
    while node.data in _WRAPPERS and len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
        node = node.children[0]
    return node


def _literal_type(token: str) -> str:
    if token in ("true", "false"):
        return "bool"
    if token == "null":
        return "null"
    if token[:1] in "bB" and token[1:2] in "'\"":
        return "bytes"
    if token[:1] in "'\"" or token[:2].lower() in ("r'", 'r"'):
        return "string"
    if token[-1:] in "uU":
        return "uint"
    return "double" if not token.lower().startswith(("0x", "-0x")) and any(c in token for c in ".eE") else "int"


def _static_type(tree: lark.Tree) -> str | None:
    """The result type evident from the expression's outermost node; None where only evaluation can tell."""
    node = _unwrap(tree)
    if node.data in ("conditionalor", "conditionaland", "relation") or node.data.startswith("relation_"):
        return "bool"
    if node.data == "unary" and isinstance(node.children[0], lark.Tree):
        return "bool" if node.children[0].data == "unary_not" else _static_type(node.children[1])
    if node.data in ("addition", "multiplication"):  # arithmetic keeps its left operand's type
        return _static_type(node.children[0].children[0])
    if node.data in ("list_lit", "map_lit"):
        return node.data[:-4]
    if node.data == "literal":
        return _literal_type(str(node.children[0]))
    if node.data in ("ident_arg", "member_dot_arg"):
        name = str(node.children[0] if node.data == "ident_arg" else node.children[1])
        return "bool" if name.startswith(("is", "has", "exists", "all", "starts", "ends", "contains", "matches")) \
            else _RETURNS.get(name)
    if node.data == "member_dot" and _is_device(node.children[0]):
        return _DEVICE_FIELDS.get(str(node.children[1]))
    return None


def _is_device(node: Any) -> bool:
    target = _unwrap(node)
    return target.data == "ident" and str(target.children[0]) == "device"


def _names(tree: lark.Tree) -> tuple[set[str], set[str]]:
    """The functions the expression calls, and the fields of `device` it reads."""
    calls, fields = set(), set()
    for node in tree.iter_subtrees():
        if node.data == "ident_arg":
            calls.add(str(node.children[0]))
        elif node.data == "member_dot_arg":
            calls.add(str(node.children[1]))
        elif node.data == "member_dot" and _is_device(node.children[0]):
            fields.add(str(node.children[1]))
    return calls, fields


# ---- compile and evaluate --------------------------------------------------------------------------------------

# The interpreting runner: cel-python's transpiler (its CompiledRunner) is faster but emits broken Python for
# method calls on function results (`x.compareTo(quantity('1'))`) and evaluates through module globals.
_ENV = celpy.Environment()


def _error_text(err: BaseException) -> str:
    """cel-python's error, short: its message, unwrapped from the runner's envelope, without the activation dump."""
    args = err.args
    while len(args) >= 3 and args[0] == "evaluation error" and isinstance(args[2], tuple) and args[2]:
        args = args[2]
    text = str(args[0]) if args else str(err)
    if len(args) >= 3 and isinstance(args[2], tuple) and args[2] and text in ("no such key", "evaluation error"):
        text = f"{text}: {', '.join(repr(str(a)) for a in args[2])}"
    return text.split(" (in activation", 1)[0][:300]


@dataclass(frozen=True)
class CompiledSelector:
    expression: str
    program: Any  # a celpy Runner (untyped library)

    def matches(self, activation: Mapping[str, Any], device_name: str = "device") -> bool:
        """The selector's verdict for one device's activation (`device_activation`)."""
        try:
            value = self.program.evaluate(activation)
        except celpy.CELEvalError as err:
            raise SelectorRuntimeError(f"CEL selector {self.expression!r} fails for {device_name}: "
                                       f"{_error_text(err)}") from None
        if not isinstance(value, celtypes.BoolType):
            raise SelectorRuntimeError(f"CEL selector {self.expression!r} yields {type(value).__name__}, not bool, "
                                       f"for {device_name}")
        return bool(value)


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> CompiledSelector:
    """The expression compiled once (cached by its text); SelectorError if it does not compile or is not a bool."""
    try:
        ast = _ENV.compile(expression)
    except celpy.CELParseError as err:
        raise SelectorError(f"CEL selector {expression!r} does not compile: {str(err).strip()}") from None
    calls, fields = _names(ast)
    unsupported = sorted(name for name in calls if name in _UNSUPPORTED or name not in _KNOWN_CALLS)
    unknown_fields = sorted(fields - set(_DEVICE_FIELDS))
    if unknown_fields:
        raise SelectorError(f"CEL selector {expression!r}: device has no field {', '.join(unknown_fields)}")
    if unsupported:
        raise SelectorError(f"CEL selector {expression!r} calls {', '.join(unsupported)}: "
                            "not a function of vramfit's DRA CEL environment")
    result = _static_type(ast)
    if result not in (None, "bool"):
        raise SelectorError(f"CEL selector {expression!r} must evaluate to bool, not {result}")
    program = _ENV.program(ast, functions=KUBERNETES_FUNCTIONS)
    return CompiledSelector(expression=expression, program=program)


# ---- the device ------------------------------------------------------------------------------------------------


class _DomainMap(celtypes.MapType):
    """`device.attributes` / `device.capacity`: a domain the device has nothing in reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def qualify(name: str, driver: str) -> str:
    """A fully-qualified attribute or capacity name: "memory" of driver "gpu.nvidia.com" is "gpu.nvidia.com/memory"."""
    return name if "/" in name else f"{driver}/{name}"


def _cel_attribute(value: AttrValue) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, Semver):
        return parse_semver(value.text)
    return celtypes.StringType(value)


def _by_domain(values: Mapping[str, Any], driver: str, convert: Callable[[Any], Any]) -> _DomainMap:
    grouped: dict[str, dict[celtypes.StringType, Any]] = {}
    for name, value in values.items():
        domain, _, ident = qualify(name, driver).partition("/")
        grouped.setdefault(domain, {})[celtypes.StringType(ident)] = convert(value)
    return _DomainMap({celtypes.StringType(d): celtypes.MapType(m) for d, m in grouped.items()})


@dataclass(frozen=True)
class CelDevice:
    driver: str
    attributes: Mapping[str, AttrValue]  # fully-qualified "domain/name" -> value
    capacity: Mapping[str, Fraction]  # fully-qualified "domain/name" -> the quantity's exact value
    allow_multiple: bool = False

    @functools.cached_property
    def activation(self) -> dict[str, Any]:
        """The CEL variables for this device, built once (SelectorRuntimeError for a malformed version)."""
        try:
            attributes = _by_domain(self.attributes, self.driver, _cel_attribute)
        except ValueError as err:
            raise SelectorRuntimeError(f"device of driver {self.driver!r}: attribute: {err}") from None
        capacity = _by_domain(self.capacity, self.driver, lambda v: _Quantity(Fraction(v)))
        return {"device": celtypes.MapType({
            celtypes.StringType("driver"): celtypes.StringType(self.driver),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(self.allow_multiple),
            celtypes.StringType("attributes"): attributes,
            celtypes.StringType("capacity"): capacity,
        })}


def device_matches(expression: str, device: CelDevice) -> bool:
    """Whether the selector accepts the device; SelectorError (the expression) or SelectorRuntimeError (this
    device: a missing attribute, a non-bool result)."""
    return compile_selector(expression).matches(device.activation, f"a device of driver {device.driver!r}")
