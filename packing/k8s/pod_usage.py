"""The Node annotation `vramfit.io/pod-usage`: what the node agent measured each pod using, read and written.

The node agent samples NVML per process, maps each process to its pod and container, and publishes one report
per node (docs/usage.md). Shape (one entry per pod, container and GPU unit; a process it could not map is listed
under `unmapped`, never dropped):

    {"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5,
     "pods": [{"namespace", "pod", "uid", "container", "gpu_uuid", "unit", "used_bytes", "peak_bytes",
               "booked_bytes", "over"}],
     "unmapped": [{"pid", "gpu_uuid", "used_bytes", "why"}],
     "truncated": false}

`unit` is `gpu`, `mps`, `timeslice` or `mig:<profile>@<start>`. `used_bytes` and `peak_bytes` are null where
NVML gives no per-process figure (it reports "not available" for some processes, e.g. under MPS on some drivers):
unknown, never 0. `booked_bytes` is null for a pod vramfit did not book (a process of a pod holding a GPU
through another resource). The whole annotation is capped at `MAX_ANNOTATION_BYTES`; past it, the pods with
the most entries are left out first and `truncated` is true.

Pure: JSON in, types out, and back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from packing.model import InputError

ANN_POD_USAGE = "vramfit.io/pod-usage"
MAX_ANNOTATION_BYTES = 256 * 1024
UNIT_WORDS = ("gpu", "mps", "timeslice")
MIG_UNIT_PREFIX = "mig:"

_REPORT_KEYS = ("sampled_at", "period_s", "pods", "unmapped", "truncated")
_POD_KEYS = ("namespace", "pod", "uid", "container", "gpu_uuid", "unit", "used_bytes", "peak_bytes",
             "booked_bytes", "over")
_UNMAPPED_KEYS = ("pid", "gpu_uuid", "used_bytes", "why")


@dataclass(frozen=True)
class PodUsage:
    """One container's use of one GPU unit."""

    namespace: str
    pod: str
    uid: str
    container: str
    gpu_uuid: str
    unit: str  # gpu | mps | timeslice | mig:<profile>@<start>
    used_bytes: int | None  # None: NVML gave no per-process figure
    peak_bytes: int | None  # the most seen since the pod started
    booked_bytes: int | None  # what vramfit booked; None for a pod it did not place
    over: bool  # used above booked

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class UnmappedProcess:
    """A process on a GPU that no pod's cgroup claims (a host process, a pod that just left, a runtime we
    cannot parse): counted, so a GPU's processes always add up."""

    pid: int
    gpu_uuid: str
    used_bytes: int | None
    why: str


@dataclass(frozen=True)
class NodeUsageReport:
    sampled_at: str  # RFC 3339, UTC
    period_s: float
    pods: tuple[PodUsage, ...] = ()
    unmapped: tuple[UnmappedProcess, ...] = ()
    truncated: bool = False

    def for_pod(self, namespace: str, pod: str) -> tuple[PodUsage, ...]:
        return tuple(u for u in self.pods if u.namespace == namespace and u.pod == pod)


# ---- reading -------------------------------------------------------------------------------------------------


def read_pod_usage(node_obj: dict[str, Any]) -> NodeUsageReport | None:
    """The report on a Kubernetes Node object, or None when the node carries none."""
    if not isinstance(node_obj, dict):
        raise InputError("node", "(object)", f"must be a mapping, got {type(node_obj).__name__}")
    meta = node_obj.get("metadata")
    if not isinstance(meta, dict):
        raise InputError("node", "metadata", "missing or not a mapping")
    name = meta.get("name")
    where = f"node {name}" if isinstance(name, str) and name else "node"
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise InputError(where, "metadata.annotations", "must be a mapping")
    text = annotations.get(ANN_POD_USAGE)
    if text is None:
        return None
    return parse_pod_usage(text, where)


