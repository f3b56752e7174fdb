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


from packing.dra.cel_library import (  # noqa: E402 - the library comes after the value types it knows
    KUBERNETES_FUNCTIONS,
    CelQuantity,
    SelectorError,
    SelectorRuntimeError,
    parse_quantity,
    parse_semver,
)

__all__ = ["KUBERNETES_FUNCTIONS", "AttrValue", "CelDevice", "CompiledSelector", "SelectorError",
           "SelectorRuntimeError", "Semver", "compile_selector", "device_matches", "parse_quantity", "parse_semver",
           "qualify"]


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
        capacity = _by_domain(self.capacity, self.driver, lambda v: CelQuantity(Fraction(v)))
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
