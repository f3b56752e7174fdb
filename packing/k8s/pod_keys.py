"""The `vramfit.io/` keys a pod may carry, and the request/limit rule for vramfit's extended resources.

A misspelt key is worse than a wrong value: `vramfit.io/isolaton: hardware` is not an error anywhere in
Kubernetes, the pod simply gets the default isolation. So every `vramfit.io/` annotation, label and resource
name on a pod vramfit places must be one it reads, and a near miss is named. The webhook, the extender and
the what-if all read pods through `pod_demand`, which applies these checks, so one rule answers everywhere.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from packing.k8s.quantity import parse_quantity
from packing.model import InputError

PREFIX = "vramfit.io/"
POD_ANNOTATIONS = frozenset({
    "vramfit.io/vram", "vramfit.io/gpus", "vramfit.io/isolation", "vramfit.io/gpu-models",
    "vramfit.io/gpu-per-process",
    # vramfit's own records, written by its Binding (admission keeps pod authors from writing them)
    "vramfit.io/assignment", "vramfit.io/phase", "vramfit.io/bound-at", "vramfit.io/assignment-signature",
})
POD_LABELS = frozenset({"vramfit.io/tenant", "vramfit.io/webhook"})
RESOURCES = frozenset({"vramfit.io/vram", "vramfit.io/gpu"})
# The most containers (init and app) of one pod that may ask for `vramfit.io/gpu`: each takes its own device
# tickets on the node, and the node agent advertises this many per place (nodeagent.devices).
MAX_GPU_CONTAINERS = 8
# Every vramfit key, whatever its place: a known key in the wrong place is pointed at its place.
_ALL = POD_ANNOTATIONS | POD_LABELS | RESOURCES


def _unknown(key: str, known: frozenset[str], place: str) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; vramfit reads {', '.join(sorted(known))} here"
    if key in _ALL:
        return f"{key!r} is a vramfit key, but not read as {place}{hint}"
    return f"unknown vramfit key {key!r}{hint}"


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """`(spec.<section>[<i>], container)` for every container object, init containers first; any shape."""
    for section in ("initContainers", "containers"):
        items = spec.get(section)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if isinstance(c, dict):
                yield f"spec.{section}[{i}]", c


def resource_maps(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The container's `(requests, limits)`, each {} when missing or not an object."""
    resources = container.get("resources")
    resources = resources if isinstance(resources, dict) else {}
    requests, limits = resources.get("requests"), resources.get("limits")
    return (requests if isinstance(requests, dict) else {}), (limits if isinstance(limits, dict) else {})


def check_pod_keys(meta: Mapping[str, Any], spec: Mapping[str, Any], who: str) -> None:
    """InputError for the first `vramfit.io/` annotation, label or resource name vramfit does not read."""
    for part, known, place in (("annotations", POD_ANNOTATIONS, "an annotation"), ("labels", POD_LABELS, "a label")):
        values = meta.get(part)
        for key in sorted(values) if isinstance(values, dict) else ():
            if isinstance(key, str) and key.startswith(PREFIX) and key not in known:
                raise InputError(who, f"metadata.{part}[{key}]", _unknown(key, known, place))
    for where, c in containers(spec):
        for section, values in zip(("requests", "limits"), resource_maps(c), strict=True):
            for key in sorted(values):
                if isinstance(key, str) and key.startswith(PREFIX) and key not in RESOURCES:
                    raise InputError(who, f"{where}.resources.{section}[{key}]",
                                     _unknown(key, RESOURCES, "a resource"))


def _same_quantity(a: Any, b: Any) -> bool:
    # The API server compares quantities, not spellings: 14Gi equals 14336Mi.
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return str(a).strip() == str(b).strip()


def check_extended_resources(spec: Mapping[str, Any], who: str) -> None:
    """vramfit's resources are extended resources: the API server refuses a request without a limit, or one
    that differs from its limit, with a message that never names vramfit. Say it first, and say why."""
    for where, c in containers(spec):
        requests, limits = resource_maps(c)
        for key in sorted(RESOURCES):
            if key in requests and key not in limits:
                raise InputError(who, f"{where}.resources.limits[{key}]",
                                 f"missing: {key} is an extended resource, which Kubernetes accepts only in "
                                 f"limits (requests may repeat the same value); move "
                                 f"{requests[key]!r} to limits")
            if key in requests and not _same_quantity(requests[key], limits[key]):
                raise InputError(who, f"{where}.resources.requests[{key}]",
                                 f"{requests[key]!r} differs from the limit {limits[key]!r}: Kubernetes requires "
                                 f"an extended resource's request to equal its limit")


# The environment HAMi-core reads its limits from (github.com/Project-HAMi/HAMi-core, README): the node agent
# sets it from the pod's booking on a time-slice unit (nodeagent/allocate.py), and a container's own value for
# the same name would win over it. `CUDA_DEVICE_MEMORY_LIMIT` also covers its per-device `_<n>` forms.
LIMIT_ENV_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT",)
# HAMi-core's limits; MPS's pinned limit; the devices the container runtime exposes (a pod naming them itself
# could reach GPUs it was not given).
LIMIT_ENV = frozenset({"CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_DEVICE_SM_LIMIT", "CUDA_DISABLE_CONTROL",
                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "NVIDIA_VISIBLE_DEVICES"})


def is_limit_env(name: str) -> bool:
    """Whether a container env name is one of the GPU limits vramfit's node agent hands over."""
    return name in LIMIT_ENV or name.startswith(LIMIT_ENV_PREFIXES)


def check_limit_env(spec: Mapping[str, Any], who: str) -> None:
    """InputError naming the container and the variable for the first container (init or app) whose `env` sets
    a limit the node agent hands over: the pod would escape the VRAM it was booked. (`envFrom` is not visible
    at admission: its ConfigMaps and Secrets are read when the container starts.)"""
    for where, c in containers(spec):
        env = c.get("env")
        for j, var in enumerate(env if isinstance(env, list) else []):
            name = var.get("name") if isinstance(var, dict) else None
            if isinstance(name, str) and is_limit_env(name):
                raise InputError(who, f"{where}.env[{j}]",
                                 f"container {c.get('name')!r} sets {name}, a GPU limit the node agent sets from "
                                 "the pod's booking (HAMi-core on time-slice GPUs); a pod's own value would "
                                 "override it: remove it")
