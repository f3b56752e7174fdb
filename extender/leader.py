"""Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's leaderelection does it.

Every replica watches the cluster (a warm cache); only the holder of the Lease answers verbs and binds.

    acquire: GET the Lease (create it if absent); it is free when it has no holder, or when its record has not
             changed for leaseDuration as *observed on our own clock* (no clock-skew dependence), then PUT it
             with our identity under the read resourceVersion — a racing replica gets 409 and stays standby.
    renew:   every retryPeriod, PUT renewTime; if no renewal succeeded for renewDeadline, step down.
    fence:   a bind needs a renewal younger than renewDeadline (< leaseDuration), and its API call times out
             within leaseDuration - renewDeadline, so it lands before any other replica can take the Lease.
    term:    each acquisition starts a new term; the term is ready only after a fresh LIST of nodes and pods
             (the old leader's last Bindings are in it), so a new leader never answers from a stale view.
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
from typing import Any

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
    lease_duration_s: float = 6.0
    renew_deadline_s: float = 4.0
    retry_period_s: float = 1.0

    def __post_init__(self) -> None:
        # client-go's rules: leaseDuration > renewDeadline > retryPeriod * jitter (1.2).
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s * 1.2 > 0:
            raise ValueError("leader election needs lease duration > renew deadline > 1.2 x retry period > 0, "
                             f"got {self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s}")

    @property
    def write_budget_s(self) -> float:
        """How long a fenced write may take and still land inside the term."""
        return self.lease_duration_s - self.renew_deadline_s


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
        self._lock = threading.Lock()
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

    # -- one attempt ------------------------------------------------------------------------------------
    def _read(self) -> dict[str, Any] | None:
        try:
            resp = self.api.read_namespaced_lease(self.config.name, self.config.namespace, _preload_content=False,
                                                  _request_timeout=self.config.retry_period_s)
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
        spec["leaseDurationSeconds"] = max(1, round(self.config.lease_duration_s))
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
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                        "spec": self._spec(None, now)}
                _done(self.api.create_namespaced_lease(self.config.namespace, body,  # type: ignore[arg-type]
                                                       _preload_content=False, _headers=JSON_HEADERS,
                                                       _request_timeout=self.config.retry_period_s))
                self._renewed(body["spec"])
                return True
            spec = lease.get("spec") or {}
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            holder = spec.get("holderIdentity")
            duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration_s)
            if holder and holder != self.identity and self._observed_at + duration > self.clock():
                return False  # held by another replica, not expired on our clock
            lease["spec"] = self._spec(spec, now)
            _done(self.api.replace_namespaced_lease(self.config.name, self.config.namespace, lease,  # type: ignore[arg-type]
                                                    _preload_content=False, _headers=JSON_HEADERS,
                                                    _request_timeout=self.config.retry_period_s))
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

    def run(self) -> None:
        while not self.stop_event.is_set():
            self._step()
            # Jittered like client-go's wait.JitterUntil (factor 1.2), so replicas do not retry in step.
            self.stop_event.wait(self.config.retry_period_s * (1.0 + 0.2 * random.random()))

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
                                                    _request_timeout=self.config.retry_period_s))
        except Exception as exc:  # noqa: BLE001 - best effort: the lease expires on its own otherwise
            log.info("releasing the lease failed: %s", exc)


class LeadershipTerm:
    """Readiness that belongs to the term: leader, fresh, and the cache re-listed since this term began."""

    def __init__(self, elector: LeaderElector, resync: Callable[[], bool]) -> None:
        self.elector = elector
        self.resync = resync
        self._ready_term = 0
        self._lock = threading.Lock()
        elector.on_started = self._started
        elector.on_stopped = self._stopped

    def _started(self, term: int) -> None:
        def sync() -> None:
            if self.resync() and self.elector.term == term and self.elector.leading():
                with self._lock:
                    self._ready_term = term
                log.info("term %d: cache re-listed, serving", term)

        threading.Thread(target=sync, name=f"term-{term}-resync", daemon=True).start()

    def _stopped(self) -> None:
        with self._lock:
            self._ready_term = 0

    def ready(self) -> bool:
        with self._lock:
            ready_term = self._ready_term
        return ready_term != 0 and ready_term == self.elector.term and self.elector.fresh()