def node_usage_reports(objects: Iterable[Any], bad: Callable[[InputError], None]
                       ) -> Iterator[tuple[str, NodeUsageReport]]:
    """(node name, its report) for each Node among `objects` that carries one. A report that cannot be read, or
    one on a Node without a name, is handed to `bad` (which may raise) and left out."""
    for obj in objects:
        if not isinstance(obj, dict) or obj.get("kind") != "Node":
            continue
        try:
            report = read_pod_usage(obj)
            if report is None:
                continue
            name = obj["metadata"].get("name")
            if not isinstance(name, str) or not name:
                raise InputError("node", "metadata.name", "missing: the report's node cannot be named")
        except InputError as err:
            bad(err)
            continue
        yield name, report


def parse_pod_usage(text: Any, where: str) -> NodeUsageReport:
    """The annotation's text -> a report; every bad value names `where` and the field."""
    base = f"metadata.annotations[{ANN_POD_USAGE}]"
    if not isinstance(text, str):
        raise InputError(where, base, f"must be a string, got {type(text).__name__}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, base, f"not valid JSON: {exc.msg} at position {exc.pos}") from exc
    _check_object(data, _REPORT_KEYS, where, base)
    sampled_at = _rfc3339(data.get("sampled_at"), where, f"{base}.sampled_at")
    period = data.get("period_s")
    if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
        raise InputError(where, f"{base}.period_s", f"must be a positive number of seconds, got {period!r}")
    truncated = data.get("truncated", False)
    if not isinstance(truncated, bool):
        raise InputError(where, f"{base}.truncated", f"must be true or false, got {truncated!r}")
    pods = tuple(_pod(item, where, f"{base}.pods[{i}]") for i, item in enumerate(_list(data, "pods", where, base)))
    unmapped = tuple(_unmapped(item, where, f"{base}.unmapped[{i}]")
                     for i, item in enumerate(_list(data, "unmapped", where, base)))
    return NodeUsageReport(sampled_at=sampled_at, period_s=float(period), pods=pods, unmapped=unmapped,
                           truncated=truncated)


def _check_object(item: Any, known: tuple[str, ...], where: str, f: str) -> None:
    if not isinstance(item, dict):
        raise InputError(where, f, f"must be a JSON object, got {type(item).__name__}")
    for k in item:
        if k not in known:
            raise InputError(where, f"{f}.{k}", f"unknown field (known: {', '.join(known)})")


def _list(data: dict[str, Any], key: str, where: str, base: str) -> list[Any]:
    v = data.get(key, [])
    if not isinstance(v, list):
        raise InputError(where, f"{base}.{key}", f"must be a JSON list, got {type(v).__name__}")
    return v


def _rfc3339(v: Any, where: str, f: str) -> str:
    if not isinstance(v, str):
        raise InputError(where, f, f"must be an RFC 3339 time string, got {v!r}")
    try:
        when = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(where, f, f"not an RFC 3339 time: {v!r}") from exc
    if when.tzinfo is None:
        raise InputError(where, f, f"needs a time zone (UTC: ...Z), got {v!r}")
    return v


def _str(item: dict[str, Any], key: str, where: str, f: str, *, empty: bool = False) -> str:
    v = item.get(key)
    if not isinstance(v, str) or (not v and not empty):
        raise InputError(where, f"{f}.{key}", f"must be a non-empty string, got {v!r}")
    return v


def _bytes(item: dict[str, Any], key: str, where: str, f: str) -> int | None:
    v = item.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(where, f"{f}.{key}", f"must be a non-negative integer (bytes) or null, got {v!r}")
    return v


def unit_problem(unit: Any) -> str | None:
    """Why `unit` is not a unit word of the report, or None."""
    if isinstance(unit, str) and (unit in UNIT_WORDS or (unit.startswith(MIG_UNIT_PREFIX) and "@" in unit)):
        return None
    return f"must be one of {', '.join(UNIT_WORDS)} or {MIG_UNIT_PREFIX}<profile>@<start>, got {unit!r}"


def _pod(item: Any, where: str, f: str) -> PodUsage:
    _check_object(item, _POD_KEYS, where, f)
    unit = item.get("unit")
    if (problem := unit_problem(unit)) is not None:
        raise InputError(where, f"{f}.unit", problem)
    over = item.get("over", False)
    if not isinstance(over, bool):
        raise InputError(where, f"{f}.over", f"must be true or false, got {over!r}")
    return PodUsage(namespace=_str(item, "namespace", where, f), pod=_str(item, "pod", where, f),
                    uid=_str(item, "uid", where, f, empty=True), container=_str(item, "container", where, f),
                    gpu_uuid=_str(item, "gpu_uuid", where, f), unit=unit,
                    used_bytes=_bytes(item, "used_bytes", where, f), peak_bytes=_bytes(item, "peak_bytes", where, f),
                    booked_bytes=_bytes(item, "booked_bytes", where, f), over=over)


def _unmapped(item: Any, where: str, f: str) -> UnmappedProcess:
    _check_object(item, _UNMAPPED_KEYS, where, f)
    pid = item.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise InputError(where, f"{f}.pid", f"must be a non-negative integer, got {pid!r}")
    return UnmappedProcess(pid=pid, gpu_uuid=_str(item, "gpu_uuid", where, f),
                           used_bytes=_bytes(item, "used_bytes", where, f), why=_str(item, "why", where, f))


# ---- writing -------------------------------------------------------------------------------------------------


def _pod_json(u: PodUsage) -> dict[str, Any]:
    return {"namespace": u.namespace, "pod": u.pod, "uid": u.uid, "container": u.container, "gpu_uuid": u.gpu_uuid,
            "unit": u.unit, "used_bytes": u.used_bytes, "peak_bytes": u.peak_bytes, "booked_bytes": u.booked_bytes,
            "over": u.over}


def _unmapped_json(p: UnmappedProcess) -> dict[str, Any]:
    return {"pid": p.pid, "gpu_uuid": p.gpu_uuid, "used_bytes": p.used_bytes, "why": p.why}


def _dump(report: NodeUsageReport, pods: list[PodUsage], unmapped: list[UnmappedProcess], truncated: bool) -> str:
    body = {"sampled_at": report.sampled_at, "period_s": report.period_s, "pods": [_pod_json(u) for u in pods],
            "unmapped": [_unmapped_json(p) for p in unmapped], "truncated": truncated}
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()) + 1  # + its comma


