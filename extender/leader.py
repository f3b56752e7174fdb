"""Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's leaderelection does it.

Every replica watches the cluster (a warm cache); only the holder of the Lease answers verbs and binds.

    acquire: GET the Lease (create it if absent); it is free when it has no holder, or when its record has not
             changed for leaseDuration as *observed on our own clock* (no clock-skew dependence), then PUT it
             with our identity under the read resourceVersion — a racing replica gets 409 and stays standby.
    renew:   every retryPeriod, PUT renewTime; if no renewal succeeded for renewDeadline, step down.
             A standby also tries once the observed record expires, so takeover does not wait a retry period.
    fence:   a bind needs a renewal younger than renewDeadline (< leaseDuration), and its API call times out
             within leaseDuration - renewDeadline, so it lands before any other replica can take the Lease.
    term:    each acquisition starts a new term; the term is ready only after a fresh LIST of nodes and pods
             (the old leader's last Bindings are in it), so a new leader never answers from a stale view.
             A failing re-list is retried with backoff; past a deadline the leader releases the Lease, so the
             standby takes over, and fails /healthz until its lists work again (LeadershipTerm).

Defaults, 4 s / 2 s / 0.5 s (kube-scheduler's are 15/10/2). A crashed leader's pods wait about leaseDuration:
the standby takes over when the last renewal it saw is leaseDuration old on its clock, and it wakes for that
moment instead of waiting for its next retry, so failover is about leaseDuration + the term's re-list (4.2 s
mean, 4.7 s max to ready over 10 kills, benchmarks/results/failover.md; the target is <= 5 s). leaseDuration is whole seconds on the wire
(leaseDurationSeconds), 4 the largest that meets the target. renewDeadline 2 s leaves a fenced write
leaseDuration - renewDeadline = 2 s to land, the budget the binder had before. A retry period of 0.5 s gives the
leader 3 renewal attempts inside the renew deadline, so one slow or failed Lease call does not cost the term
(etcd's own leader elections take about 1 s). The API server's cost: the leader GETs and PUTs one ~400-byte
Lease, a standby GETs it, each ~2x a second: ~6 small requests/s for two replicas, against the 500 Lease
PUTs/s the kubelets of a 5,000-node cluster send (one per node every 10 s).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("vramfit.leader")

JSON_HEADERS = {"Content-Type": "application/json"}


def _done(resp: Any) -> None:
    # Read the body before the connection goes back to the pool: unread bytes would be taken as the next
    # request's status line on that connection (a Binding among them), and that write would look failed.
    resp.read()
    resp.release_conn()


def default_identity() -> str:
    """POD_NAME (downward API), else the hostname plus a random suffix: two replicas never share one."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{socket.gethostname()}_{random.getrandbits(48):012x}"


