"""One registry of placement policies, used by the extender, what-if, demo and the trace benchmark.

The core registers the policies a user chooses from, each for a reason:
- `vramfit` (the default, `FragDual`): the least VRAM the workload mix can no longer use, with the packing LP's
  gap values; what the project is for.
- `best-fit`: the least VRAM left over on the node; the plain packing rule, and the one to compare vramfit with.
- `first-fit`: the first node in cluster order that fits; predictable, for reading a placement by hand.
- `spread`: the most free VRAM; for clusters that want headroom on every node, not packing.
- `whole-gpu`: every GPU pod takes a whole GPU (plain Kubernetes); the baseline `vramfit demo` compares with.
Each is imported here, not loaded by module name, so a broken policy module fails at import where it is seen.
Code outside the core (the trace benchmark's FGD-paper peers and research variants) adds its own with
`register`; the core never imports it. A name is registered once: a second `register` of it raises.

What a policy is, and the core's plain policies, are in `packing.policies.base` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from packing.policies import frag_dual
from packing.policies.base import (
    BasePolicy,
    BestFit,
    FirstFit,
    Guarded,
    Policy,
    PolicyErrorHook,
    Spread,
    WholeGpu,
    k_smallest_sum,
    unit_take,
)

__all__ = [
    "DEFAULT_POLICY", "BasePolicy", "BestFit", "FirstFit", "Guarded", "Policy", "PolicyEntry", "PolicyErrorHook",
    "PolicyFactory", "Spread", "WholeGpu", "core_policy_names", "describe_policies", "get_policy",
    "k_smallest_sum", "policy_factory", "policy_names", "register", "takes_param", "unit_take",
]

DEFAULT_POLICY = "vramfit"

PolicyFactory = Callable[..., Policy]


@dataclass(frozen=True)
class PolicyEntry:
    factory: PolicyFactory  # (**params) -> a fresh Policy
    description: str  # one line, for `vramfit policies`
    params: type | None = None  # the policy's dataclass: its public fields are the parameters (None: none)
    external: bool = False  # registered from outside the core (`register`)

    @property
    def open_params(self) -> bool:
        """Registered from outside with no parameter dataclass: it takes whatever its factory accepts."""
        return self.external and self.params is None

    def param_names(self) -> frozenset[str]:
        if self.params is None or not dataclasses.is_dataclass(self.params):
            return frozenset()
        return frozenset(f.name for f in dataclasses.fields(self.params) if f.init and not f.name.startswith("_")
                         and f.name != "name")


def _doc_line(obj: object) -> str:
    lines = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return lines[0] if lines else ""


_REGISTRY: dict[str, PolicyEntry] = {
    "first-fit": PolicyEntry(FirstFit, _doc_line(FirstFit)),
    "best-fit": PolicyEntry(BestFit, _doc_line(BestFit)),
    "spread": PolicyEntry(Spread, _doc_line(Spread)),
    "whole-gpu": PolicyEntry(WholeGpu, _doc_line(WholeGpu)),
    "vramfit": PolicyEntry(frag_dual.make_vramfit, frag_dual.VRAMFIT_DESCRIPTION, frag_dual.FragDual),
}


def register(name: str, factory: PolicyFactory, description: str = "", params: type | None = None) -> None:
    """Add a policy from outside the core; the description defaults to the factory's first docstring line.
    params: its dataclass, whose public fields are the parameters it takes (None: whatever the factory accepts).
    A name already registered raises ValueError naming it: one name, one policy."""
    if name in _REGISTRY:
        raise ValueError(f"policy {name!r} is registered already")
    _REGISTRY[name] = PolicyEntry(factory, description or _doc_line(factory), params, external=True)


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def core_policy_names() -> list[str]:
    """The policies the core ships (what a user's config may name), without those registered from outside."""
    return sorted(n for n, e in _REGISTRY.items() if not e.external)


def describe_policies() -> dict[str, str]:
    return {n: _REGISTRY[n].description for n in sorted(_REGISTRY)}


def policy_factory(name: str) -> PolicyFactory:
    """The factory registered under `name`; unknown names raise KeyError listing the known ones."""
    try:
        return _REGISTRY[name].factory
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def takes_param(name: str, param: str) -> bool:
    """Whether policy `name` takes keyword `param`: a field of its parameter dataclass, or for a policy
    registered from outside, a keyword its factory accepts (named, or through **params)."""
    policy_factory(name)  # unknown names raise KeyError listing the known ones
    entry = _REGISTRY[name]
    if not entry.open_params:
        return param in entry.param_names()
    try:
        sig = inspect.signature(entry.factory)
    except (TypeError, ValueError):
        return False
    return param in sig.parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def get_policy(name: str = DEFAULT_POLICY, **params: object) -> Policy:
    """A fresh policy instance; unknown names raise KeyError listing the known ones, and a parameter the policy
    does not take raises TypeError naming the ones it does."""
    factory = policy_factory(name)
    entry = _REGISTRY[name]
    if not entry.open_params:
        unknown = sorted(set(params) - entry.param_names())
        if unknown:
            known = ", ".join(sorted(entry.param_names())) or "none"
            raise TypeError(f"policy {name!r} takes no parameter {', '.join(unknown)} (its parameters: {known})")
    return factory(**params)
