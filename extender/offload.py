"""Bounded work off the event loop: what a request costs in CPU runs on an executor of its own, and what may
wait for it is bounded too, so a flood of requests queues a bounded amount of work and memory.

The event loop serves kube-scheduler's verbs, the probes and the API server's webhook calls: anything that
parses a large body or walks the whole cluster (the view, `/state`, preempt, `/mutate`) must not run there.
Each kind of work gets an `Offload`: at most `workers` calls run at once, and at most `waiting` more are
admitted to wait; a call beyond that is refused at once with `Busy` (the route answers 503 with Retry-After),
never queued. A slot is taken before the request body is read (`admit`), so the bodies held in memory are
bounded as well, and it is given back only when the work itself ends (a client that hangs up does not free
a slot while its work still runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

RETRY_AFTER_S = 1  # what a refused client is told to wait


class Busy(Exception):
    """Every slot of an Offload is taken: the request is refused, not queued."""


class Offload:
    """A thread pool of `workers` threads behind an admission count of `workers + waiting` slots."""

    def __init__(self, name: str, workers: int, waiting: int) -> None:
        if workers < 1 or waiting < 0:
            raise ValueError(f"offload {name}: workers >= 1 and waiting >= 0, got {workers}, {waiting}")
        self.name = name
        self.workers = workers
        self.slots = workers + waiting
        self._taken = 0
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.refused = 0  # calls refused with Busy (a counter for tests and logs)

    def _executor(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=f"vramfit-{self.name}")
            return self._pool

    def _take(self) -> None:
        with self._guard:
            if self._taken >= self.slots:
                self.refused += 1
                raise Busy(f"too many {self.name} requests at once ({self.slots}); retry in {RETRY_AFTER_S} s")
            self._taken += 1

    def _give(self) -> None:
        with self._guard:
            self._taken -= 1

    @property
    def taken(self) -> int:
        return self._taken

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[Slot]:
        """A slot for one request (raises Busy when none is free): read its body, then `slot.run` its work.
        The slot is given back when the block ends, or when work it started ends, whichever is later."""
        self._take()
        slot = Slot(self)
        try:
            yield slot
        finally:
            slot.leave()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Admit and run one call (raises Busy when no slot is free)."""
        async with self.admit() as slot:
            return await slot.run(fn, *args, **kwargs)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class Slot:
    """One admitted request's hold on its Offload."""

    def __init__(self, owner: Offload) -> None:
        self.owner = owner
        self._holds = 1  # the request itself, plus one per call still running
        self._lock = threading.Lock()

    def _drop(self) -> None:
        with self._lock:
            self._holds -= 1
            done = self._holds == 0
        if done:
            self.owner._give()

    def leave(self) -> None:
        self._drop()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the pool; the slot stays taken until it returns, even if the awaiting request is
        cancelled meanwhile."""
        with self._lock:
            self._holds += 1
        try:
            future = self.owner._executor().submit(fn, *args, **kwargs)
        except BaseException:
            self._drop()
            raise
        future.add_done_callback(lambda _: self._drop())
        return await asyncio.wrap_future(future)