def micro_time(at: datetime) -> str:
    """metav1.MicroTime as the API server writes it."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str = "vramfit-extender"
    identity: str = ""
    # Why these defaults: the module docstring. The CLI's --lease-duration etc. default to these.
    lease_duration_s: float = 4.0
    renew_deadline_s: float = 2.0
    retry_period_s: float = 0.5

    def __post_init__(self) -> None:
        # client-go's rules: leaseDuration > renewDeadline > retryPeriod * jitter (1.2).
        if not self.wire_duration_s > self.renew_deadline_s > self.retry_period_s * 1.2 > 0:
            raise ValueError("leader election needs lease duration > renew deadline > 1.2 x retry period > 0, "
                             f"got {self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s}")

    @property
    def write_budget_s(self) -> float:
        """How long a fenced write may take and still land inside the term (the duration others go by)."""
        return self.wire_duration_s - self.renew_deadline_s

    @property
    def wire_duration_s(self) -> int:
        """leaseDurationSeconds as written: whole seconds, the duration the standby waits out."""
        return max(1, round(self.lease_duration_s))


class LeaderElector:
    def __init__(self, api: kclient.ApiClient, config: LeaseConfig, *,
                 on_started: Callable[[int], None] | None = None, on_stopped: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = kclient.CoordinationV1Api(api)
        self.config = config
        self.identity = config.identity or default_identity()
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.wall = wall
        self.term = 0
        self.transitions = 0  # terms this replica won (metrics)
        self._leading = False
        self._last_renew = float("-inf")
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = float("-inf")
        self._observed_duration = config.lease_duration_s
        self._lock = threading.Lock()
        # One election step at a time: a step-down (from the term's thread) never interleaves with a renewal.
        self._op_lock = threading.RLock()
        # False: do not try to take the Lease (a replica whose view cannot be refreshed must not lead).
        self.may_lead: Callable[[], bool] = lambda: True
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what others ask ------------------------------------------------------------------------------
    def leading(self) -> bool:
        with self._lock:
            return self._leading

    def fresh(self) -> bool:
        """Leader, and sure of it: the last renewal is younger than the renew deadline (the write fence)."""
        with self._lock:
            return self._leading and self.clock() - self._last_renew < self.config.renew_deadline_s

    def renewal_age(self) -> float:
        with self._lock:
            return self.clock() - self._last_renew

    def holder(self) -> str:
        """The Lease's holder as last read ("" when free or not read yet)."""
        observed = self._observed
        return str(observed[0] or "") if observed else ""

    def lease_name(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    # -- one attempt ------------------------------------------------------------------------------------
    def _call_timeout(self) -> float:
        # A leader's Lease calls may use what is left of its renew deadline, as client-go's renew context does
        # (a slow API server costs the term only when renewals really stall); a standby's wait a retry period.
        if not self.leading():
            return self.config.retry_period_s
        return max(self.config.retry_period_s, self.config.renew_deadline_s - self.renewal_age())

    def _read(self) -> dict[str, Any] | None:
        try:
            resp: Any = self.api.read_namespaced_lease(self.config.name, self.config.namespace,
                                                       _preload_content=False, _request_timeout=self._call_timeout())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def _spec(self, old: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        spec = dict(old or {})
        taking_over = spec.get("holderIdentity") != self.identity
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.config.wire_duration_s
        spec["renewTime"] = micro_time(now)
        if taking_over or "acquireTime" not in spec:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One client-go `tryAcquireOrRenew`; True when we hold the Lease now."""
        now = self.wall()
        try:
            lease = self._read()
            if lease is None:
                body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                        "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                                        "spec": self._spec(None, now)}
                _done(self.api.create_namespaced_lease(self.config.namespace, body,  # type: ignore[arg-type]
                                                       _preload_content=False, _headers=JSON_HEADERS,
                                                       _request_timeout=self._call_timeout()))
                self._renewed(body["spec"])
                return True
            spec = lease.get("spec") or {}
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            holder = spec.get("holderIdentity")
            duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration_s)
            self._observed_duration = duration
            if holder and holder != self.identity and self._observed_at + duration > self.clock():
                return False  # held by another replica, not expired on our clock
            lease["spec"] = self._spec(spec, now)
            _done(self.api.replace_namespaced_lease(self.config.name, self.config.namespace, lease,  # type: ignore[arg-type]
                                                    _preload_content=False, _headers=JSON_HEADERS,
                                                    _request_timeout=self._call_timeout()))
            self._renewed(lease["spec"])
            return True
        except ApiException as exc:
            if exc.status != 409:
                log.warning("lease %s/%s: HTTP %s", self.config.namespace, self.config.name, exc.status)
            return False
        except Exception as exc:  # noqa: BLE001 - the API may be unreachable: not leading is the safe answer
            log.warning("lease %s/%s: %s: %s", self.config.namespace, self.config.name, type(exc).__name__, exc)
            return False

    def _renewed(self, spec: dict[str, Any]) -> None:
        with self._lock:
            self._last_renew = self.clock()
        self._observed = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        self._observed_at = self.clock()

    # -- the loop ---------------------------------------------------------------------------------------
    def _step(self) -> None:
        with self._op_lock:
            if not self.leading() and not self.may_lead():
                return
            self._step_locked()

    def _step_locked(self) -> None:
        ok = self.try_acquire_or_renew()
        if ok and not self.leading():
            with self._lock:
                self._leading = True
                self.term += 1
                term = self.term
            self.transitions += 1
            log.info("%s became the leader (term %d)", self.identity, term)
            if self.on_started is not None:
                self.on_started(term)
        elif not ok and self.leading() and not self.fresh():
            self._step_down("could not renew the lease within the renew deadline")

    def _step_down(self, why: str) -> None:
        with self._lock:
            self._leading = False
        log.warning("%s stopped leading: %s", self.identity, why)
        if self.on_stopped is not None:
            self.on_stopped()

    def step_down(self, why: str) -> None:
        """Stop leading now and hand the Lease back, so a standby takes over without waiting for it to expire."""
        with self._op_lock:
            if self.leading():
                self._step_down(why)
                self._release()

    def _next_wait(self) -> float:
        # Jittered like client-go's wait.JitterUntil (factor 1.2), so replicas do not retry in step.
        wait = self.config.retry_period_s * (1.0 + 0.2 * random.random())
        if self.leading() or not self.holder() or self._observed_at == float("-inf"):
            return wait
        # A standby tries again the moment the holder's record expires on its clock, not up to a retry later:
        # at most one extra GET per expiry, and the mean failover is about the lease duration.
        expires_in = self._observed_at + self._observed_duration - self.clock()
        return min(wait, max(0.0, expires_in) + 0.01)

    def run(self) -> None:
        while not self.stop_event.is_set():
            self._step()
            self.stop_event.wait(self._next_wait())

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        """Stop; with `release`, hand the Lease back (client-go's ReleaseOnCancel) so a standby takes over now."""
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.retry_period_s * 2 + 1)
        if self.leading():
            self._step_down("stopping")
            if release:
                self._release()

    def _release(self) -> None:
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease["spec"], holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self.wall()))
            lease["spec"] = spec
            _done(self.api.replace_namespaced_lease(self.config.name, self.config.namespace, lease,  # type: ignore[arg-type]
                                                    _preload_content=False, _headers=JSON_HEADERS,
                                                    _request_timeout=self._call_timeout()))
        except Exception as exc:  # noqa: BLE001 - best effort: the lease expires on its own otherwise
            log.info("releasing the lease failed: %s", exc)


