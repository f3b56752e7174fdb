"""The queue planner: plans the whole pending queue with CP-SAT off the request path (issue 13).

A background thread (`Planner.start` / `stop`) calls `packing.solvers.queue_plan.plan_queue` whenever the queue
or the cluster changed (the store's generation, the queue's version) or a verb asked for a re-plan, at most once
per `min_interval_s`, and publishes the result as `Planner.plan` (a plain attribute swap: a verb reads whichever
plan is current and never waits for a solve). The solve never holds the store's lock: under the lock the planner
only brings its own copy of the state up to date (`StateMirror`: the rows whose version moved, copied as the
planner's books; a full copy only when the node set changed) and reads the queue; it solves on the copy.
The full copy holds the lock for its length (~1.6 s at 5,000 nodes x 8 GPUs on a busy 2-CPU box): once after
start, and again whenever a node joins or leaves; the row-by-row updates between cost well under a millisecond.

The verbs follow the plan through `extender.follow` (the same rule `vramfit whatif --queue` uses).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from extender.queue import Entry
from extender.store import Store
from packing.solvers.working_copy import StateMirror
from packing.state import ClusterState

log = logging.getLogger("vramfit.planner")

POLL_S = 0.25  # how often the thread looks for a change nobody announced (watch events, binds)


class Planner:
    """Plans the store's queue in a thread of its own; `plan` is the current QueuePlan (None before the first)."""

    def __init__(self, store: Store, *, budget_s: float = 0.5, min_interval_s: float = 1.0, policy: str = "vramfit",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.budget_s = budget_s
        self.min_interval_s = min_interval_s
        self.policy = policy
        self.clock = clock
        self.plan: Any = None  # packing.solvers.queue_plan.QueuePlan
        self.planned_at = 0.0  # clock() when `plan` was published
        self.solves = 0
        self.errors = 0
        self.queue_size = 0
        self._mirror = StateMirror()
        self._seen: tuple[int, int] | None = None
        self._wanted = threading.Event()  # a verb asked for a re-plan, or stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._solving = threading.Lock()
        # Whether this replica serves verbs: a standby's plan would never be followed, so it does not solve.
        self.active: Callable[[], bool] = lambda: True

    # ---- the thread -----------------------------------------------------------------------------
    def start(self) -> Planner:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="queue-planner", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wanted.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def request_replan(self) -> None:
        """A verb found the plan stale: plan again soon (never waits)."""
        self._seen = None
        self._wanted.set()

    def _run(self) -> None:
        last = -float("inf")
        while not self._stop.is_set():
            self._wanted.wait(POLL_S)
            if self._stop.is_set():
                return
            self._wanted.clear()
            wait = last + self.min_interval_s - self.clock()
            if wait > 0 and self._stop.wait(wait):
                return
            if self.changed() and self.active():
                last = self.clock()
                try:
                    self.plan_now()
                except Exception:  # noqa: BLE001 - a failed solve leaves the last plan; the verbs go online
                    self.errors += 1
                    log.exception("planning the pending queue failed")

    # ---- one round ------------------------------------------------------------------------------
    def changed(self) -> bool:
        return self._seen != (self.store.generation, self.store.queue.version)

    def snapshot(self) -> tuple[ClusterState, list[Entry], tuple[int, int]]:
        """The planner's copy of the state and the queue, read together under the store's lock."""
        with self.store.lock:
            seen = (self.store.generation, self.store.queue.version)
            entries = self.store.queue.read(self.store.state)
            state = self._mirror.sync(self.store.state, self.store.node_set_version)
        return state, entries, seen

    def plan_now(self) -> Any:
        """Plan once, now, in the caller's thread (the thread's step; tests); returns the published plan."""
        from packing.solvers.queue_plan import QueuedPod, QueuePlan, plan_queue

        with self._solving:
            state, entries, seen = self.snapshot()
            self.queue_size = len(entries)
            if entries:
                queue = [QueuedPod(e.pod, e.created) for e in entries]
                plan = plan_queue(state, queue, time_limit_s=self.budget_s, previous=self.plan, policy=self.policy)
            else:
                plan = QueuePlan({}, "empty", 0.0, 0, 0, 0)
            self.plan = plan  # published: the verbs read it from here on
            self.planned_at = self.clock()
            self._seen = seen
            self.solves += 1
            return plan

    # ---- views ----------------------------------------------------------------------------------
    def age_s(self) -> float | None:
        return None if self.plan is None else max(0.0, self.clock() - self.planned_at)

    def to_json(self) -> dict[str, Any]:
        """The current plan for `/state`: pod -> node and units, status, age."""
        plan = self.plan
        if plan is None:
            return {"status": "none", "age_s": None, "queue_size": self.queue_size, "assignments": {}}
        age = self.age_s()
        return {"status": plan.status, "age_s": round(age, 3) if age is not None else None,
                "solve_s": round(plan.solve_s, 4), "queue_size": plan.queue_size, "placed": plan.placed,
                "parts": plan.parts, "solves": self.solves,
                "assignments": {k: {"node": a.node, "gpus": [g.to_json() for g in a.gpus]}
                                for k, a in plan.assignments.items()}}
