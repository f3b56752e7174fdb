"""The policy's refresher: the work a verb triggers but does not need for its own answer, done off the request path.

A learning policy re-solves its packing LP every so many pods and rebuilds its mix when the learnt counts move
(`packing.policies.frag_dual.FragDual.go_live`). Live, the verb that makes such work due only says so; this
thread does it, in steps of about half a millisecond under the store's lock (the LP solve without it), and the
verbs use the last finished result meanwhile. Between steps it lets go of the lock and the GIL, so a verb
waits behind at most one step. Staleness: a verb scores with an LP solution at most `resolve` pods plus the
pods that arrive during one refresh old, and a mix at most one refresh behind the counts (at 5,000 nodes a
refresh takes tens of milliseconds).

Only policies that defer have one (`Refresher.for_policy`); the what-if, the replay and the planner's copies of
the policy compute synchronously, and so does the live policy on states smaller than the policy's threshold.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from extender.store import Store

log = logging.getLogger("vramfit.extender")

# Wait this long after being woken before starting: work that falls due together (a mix refresh and an LP
# re-solve on the same pod) is done in one refresh.
DEBOUNCE_S = 0.002
# While a refresh runs, the interpreter's switch interval: a verb that wants the GIL while the refresher holds it
# (the LP's model building, in Python) waits at most about this long instead of the default 5 ms.
SWITCH_INTERVAL_S = 0.0005


class Deferring(Protocol):
    def go_live(self, wake: Callable[[], None]) -> None: ...

    def refresh_due(self) -> bool: ...

    def refresh_steps(self, state: Any) -> Iterator[bool]: ...


class Refresher:
    """Runs a policy's deferred work (`refresh_steps`) on its own thread, started at the first work due."""

    def __init__(self, store: Store, policy: Deferring, registry: CollectorRegistry | None = None,
                 threaded: bool = True) -> None:
        """threaded=False: no thread; the owner calls `run_once` (tests step it by hand)."""
        self.store = store
        self.policy = policy
        self.threaded = threaded
        self._wanted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.refreshes = Counter("vramfit_policy_refreshes_total",
                                 "Deferred policy work (LP re-solves, mix rebuilds) done off the request path, "
                                 "by outcome", ["outcome"], registry=registry)
        policy.go_live(self.wake)

    @staticmethod
    def for_policy(store: Store, policy: Any, registry: CollectorRegistry | None = None) -> Refresher | None:
        """A refresher for a policy that can defer its work (None for one that cannot)."""
        if not all(callable(getattr(policy, m, None)) for m in ("go_live", "refresh_due", "refresh_steps")):
            return None
        return Refresher(store, policy, registry)

    def wake(self) -> None:
        """Work is due (called by the policy, under the store's lock): start on it soon."""
        self._idle.clear()
        self._wanted.set()
        if self._thread is None and self.threaded:
            with self._start_lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="vramfit-refresher", daemon=True)
                    self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wanted.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no work is due or running (tests, benchmarks); False on timeout."""
        return self._idle.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait()
            if self._stop.is_set():
                break
            time.sleep(DEBOUNCE_S)
            self._wanted.clear()
            self.run_once()
            with self.store.lock:
                if not self.policy.refresh_due() and not self._wanted.is_set():
                    self._idle.set()

    def run_once(self) -> int:
        """Do the work due now, step by step; -> steps taken. Never raises: a failed refresh is logged and
        counted, and the verbs keep the last finished results (the work falls due again later)."""
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
        steps = 0
        try:
            steps = self._steps()
            self.refreshes.labels("done").inc()
        except Exception as err:  # the policy's failure must not end the thread
            self.refreshes.labels("failed").inc()
            log.error("policy refresh failed (%s: %s); the verbs keep the last results", type(err).__name__, err,
                      exc_info=err)
        finally:
            sys.setswitchinterval(interval)
        return steps

    def _steps(self) -> int:
        lock = self.store.lock
        with lock:
            state = self.store.state
            work = self.policy.refresh_steps(state)
        locked, steps = True, 0
        while True:
            try:
                if locked:
                    with lock:
                        locked = next(work)
                else:
                    locked = next(work)
            except StopIteration:
                return steps
            steps += 1
            time.sleep(0)  # let a verb waiting for the lock or the GIL go first