class TermSource(Protocol):
    """What a term needs of the cache (implemented by `extender.kube.KubeSource`)."""

    def resync(self, timeout_s: float = 30.0, *, retry_cap_s: float | None = None,
               still_wanted: Callable[[], bool] = ...) -> list[str]: ...

    def list_counts(self) -> dict[str, int]: ...

    def wait_listed(self, before: dict[str, int], timeout_s: float,
                    still_wanted: Callable[[], bool] = ...) -> list[str]: ...

    def failures(self) -> list[str]: ...

    def relisting(self) -> list[str]: ...


@dataclass(frozen=True)
class SteppedDown:
    """A term whose re-list did not finish by the deadline: when, and what was missing."""

    term: int
    at: datetime
    kinds: tuple[str, ...]
    failures: tuple[str, ...]


# A failed term re-list is retried at least this often (the reflector's backoff, capped): recovery comes within
# ~4 s of the API server answering again, at one LIST per kind per 4 s from one replica while it fails.
TERM_RETRY_CAP_S = 4.0


class LeadershipTerm:
    """Readiness that belongs to the term: leader, fresh, and the cache re-listed since this term began.

    The re-list is retried (the reflectors' backoff, capped at TERM_RETRY_CAP_S) until `relist_deadline_s`. Then
    the leader steps down and releases the Lease, rather than keep a Lease it cannot serve under: with a
    working standby, scheduling resumes within a retry period. It does not contend for the Lease again until its
    lists succeed, and until then /healthz fails (`unhealthy`): lists that keep failing in one process while the
    other replica's work are a wedged process (a dead connection pool, a stuck thread), and a kubelet restart is
    the cure, after the liveness probe's failure threshold. A replica that never led, or whose lists work, stays
    live: an API server failing everyone's lists would otherwise restart both replicas in a loop.
    """

    def __init__(self, elector: LeaderElector, source: TermSource, *, relist_deadline_s: float = 20.0,
                 retry_cap_s: float = TERM_RETRY_CAP_S) -> None:
        self.elector = elector
        self.source = source
        self.relist_deadline_s = relist_deadline_s
        self.retry_cap_s = retry_cap_s
        self._ready_term = 0
        self._term_began = float("-inf")  # monotonic start of the current term
        self._stepped_down: SteppedDown | None = None
        self._lock = threading.Lock()
        elector.on_started = self._started
        elector.on_stopped = self._stopped
        elector.may_lead = self.may_lead

    def _current(self, term: int) -> bool:
        return self.elector.term == term and self.elector.leading()

    def _started(self, term: int) -> None:
        with self._lock:
            self._term_began = time.monotonic()
        threading.Thread(target=self._sync, args=(term,), name=f"term-{term}-resync", daemon=True).start()

    def _sync(self, term: int) -> None:
        before = self.source.list_counts()
        behind = self.source.resync(self.relist_deadline_s, retry_cap_s=self.retry_cap_s,
                                    still_wanted=lambda: self._current(term))
        if not self._current(term):
            return  # the term ended on its own (renewal failed, or stopping)
        if not behind:
            with self._lock:
                self._ready_term = term
            log.info("term %d: cache re-listed, serving", term)
            return
        failures = tuple(self.source.failures())
        with self._lock:
            self._stepped_down = SteppedDown(term, datetime.now(UTC), tuple(behind), failures)
        why = (f"term {term}: {', '.join(behind)} not re-listed within {self.relist_deadline_s:g}s "
               f"({'; '.join(failures) or 'no answer'}); releasing the Lease")
        log.error("%s", why)
        self.elector.step_down(why)
        # Contend again (and be live again) once the lists this term missed have succeeded.
        self.source.wait_listed(before, float("inf"), still_wanted=lambda: not self.elector.stop_event.is_set())
        with self._lock:
            self._stepped_down = None
        log.info("the lists work again: contending for the Lease")

    def _stopped(self) -> None:
        with self._lock:
            self._ready_term = 0

    def may_lead(self) -> bool:
        with self._lock:
            return self._stepped_down is None

    def ready(self) -> bool:
        with self._lock:
            ready_term = self._ready_term
        return ready_term != 0 and ready_term == self.elector.term and self.elector.fresh()

    # -- what the probes say ------------------------------------------------------------------------------
    def unhealthy(self) -> str | None:
        """Why /healthz fails (None: it does not): this replica stepped down and its lists still fail."""
        with self._lock:
            down = self._stepped_down
        if down is None:
            return None
        return (f"stepped down from term {down.term} at {down.at.strftime('%H:%M:%S')}Z: "
                f"{', '.join(down.kinds)} not re-listed within {self.relist_deadline_s:g}s; "
                f"{'; '.join(self.source.failures()) or 'lists not answered yet'}")

    def why_not_ready(self) -> str | None:
        """What keeps this replica from serving, in words; None when it serves."""
        if self.ready():
            return None
        el = self.elector
        unhealthy = self.unhealthy()
        if unhealthy is not None:
            return f"{unhealthy}; not contending for the Lease until the lists succeed"
        if not el.leading():
            holder = el.holder()
            held = f"held by {holder}" if holder else "not held (acquiring)"
            return f"standby: the Lease {el.lease_name()} is {held}; this replica is {el.identity}"
        if not el.fresh():
            return (f"leader (term {el.term}) but the Lease was last renewed {el.renewal_age():.1f}s ago "
                    f"(renew deadline {el.config.renew_deadline_s:g}s): not binding")
        with self._lock:
            began = self._term_began
        relisting, failures = self.source.relisting(), self.source.failures()
        return (f"leader (term {el.term}) for {time.monotonic() - began:.1f}s, re-listing "
                f"{', '.join(relisting) or 'done, starting'}"
                f"{': ' + '; '.join(failures) if failures else ''}; releasing the Lease if not done within "
                f"{self.relist_deadline_s:g}s")
