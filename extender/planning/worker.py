"""Where the queue planner's solve runs (extender/planning/planner.py): a worker process of its own (the
default), or the planner's thread (`InThread`: tests, and a server that runs in a daemonic process, which may not
have children).

Both take the same two calls: `send_state(frozen delta)` (a `packing.planning.working_copy.StateDelta`, frozen under
the store's lock by `freeze`) and `plan(request)`; both apply the delta with `apply_delta` and plan with `solve`,
so the process changes only the transport. The process (`WorkerProcess`, started with the "spawn" context: the
server has threads, and fork would copy their locks held) keeps its own working copy, lowers its CPU priority so
the kernel favours the serving process on a busy box, and answers each request with the plan or the error.
Protocol on the pipe, both ways pickled by field (`packing.planning.by_field.dumps`: the server's view keeps its
attributes inline): parent -> child ("state", StateDelta) and ("plan", PlanRequest) messages; the child answers a
plan request only, with ("plan", QueuePlan) or ("error", traceback text).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
import traceback
import weakref
from collections.abc import Collection
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from packing.planning.by_field import dumps
from packing.planning.working_copy import StateDelta, WorkingCopy, apply_delta

if TYPE_CHECKING:  # the solver (OR-Tools) is imported by the first solve, not by the server's start
    from packing.planning.queue_plan import QueuedPod, QueuePlan
    from packing.policies import Policy

log = logging.getLogger("vramfit.planner")

NICE = 10  # the worker's niceness increment: the verbs win the CPU when both want it
REPLY_S = 60.0  # a reply may take this long on top of 4x the budget (a first full copy on a busy box) before
# the worker is taken for hung
POLL_S = 0.1  # how often a wait for the reply looks at stop and at whether the worker still lives
STOP_S = 2.0  # stop: how long the worker gets to leave on its own before it is terminated


class PlanError(RuntimeError):
    """The solve raised, or the worker died, hung or was stopped: no plan this round."""


@dataclass(frozen=True)
class PlanRequest:
    queue: list[QueuedPod]
    previous: QueuePlan | None  # the warm start
    budget_s: float
    policy: str | Policy  # a registry name, or a fork of the server's live policy (pickled with the request)
    repack: bool  # plan_queue's (the config's plan_repack)


def solve(books: WorkingCopy | None, req: PlanRequest) -> QueuePlan:
    """One plan of the queue on the working copy (the same call in the thread and in the worker)."""
    from packing.planning.queue_plan import QueuePlan, plan_queue

    if not req.queue:
        return QueuePlan(MappingProxyType({}), "empty", 0.0, 0, 0, 0)
    if books is None:
        raise PlanError("a plan was asked before any state arrived")
    return plan_queue(books, req.queue, time_limit_s=req.budget_s, previous=req.previous, policy=req.policy,
                      repack=req.repack)


def to_wire(plan: QueuePlan | None) -> QueuePlan | None:
    """A plan that pickles: its read-only assignments view (a mappingproxy, which does not pickle) as a dict."""
    return None if plan is None else replace(plan, assignments=dict(plan.assignments))


def from_wire(plan: QueuePlan) -> QueuePlan:
    return replace(plan, assignments=MappingProxyType(dict(plan.assignments)))


# ---- the child -----------------------------------------------------------------------------------------

def serve(conn: Connection, cpus: Collection[int] | None = None) -> None:
    """The worker's loop: apply state deltas, answer plan requests, until the pipe closes or "stop" comes.
    `cpus`: the CPUs it runs on (config `plan_cpus`; None: those it inherits)."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))  # before any solver thread starts: they inherit it
    try:
        os.nice(NICE)
    except OSError:  # best-effort: some sandboxes refuse it
        pass
    books: WorkingCopy | None = None
    while True:
        try:
            kind, body = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the server went away
            return
        if kind == "stop":
            return
        if kind == "state":
            books = apply_delta(books, body)
            continue
        try:
            reply: tuple[str, Any] = ("plan", to_wire(solve(books, body)))
        except Exception:  # noqa: BLE001 - the parent counts it and keeps its last plan
            reply = ("error", traceback.format_exc())
        try:
            conn.send_bytes(dumps(reply))
        except (EOFError, OSError):
            return


