"""A pod above its booking on a shared GPU: told at once, evicted only when the operator asks and it stays above.

Each sample's report marks entries `over` (a pod's known use on an MPS or time-slice unit above what vramfit
booked it there; nodeagent/usage.py). Per pod and unit:

- the first sample that finds it over gives one Warning Event (`VramfitOverBooking`) and counts
  `vramfit_overuse_events_total`; the `vramfit_pod_vram_over_booking` gauge is 1 while it lasts;
- with `over_use: evict`, a **time-slice** pod over in every sample for `over_use_grace_s` is evicted through
  the Eviction API (policy/v1 Eviction with the pod's UID as precondition, so a PodDisruptionBudget holds and a
  re-created pod of the same name is never hit). A 429 means a PDB forbids it now: it is tried again on the next
  sample, and said so in the log. An MPS pod is not evicted: its pinned memory limit already stops it at the
  booking, so being over there means the limit is not in force (logged), not that a neighbour is at risk;
- a sample that finds it within its booking (or cannot tell: unknown use) ends the episode and the clock.

`OverUseWatch.step` is pure (reports and a clock in, actions out); `KubeEvictor` is the one API call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from packing.k8s.pod_usage import NodeUsageReport, PodUsage

log = logging.getLogger("vramfit.node.overuse")

EvictResult = Literal["evicted", "blocked", "gone", "failed"]
REASON = "VramfitOverBooking"
EVICTABLE_UNITS = ("timeslice",)


@dataclass(frozen=True)
class OverUse:
    namespace: str
    pod: str
    uid: str
    gpu_uuid: str
    unit: str
    used_bytes: int
    booked_bytes: int

    def message(self) -> str:
        gib = 1024 ** 3
        return (f"uses {self.used_bytes / gib:.2f} GiB of VRAM on {self.unit} unit of GPU {self.gpu_uuid}, above "
                f"the {self.booked_bytes / gib:.2f} GiB vramfit booked for it; its neighbours on the GPU may run "
                "out of memory (docs/usage.md)")


@dataclass(frozen=True)
class Actions:
    warn: tuple[OverUse, ...] = ()
    evict: tuple[OverUse, ...] = ()


def over_pods(report: NodeUsageReport) -> dict[tuple[str, str], OverUse]:
    """(pod UID, GPU UUID + unit) -> the pod's over-use there, summed over its containers."""
    grouped: dict[tuple[str, str], list[PodUsage]] = {}
    for u in report.pods:
        if u.over:
            grouped.setdefault((u.uid, f"{u.gpu_uuid}|{u.unit}"), []).append(u)
    out: dict[tuple[str, str], OverUse] = {}
    for key, us in grouped.items():
        first = us[0]
        out[key] = OverUse(first.namespace, first.pod, first.uid, first.gpu_uuid, first.unit,
                           sum(u.used_bytes or 0 for u in us), max(u.booked_bytes or 0 for u in us))
    return out


@dataclass
class OverUseWatch:
    policy: Literal["report", "evict"] = "report"
    grace_s: float = 60.0
    since: dict[tuple[str, str], float] = field(default_factory=dict)  # over without a break since
    evicted: set[str] = field(default_factory=set)  # pod UIDs evicted (not asked again)

    def step(self, report: NodeUsageReport, now: float) -> Actions:
        over = over_pods(report)
        warn = [o for k, o in over.items() if k not in self.since]
        self.since = {k: self.since.get(k, now) for k in over}
        evict: dict[str, OverUse] = {}
        if self.policy == "evict":
            for k, o in over.items():
                if (o.unit in EVICTABLE_UNITS and o.used_bytes > o.booked_bytes and o.uid not in self.evicted
                        and now - self.since[k] >= self.grace_s):
                    evict.setdefault(o.uid, o)
        return Actions(warn=tuple(warn), evict=tuple(evict.values()))

    def done(self, uid: str) -> None:
        self.evicted.add(uid)


class Evictor(Protocol):
    def evict(self, namespace: str, pod: str, uid: str) -> EvictResult: ...


def eviction_body(namespace: str, pod: str, uid: str) -> dict[str, Any]:
    """A policy/v1 Eviction; the UID precondition keeps it off a re-created pod of the same name."""
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}}}


class KubeEvictor:
    def __init__(self, api: kclient.ApiClient, timeout_s: float = 10.0) -> None:
        self.core = kclient.CoreV1Api(api)
        self.timeout_s = timeout_s

    def evict(self, namespace: str, pod: str, uid: str) -> EvictResult:
        try:
            body: Any = eviction_body(namespace, pod, uid)  # the client sends a dict as it is
            resp: Any = self.core.create_namespaced_pod_eviction(pod, namespace, body,
                                                                 _request_timeout=self.timeout_s,
                                                                 _preload_content=False)
            resp.read()
            resp.release_conn()
        except ApiException as err:
            if err.status == 429:
                return "blocked"  # a PodDisruptionBudget allows no disruption now
            if err.status in (404, 409):
                return "gone"  # deleted already, or a new pod under the name (UID precondition)
            log.warning("evicting %s/%s failed: %s %s", namespace, pod, err.status, err.reason)
            return "failed"
        return "evicted"


class LogEvictor:
    """Dry run: evicts nothing, keeps what it would have."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    def evict(self, namespace: str, pod: str, uid: str) -> EvictResult:
        self.asked.append((namespace, pod, uid))
        log.info("dry run: would evict %s/%s (over its VRAM booking)", namespace, pod)
        return "evicted"


def act(actions: Actions, watch: OverUseWatch, evictor: Evictor | None, warn: Any, counted: Any) -> list[str]:
    """Carry the actions out: `warn(over)` posts the Event, `counted(kind)` counts; returns log lines for
    evictions a PDB blocked (tried again next sample)."""
    blocked: list[str] = []
    for o in actions.warn:
        warn(o)
        counted("event")
    for o in _evictable(actions.evict, evictor):
        assert evictor is not None
        result = evictor.evict(o.namespace, o.pod, o.uid)
        if result in ("evicted", "gone"):
            watch.done(o.uid)
            if result == "evicted":
                counted("eviction")
        elif result == "blocked":
            blocked.append(f"{o.namespace}/{o.pod}: a PodDisruptionBudget blocks the eviction; trying again")
    return blocked


def _evictable(evict: Iterable[OverUse], evictor: Evictor | None) -> list[OverUse]:
    return list(evict) if evictor is not None else []
