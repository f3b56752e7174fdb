"""The queue planner: plans the whole pending queue with CP-SAT off the request path.

A background thread (`Planner.start` / `stop`) runs a round whenever the queue or the cluster changed (the
store's generation, the queue's version) or a verb asked for a re-plan, at most once per `min_interval_s`, and
publishes the result as `Planner.plan` (a plain attribute swap: a verb reads whichever plan is current and never
waits for a solve). The solve itself (`packing.planning.queue_plan.plan_queue`) runs in a worker process of its
own (extender/planning/worker.py), so it does not share the server's GIL with the verbs, at a lower CPU priority; the
planner's thread only brings the worker's copy of the state up to date, sends the request and waits on the pipe
(which releases the GIL); with config `plan_cpus` the worker has CPUs of its own and the server the others
(extender/planning/cpus.py: sharing them, a solve still lengthened the verbs' tail). `worker="thread"` solves in this thread instead, through the same deltas and the same
solve call (tests; a server in a daemonic process, which may not start children, falls back to it).

State: under the store's lock the planner takes a `StateDelta` (packing.planning.working_copy: the rows whose
version moved, their books, the holders that changed) and pickles it there (the pickle is the copy; the objects
pickle by field, `packing.planning.by_field`, so the live view's attribute reads stay fast after it); the worker
applies it. The first round, and any round after the node set changed or a worker was restarted, copies every
row, in pieces of `SYNC_ROWS` rows (and of `HOLDERS_PER_ROW` holders per row) with the lock released between
them (a row that moves meanwhile is sent again); the queue is read with the last piece. `sync_hold_max_s`
records the longest hold; figures in benchmarks/results/extender_plan_inline40.md.

A roomy plan (status "roomy": the cluster has room for the whole queue, so the online policy places every pod and
the plan gives none units) carries how many nodes each pod shape fit; while the node rows that moved since cannot
have used that room up, a round checks it again on the live state (`_recheck`, under the lock: one comparison of
row versions, a count of the nodes each new pod shape fits, and the room of each shape in the queue against the
queue's length, from the queue's book of shapes; only where that is not enough, the queue read in order) and
publishes it for today's queue, with no delta sent and no solve (~0.07 ms for 200 pending pods at 5,000 nodes,
against ~0.45 ms reading and ordering the queue).

Failures: a solve that raises, or a worker that dies, hangs or cannot be reached, counts in `errors`, leaves the
last plan published (the verbs check it at bind time and go online where it is stale) and drops the worker; the
next round starts a new one with a full copy. `stop()` asks the worker to leave, joins it with a timeout, then
terminates it.

The verbs follow the plan through `packing.planning.follow` (the same rule `vramfit whatif --queue` uses).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from extender.planning.cpus import allowed_cpus, pin_this_process, split_cpus
from extender.planning.worker import InThread, PlanError, PlanRequest, WorkerProcess, make_worker
from extender.queue import Entry
from extender.store import Store
from packing.planning.working_copy import DeltaSource
from packing.policies import Policy
from packing.policies.base import fork_policy
from packing.policies.registry import get_policy

log = logging.getLogger("vramfit.planner")

POLL_S = 0.25  # how often the thread looks for a change nobody announced (watch events, binds)
SYNC_ROWS = 64  # rows of the state copied (and pickled) in one hold of the store's lock: ~6 ms at 8 GPUs
SYNC_PAUSE_S = 0.001  # the lock is free this long between two pieces of a copy


class Planner:
    """Plans the store's queue from a thread of its own, solving in a worker process; `plan` is the current
    QueuePlan (None before the first)."""

    def __init__(self, store: Store, *, budget_s: float = 0.5, min_interval_s: float = 1.0,
                 policy: str | Policy = "vramfit", clock: Callable[[], float] = time.monotonic,
                 worker: str = "process", repack: bool = False, cpus: int = 0, max_pods: int = 1000) -> None:
        """`policy`: the online policy the plan's floor is placed with: the server's live policy (the verbs'
        own object: each round plans with a fork of it taken under the store's lock, so the plan scores with
        the mix and parameters the verbs use) or a registry name (a fresh policy each round; tests).
        `worker`: where the solve runs, "process" (its own, the default) or "thread" (`extender.planning.worker`).
        `repack`: plan_queue's (config `plan_repack`). `cpus`: config `plan_cpus` (extender/planning/cpus.py): the worker
        process runs on that many CPUs of its own and `start` moves the server's threads to the others;
        ValueError when none would be left to the server. `max_pods`: config `plan_max_pods`, the most pods one round
        plans (the head of the queue: most urgent, then oldest), so a round's cost is bounded whatever the queue's
        size; the pods behind them go by the online policy until they reach the head."""
        self.store = store
        self.max_pods = max_pods
        # (the worker's CPUs, the server's), checked now so a bad config fails at start-up, not at the first plan
        self.cpus: tuple[frozenset[int], frozenset[int]] | None = split_cpus(cpus, allowed_cpus()) if cpus else None
        self.budget_s = budget_s
        self.min_interval_s = min_interval_s
        self.policy = policy
        self.repack = repack
        self.clock = clock
        self.plan: Any = None  # packing.planning.queue_plan.QueuePlan
        self.planned_at = 0.0  # clock() when `plan` was published
        self.solves = 0
        self.rechecks = 0  # rounds where a roomy plan was checked again on the live state, with no solve
        self.errors = 0
        self.queue_size = 0
        self.worker = worker
        self._worker: InThread | WorkerProcess | None = None
        self._source = DeltaSource()
        self.sync_hold_max_s = 0.0  # the longest the planner held the store's lock (one piece of a copy)
        self._seen: tuple[int, int] | None = None
        self._wanted = threading.Event()  # a verb asked for a re-plan, or stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._solving = threading.Lock()
        # Whether this replica serves verbs: a standby's plan would never be followed, so it does not solve.
        self.active: Callable[[], bool] = lambda: True
        # The policy's whole-GPU rule, which decides what a pod fits (the recheck counts nodes with it).
        self.whole_gpu = bool(get_policy(policy).whole_gpu if isinstance(policy, str) else policy.whole_gpu)
        # Called (from this thread) after a round that copied the whole state: `vramfit serve` freezes the heap
        # there (extender.cli.freeze_heap): what the first round built stays for the server's life.
        self.after_full_copy: Callable[[], None] | None = None

    # ---- the thread -----------------------------------------------------------------------------
    def start(self) -> Planner:
        if self._thread is None:
            if self.cpus is not None:
                pin_this_process(self.cpus[1])
                log.info("planner worker on CPUs %s, the server on %s", sorted(self.cpus[0]), sorted(self.cpus[1]))
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="queue-planner", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, then the worker (asked to leave, joined with a timeout, else terminated)."""
        self._stop.set()
        self._wanted.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        self._drop_worker()

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
                self.plan_now()  # a failure is counted there and leaves the last plan

    # ---- one round ------------------------------------------------------------------------------
    def changed(self) -> bool:
        return self._seen != (self.store.generation, self.store.queue.version)

    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid (None: none started yet, or planning in the thread)."""
        return self._worker.pid if isinstance(self._worker, WorkerProcess) else None

    def plan_now(self) -> Any:
        """Plan once, now, from the caller's thread (the thread's step; tests); returns the published plan (the
        last one, unchanged, when this round failed: the failure is counted in `errors` and logged)."""
        from packing.planning.queue_plan import QueuedPod

        with self._solving:
            if self._recheck():
                return self.plan
            try:
                if self._worker is None:  # first round, or the last worker failed: a new one, a full copy
                    self._worker = make_worker(self.worker, self.cpus[0] if self.cpus is not None else None)
                    self._source = DeltaSource()
                entries, seen, policy, full = self._sync(self._worker)
                if full and self.after_full_copy is not None:
                    self.after_full_copy()
                self.queue_size = len(entries)
                req = PlanRequest([QueuedPod(e.pod, e.created) for e in entries], self.plan, self.budget_s, policy,
                                  self.repack)
                plan = self._worker.plan(req, self._stop)
            except Exception:  # noqa: BLE001 - the last plan stays; the verbs go online where it is stale
                if not self._stop.is_set():
                    self.errors += 1
                    log.exception("planning the pending queue failed; the next round starts a new worker")
                self._drop_worker()
                return self.plan
            self.plan = plan  # published: the verbs read it from here on
            self.planned_at = self.clock()
            self._seen = seen
            self.solves += 1
            return plan

    def _recheck(self) -> bool:
        """A roomy plan (every pod fits on more nodes than there are pods ahead of it) checked again on the live
        state, without the worker: when the node rows that moved since it was made cannot have used up its room,
        it is published again for today's queue, all of it left to the online policy. Why: on a busy cluster with
        room, bringing the worker's copy up to date (pickling the moved rows) was the planner's largest cost to the
        verbs. First in time per pod shape (`queue_room.roomy_in_any_order`: each shape's room against the queue's
        length, from the queue's shape book), then, where that is not enough, in queue order (`still_roomy`)."""
        from packing.planning.queue_room import extend_room, roomy_in_any_order, still_roomy

        plan = self.plan
        if plan is None or plan.room is None or self._worker is None:
            return False
        t0 = self.clock()
        store = self.store
        roomy = False
        with store.lock:
            t_lock = time.perf_counter()
            moved = self._source.rows_moved(store.state, store.node_set_version)
            if moved is not None and store.queue.shape_count() > self.max_pods:
                moved = None  # counting room per shape would cost more than planning the queue's head afresh
            if moved is not None:  # None: the node set changed, plan afresh
                queue = store.queue
                shapes = queue.shapes()
                counts = extend_room(store.state, plan.room, shapes.values(), moved, self.whole_gpu)
                if roomy_in_any_order(counts, shapes, queue.ours(), moved):
                    keys = queue.pending_keys(store.state, self.max_pods)
                    roomy = bool(keys)
                else:  # the queue's order decides: `read` gives it (priority, then age)
                    pods = [e.pod for e in queue.read(store.state, self.max_pods)]
                    keys = frozenset(p.key for p in pods)
                    roomy = bool(pods) and still_roomy(counts, pods, moved)
                seen = (store.generation, queue.version)
            self.sync_hold_max_s = max(self.sync_hold_max_s, time.perf_counter() - t_lock)
        if not roomy:
            return False
        self.plan = replace(plan, solve_s=self.clock() - t0, queue_size=len(keys), placed=len(keys), online=keys,
                            room=counts)
        self.planned_at = self.clock()
        self.queue_size = len(keys)
        self._seen = seen
        self.rechecks += 1
        return True

    def _sync(self, worker: InThread | WorkerProcess) -> tuple[list[Entry], tuple[int, int], str | Policy, bool]:
        """Bring the worker's copy up to date, in pieces of at most SYNC_ROWS rows with the store's lock released
        between them (a full copy of 5,000 nodes in one piece held it for over a second); the queue is read with
        the last piece (and the live policy forked), so the plan is made on one moment's state, queue and policy.
        The last value: whether this was a full copy (the first piece started the copy over)."""
        full = False
        while True:
            with self.store.lock:
                t0 = time.perf_counter()
                delta = self._source.delta(self.store.state, self.store.node_set_version, max_rows=SYNC_ROWS)
                full = full or delta.reset is not None
                frozen = worker.freeze(delta)  # the copy (or the pickle) is taken under the lock
                if delta.complete:
                    seen = (self.store.generation, self.store.queue.version)
                    entries = self.store.queue.read(self.store.state, self.max_pods)
                    policy = self.policy if isinstance(self.policy, str) else fork_policy(self.policy)
                self.sync_hold_max_s = max(self.sync_hold_max_s, time.perf_counter() - t0)
            worker.send_state(frozen)
            if delta.complete:
                return entries, seen, policy, full
            if self._stop.is_set():  # a full copy of a large state takes a while: stop does not wait for it
                raise PlanError("the planner is stopping")
            time.sleep(SYNC_PAUSE_S)  # let the verbs waiting on the lock in before the next piece

    def _drop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    # ---- views ----------------------------------------------------------------------------------
    def age_s(self) -> float | None:
        return None if self.plan is None else max(0.0, self.clock() - self.planned_at)

    def to_json(self) -> dict[str, Any]:
        """The current plan for `/state`: pod -> node and units, the pods it leaves to the online policy, status,
        age."""
        plan = self.plan
        if plan is None:
            return {"status": "none", "age_s": None, "queue_size": self.queue_size, "errors": self.errors,
                    "sync_hold_max_s": round(self.sync_hold_max_s, 4), "assignments": {}, "online": []}
        age = self.age_s()
        return {"status": plan.status, "age_s": round(age, 3) if age is not None else None,
                "solve_s": round(plan.solve_s, 4), "queue_size": plan.queue_size, "placed": plan.placed,
                "parts": plan.parts, "solves": self.solves, "rechecks": self.rechecks, "errors": self.errors,
                "sync_hold_max_s": round(self.sync_hold_max_s, 4),
                "assignments": {k: {"node": a.node, "gpus": [g.to_json() for g in a.gpus]}
                                for k, a in plan.assignments.items()},
                "online": sorted(plan.online)}
