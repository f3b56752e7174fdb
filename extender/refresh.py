"""The policy's refresher: the work a verb triggers but does not need for its own answer, done off the request path.

A learning policy re-solves its packing LP every so many pods and rebuilds its mix when the learnt counts move
(`packing.policies.frag_dual.FragDual.go_live`). Live, the verb that makes such work due only says so; the
refresher does it in steps of about a millisecond, each under the store's lock (the LP solve without it),
and the verbs use the last finished result meanwhile. Woken on the serving event loop (where filter and
prioritize run), it runs one step per loop callback, so a request waits behind two steps at most and no thread
competes with the verbs for the GIL (the LP solve goes to a worker thread); woken elsewhere, on its own thread,
letting go of the lock and the GIL between steps. Staleness: a verb scores with an LP solution at most
`resolve` pods plus the pods that arrive during one refresh old, and a mix at most one refresh behind the
counts. What a verb may do: docs/extender-speed.md.

Only policies that defer have one (`Refresher.for_policy`); the what-if, the replay and the planner's copies of
the policy compute synchronously, and so does the live policy on states smaller than the policy's threshold.
"""

from __future__ import annotations

import asyncio
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


LOCK_RETRY_S = 0.0002  # on the loop, a step that finds the store's lock taken (a bind's thread) looks again after


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _step_aside(work: Iterator[bool]) -> tuple[bool | None, Exception | None]:
    """One step off the loop: (whether the next needs the lock, or None when the work ended; its failure). The
    switch interval is lowered meanwhile, so the loop waits little for the GIL the step's Python holds."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        return next(work), None
    except StopIteration:
        return None, None
    except Exception as err:
        return None, err
    finally:
        sys.setswitchinterval(interval)


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
        self._busy = threading.Lock()  # one run at a time, on the loop or the thread
        self._on_loop = False  # a run is scheduled on the serving loop
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
        """Work is due (called by the policy, under the store's lock): start on it soon. Called on the serving
        event loop (filter and prioritize run there), the steps run on that loop between the requests it
        reads; called elsewhere, on the refresher's thread."""
        self._idle.clear()
        self._wanted.set()
        if not self.threaded or self._stop.is_set():
            return
        loop = _running_loop()
        if loop is not None:
            if not self._on_loop:
                self._on_loop = True
                loop.call_later(DEBOUNCE_S, self._loop_begin, loop)
            return
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
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
            if not self._busy.acquire(blocking=False):
                time.sleep(DEBOUNCE_S)  # a run on the loop has it; it looks again when it ends
                continue
            try:
                self._wanted.clear()
                self.run_once()
            finally:
                self._busy.release()
            self._settle()

    def _settle(self) -> None:
        """After a run: idle, or run again for work that fell due meanwhile."""
        with self.store.lock:
            if not self.policy.refresh_due() and not self._wanted.is_set():
                self._idle.set()
            else:
                self._wanted.set()

    # ---- on the serving loop: one step per callback, so a request that arrives waits behind one step at most
    def _loop_begin(self, loop: asyncio.AbstractEventLoop) -> None:
        self._on_loop = False
        if self._stop.is_set() or not self._busy.acquire(blocking=False):
            return  # the thread is on it (it saw `_wanted`)
        self._wanted.clear()
        with self.store.lock:
            work = self.policy.refresh_steps(self.store.state)
        self._loop_step(loop, work, True)

    def _loop_step(self, loop: asyncio.AbstractEventLoop, work: Iterator[bool], locked: bool) -> None:
        if not locked:  # the LP solve: in a worker thread, so the loop keeps answering meanwhile
            done = loop.run_in_executor(None, _step_aside, work)
            done.add_done_callback(lambda f: self._loop_resume(loop, work, f))
            return
        lock = self.store.lock
        if locked and not lock.acquire(blocking=False):  # a bind's thread holds it: look again soon
            loop.call_later(LOCK_RETRY_S, self._loop_step, loop, work, locked)
            return
        try:
            following = next(work)
        except StopIteration:
            self._loop_end(loop, None)
            return
        except Exception as err:  # the policy's failure must not break the loop's callbacks
            self._loop_end(loop, err)
            return
        finally:
            if locked:
                lock.release()
        # A timer, not `call_soon`: asyncio runs a readable socket's callback (a request's) after the callbacks
        # already queued but before due timers, so a request waits behind the step under way and at most one
        # more (uvloop, which uvicorn prefers, orders either so).
        loop.call_later(0, self._loop_step, loop, work, following)

    def _loop_resume(self, loop: asyncio.AbstractEventLoop, work: Iterator[bool],
                     done: asyncio.Future[tuple[bool | None, Exception | None]]) -> None:
        following, err = done.result()
        if following is None:
            self._loop_end(loop, err)
        else:
            self._loop_step(loop, work, following)

    def _loop_end(self, loop: asyncio.AbstractEventLoop, err: Exception | None) -> None:
        self._count(err)
        self._busy.release()
        with self.store.lock:
            again = self.policy.refresh_due() or self._wanted.is_set()
            if again:
                self.wake()  # on this loop
            else:
                self._idle.set()

    def _count(self, err: Exception | None) -> None:
        if err is None:
            self.refreshes.labels("done").inc()
            return
        self.refreshes.labels("failed").inc()
        log.error("policy refresh failed (%s: %s); the verbs keep the last results", type(err).__name__, err,
                  exc_info=err)

    def run_once(self) -> int:
        """Do the work due now, step by step; -> steps taken. Never raises: a failed refresh is logged and
        counted, and the verbs keep the last finished results (the work falls due again later)."""
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
        steps = 0
        try:
            steps = self._steps()
            self._count(None)
        except Exception as err:  # the policy's failure must not end the thread
            self._count(err)
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
