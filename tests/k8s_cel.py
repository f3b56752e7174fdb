"""CEL as the Kubernetes API server evaluates it in admission (matchConditions, ValidatingAdmissionPolicy), for
tests: cel-python (a maintained CEL implementation) plus the functions of cel-go's strings extension that the
chart's expressions use (split, trim, join; in the API server's base environment since 1.29:
k8s.io/apiserver/pkg/cel/environment/base.go, ext.Strings(ext.StringsVersion(2))).

Objects go in as the API server hands them over (JSON-shaped dicts; an absent field is absent, so an unguarded
access is an error here as there). `oldObject` is null on CREATE. A policy's variables are evaluated in order
(the API server evaluates them lazily; here every one is evaluated, which is stricter: none may fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

_ENV = celpy.Environment()


def _split(text: Any, sep: Any) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(part) for part in str(text).split(str(sep))])


def _trim(text: Any) -> celtypes.StringType:
    # cel-go trims Unicode white space (strings.TrimSpace)
    return celtypes.StringType(str(text).strip())


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(sep).join(str(item) for item in items))


K8S_FUNCTIONS: dict[str, Any] = {"split": _split, "trim": _trim, "join": _join}


class CelError(AssertionError):
    """An expression failed to compile or to evaluate (the API server would deny, failurePolicy Fail)."""


def compile_program(expression: str) -> Any:
    try:
        return _ENV.program(_ENV.compile(expression), functions=K8S_FUNCTIONS)
    except celpy.CELParseError as err:
        raise CelError(f"does not compile: {err}\n{expression}") from None


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """The expression's value; CelError when it fails (an unguarded access, a type error)."""
    program = compile_program(expression)
    try:
        value = program.evaluate({k: v if isinstance(v, celtypes.MapType) else celpy.json_to_cel(v)
                                  for k, v in activation.items()})
    except celpy.CELEvalError as err:
        raise CelError(f"fails: {err.args[0] if err.args else err}\n{expression}") from None
    if isinstance(value, celpy.CELEvalError):
        raise CelError(f"fails: {value.args[0] if value.args else value}\n{expression}")
    return bool(value) if isinstance(value, celtypes.BoolType) else value


def request(operation: str, *, username: str = "alice", groups: tuple[str, ...] = ("system:authenticated",),
            namespace: str = "default") -> dict[str, Any]:
    """The `request` variable: the AdmissionRequest's fields the chart's expressions read."""
    return {"operation": operation, "namespace": namespace,
            "userInfo": {"username": username, "groups": list(groups)}}


@dataclass(frozen=True)
class Outcome:
    matched: bool
    denied: list[str]  # the message of each failed validation


def run_policy(policy: Mapping[str, Any], *, obj: Any, old: Any, req: Mapping[str, Any],
               namespace: Mapping[str, Any]) -> Outcome:
    """A ValidatingAdmissionPolicy (`spec`) as the API server runs it for one request: every matchCondition
    true, else not matched; then each variable, each validation (false: its messageExpression, else message)."""
    spec = policy["spec"]
    activation: dict[str, Any] = {"object": obj, "oldObject": old, "request": req, "namespaceObject": namespace}
    for cond in spec.get("matchConditions") or []:
        if not evaluate(cond["expression"], activation):
            return Outcome(matched=False, denied=[])
    variables = celtypes.MapType()
    for var in spec.get("variables") or []:
        value = evaluate(var["expression"], {**activation, "variables": variables})
        variables[celtypes.StringType(var["name"])] = celtypes.BoolType(value) if isinstance(value, bool) else value
    scope = {**activation, "variables": variables}
    denied = []
    for rule in spec["validations"]:
        if not bool(evaluate(rule["expression"], scope)):
            message = rule.get("message", "")
            if "messageExpression" in rule:
                message = str(evaluate(rule["messageExpression"], scope))
            denied.append(message)
    return Outcome(matched=True, denied=denied)