# ---- the parent's ends -------------------------------------------------------------------------------

class InThread:
    """The solve in the planner's own thread: a local copy; the delta's books are copied under the lock."""

    def __init__(self) -> None:
        self.books: WorkingCopy | None = None

    def freeze(self, delta: StateDelta) -> Any:
        return delta.copied()

    def send_state(self, frozen: Any) -> None:
        self.books = apply_delta(self.books, frozen)

    def plan(self, req: PlanRequest, stop: threading.Event) -> QueuePlan:
        return solve(self.books, req)

    def close(self) -> None:
        self.books = None


class WorkerProcess:
    """A worker process and the parent's end of its pipe. A delta is pickled under the lock (the pickle is the
    copy) and sent after; waiting for the reply waits on the pipe, which releases the GIL."""

    def __init__(self, cpus: Collection[int] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc: BaseProcess = ctx.Process(target=serve, args=(child, sorted(cpus) if cpus else None),
                                             name="vramfit-queue-planner", daemon=True)
        self.proc.start()
        child.close()  # the child holds its own end: EOF here when it dies
        # A planner dropped without stop() (a test) still takes its worker with it.
        self._finalizer = weakref.finalize(self, _shut, self.proc, self.conn)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def freeze(self, delta: StateDelta) -> Any:
        return dumps(("state", delta))

    def send_state(self, frozen: Any) -> None:
        self._send_bytes(frozen)

    def plan(self, req: PlanRequest, stop: threading.Event) -> QueuePlan:
        req = replace(req, previous=to_wire(req.previous))
        self._send_bytes(dumps(("plan", req)))
        deadline = time.monotonic() + REPLY_S + 4 * req.budget_s
        try:
            while not self.conn.poll(POLL_S):
                if stop.is_set():
                    raise PlanError("the planner is stopping")
                if not self.proc.is_alive():
                    raise PlanError(f"the planner's worker died (exit code {self.proc.exitcode})")
                if time.monotonic() > deadline:
                    raise PlanError("the planner's worker did not answer in time")
            kind, body = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as err:
            raise PlanError(f"the planner's worker went away: {err!r}") from None
        if kind != "plan":
            raise PlanError(f"the solve failed in the worker:\n{body}")
        return from_wire(body)

    def _send_bytes(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except (EOFError, OSError) as err:
            raise PlanError(f"the planner's worker went away: {err!r}") from None

    def close(self) -> None:
        self._finalizer()


def _shut(proc: BaseProcess, conn: Connection) -> None:
    """Ask the worker to leave, then make sure: join with a timeout, terminate, kill; never leave a zombie."""
    try:
        conn.send_bytes(pickle.dumps(("stop", None)))
    except (EOFError, OSError, ValueError):
        pass
    conn.close()
    proc.join(STOP_S)
    if proc.is_alive():
        proc.terminate()
        proc.join(STOP_S)
    if proc.is_alive():
        proc.kill()
        proc.join(STOP_S)


def make_worker(kind: str, cpus: Collection[int] | None = None) -> InThread | WorkerProcess:
    """"process" (a daemonic process may not start one: then the thread, said in the log) or "thread".
    `cpus`: the process's CPUs (config `plan_cpus`); a thread runs wherever the server does."""
    if kind == "process" and mp.current_process().daemon:
        log.warning("the server runs in a daemonic process, which may not start the planner's worker: "
                    "planning in a thread of the server instead")
        kind = "thread"
    if kind == "thread":
        return InThread()
    if kind != "process":
        raise ValueError(f"planner worker: expected 'process' or 'thread', got {kind!r}")
    return WorkerProcess(cpus)