def usage_annotation(report: NodeUsageReport, cap: int = MAX_ANNOTATION_BYTES) -> str:
    """The annotation's text, at most `cap` bytes (UTF-8). Over it, whole pods leave, those with the most
    entries first (ties: by namespace/name, so the same report always gives the same text), then unmapped
    processes, smallest use first; what is left says `truncated: true`."""
    pods = list(report.pods)
    unmapped = list(report.unmapped)
    text = _dump(report, pods, unmapped, report.truncated)
    size = len(text.encode())
    if size <= cap:
        return text
    size += len("true") - len(str(report.truncated).lower())
    per_pod: dict[str, int] = {}
    counts: dict[str, int] = {}
    for u in pods:
        per_pod[u.key] = per_pod.get(u.key, 0) + _size(_pod_json(u))
        counts[u.key] = counts.get(u.key, 0) + 1
    target = cap - 2  # an emptied list loses one comma fewer than counted
    dropped: set[str] = set()
    for key in sorted(counts, key=lambda k: (-counts[k], k)):
        if size <= target:
            break
        dropped.add(key)
        size -= per_pod[key]
    pods = [u for u in pods if u.key not in dropped]
    unmapped.sort(key=lambda p: (p.used_bytes or 0, p.pid), reverse=True)
    while size > target and unmapped:
        size -= _size(_unmapped_json(unmapped.pop()))
    return _dump(report, pods, unmapped, True)
