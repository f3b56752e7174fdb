"""The bind gate: at most one vramfit pod per node that is bound, allocating, and not yet admitted.

Why: the kubelet's Allocate call carries device IDs only, no pod. The node agent answers it for "the pod bound
to my node with `vramfit.io/phase: allocating` that the kubelet has not admitted yet (no `status.startTime`)";
that names one pod only while there is at most one such pod per node. So before a Binding to node N the
extender waits, bounded, until N's previous pod is admitted, deleted or finished.

Who is ahead (a *blocker*): a watched pod on N in that state (`in_admission`), or a pod this replica bound
moments ago whose watch event has not arrived yet (`AdmissionGate.bound`). Binds to one node are serialised
by a per-node lock held across the check, the reservation and the Binding; binds to different nodes never
wait for each other. The wait sleeps on the store's `changed` Condition (notified on every watch event), so
a bind proceeds as soon as the watch shows the kubelet admitted the pod ahead of it.

When the wait runs out (`wait_s`, well under kube-scheduler's httpTimeout) each blocker is re-read from the
API, since the watch may lag:
- admitted, deleted, finished, re-created, or not bound here after all: no blocker, proceed;
- still allocating and bound longer ago than `stale_s` (from `vramfit.io/bound-at`): stale. Its kubelet never
  admitted it (node agent down, kubelet busy, pod stuck): a Warning Event on it says the node is no longer
  held for it, and the bind proceeds. A stale phase must never block a node for good, as the stale node
  locks of HAMi #810/#1130 do. Blockers already that old are re-read at once instead of waited for.
- still allocating and young: the bind fails with "node N is admitting pod X; retry"; kube-scheduler
  requeues the pod with backoff and tries again.
Pods found clear or stale are remembered by UID, so later binds do not wait on them again.

Waiting holds no thread: on a server, a bind first takes its turn on the event loop (`turn`: an asyncio lock per
node, then a wait for the pods ahead, woken by one watcher thread per gate that follows the store's `changed`
Condition), and only then runs in a pool thread, where `hold` and `await_turn` find the node free and share the
turn's deadline. So 80 binds waiting on slow nodes hold no pool thread, and a bind to an idle node goes at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from extender.store import Store
from packing.k8s.demand import PHASE_ALLOCATING, bound_at, in_admission

log = logging.getLogger("vramfit.admission")

STALE_REASON = "VramfitAllocationStale"
REMEMBERED = 4096  # UIDs found clear or stale, not waited on again
_EPSILON_S = 0.01  # wake a moment after a blocker turns stale, not a moment before
WATCH_IDLE_S = 1.0  # the watcher wakes the waiting binds at least this often (a blocker may turn stale)


@dataclass(frozen=True)
class _Waited:
    """A turn taken on the event loop (`AdmissionGate.turn`), handed to the bind's thread (a context variable:
    the pool thread runs in a copy of the request's context)."""

    started: float  # gate clock
    deadline: float
    waited: bool


_TURN: contextvars.ContextVar[_Waited | None] = contextvars.ContextVar("vramfit_admission_turn", default=None)


class PodApi(Protocol):
    """What the gate needs of the API server (implemented by `extender.binder.KubeBinder`)."""

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def post_event(self, namespace: str, name: str, uid: str, *, reason: str, message: str,
                   event_type: str = "Normal") -> None: ...


def _key_uid(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}", str(meta.get("uid") or "")


@dataclass(frozen=True)
class Blocker:
    """A pod ahead of the bind on the same node."""

    key: str  # namespace/name
    uid: str
    bound_at: float | None  # epoch seconds

    def age_s(self, now: float) -> float:
        return math.inf if self.bound_at is None else now - self.bound_at


@dataclass
class Turn:
    """One bind's passage through the gate (filled in by `hold` and `await_turn`)."""

    node: str
    started: float  # gate clock
    deadline: float
    waited: bool = False  # had to wait: for the node's lock or for a pod ahead
    waited_s: float = 0.0
    released: list[str] = field(default_factory=list)  # stale pods no longer waited for
    busy: str | None = None  # set: the bind must fail with this message


@dataclass(frozen=True)
class _Recent:
    """A pod this replica bound whose watch event may not have arrived yet."""

    key: str
    uid: str
    bound_at: float
    seen: bool  # the store had the pod's object when it was bound


class _Verdict(Enum):
    CLEAR = "clear"
    STALE = "stale"
    BUSY = "busy"


class AdmissionGate:
    def __init__(self, store: Store, api: PodApi, *, wait_s: float = 5.0, stale_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.api = api
        self.wait_s = wait_s
        self.stale_s = stale_s
        self.clock = clock
        self.wall = wall
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # Guarded by the store's lock: read while waiting on its Condition.
        self._recent: dict[str, dict[str, _Recent]] = {}  # node -> pod key -> recent bind
        self._ignored: OrderedDict[str, None] = OrderedDict()  # UIDs found admitted, gone or stale
        # The event-loop side (`turn`): node -> [its asyncio lock, how many binds use it]; the binds waiting for
        # a store change, and the thread that wakes them.
        self._async_locks: dict[str, list[Any]] = {}
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._waiters_guard = threading.Lock()
        self._watcher: threading.Thread | None = None

    # ---- the per-node lock ----------------------------------------------------------------------
    def _lock_for(self, node: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(node)
            if lock is None:
                lock = self._locks[node] = threading.Lock()
            return lock

    @contextmanager
    def hold(self, node: str) -> Iterator[Turn]:
        """Hold the node's bind lock for the block; the Turn's `busy` is set if it was not had in `wait_s`."""
        started = self.clock()
        turn = Turn(node=node, started=started, deadline=started + self.wait_s)
        waited = _TURN.get()
        if waited is not None:  # the turn was taken on the event loop: its deadline and its wait count
            turn = Turn(node=node, started=waited.started, deadline=waited.deadline, waited=waited.waited)
        lock = self._lock_for(node)
        got = lock.acquire(blocking=False)
        if not got:
            turn.waited = True
            got = lock.acquire(timeout=max(0.0, turn.deadline - self.clock()))
        if not got:
            turn.waited_s = self.clock() - started
            turn.busy = f"node {node} is admitting other pods (binds to it are queued); retry"
            yield turn
            return
        try:
            yield turn
        finally:
            lock.release()

    # ---- the event loop's side: waiting without a thread ------------------------------------------
    @asynccontextmanager
    async def turn(self, node: str, key: str) -> AsyncIterator[None]:
        """On the event loop, before the bind runs in a pool thread: wait (holding no thread) until no other bind
        to the node is running and no pod there is ahead of this one, or until `wait_s` ran out; the block then
        runs with the node's turn (the thread's `hold` and `await_turn` take this turn's deadline)."""
        started = self.clock()
        deadline = started + self.wait_s
        slot = self._async_locks.setdefault(node, [asyncio.Lock(), 0])
        slot[1] += 1
        lock: asyncio.Lock = slot[0]
        got = False
        waited = lock.locked()  # another bind to the node is ahead
        try:
            try:
                if waited:
                    async with asyncio.timeout(max(0.0, deadline - self.clock())):
                        await lock.acquire()
                else:
                    await lock.acquire()  # free: taken at once, whatever the deadline
                got = True
            except TimeoutError:
                pass  # another bind to the node held it all along: the thread's turn finds it busy at once
            try:
                if got:
                    waited = await self._until_clear(node, key, deadline) or waited
                token = _TURN.set(_Waited(started, deadline if got else self.clock(), waited))
                try:
                    yield
                finally:
                    _TURN.reset(token)
            finally:
                if got:
                    lock.release()
        finally:
            slot[1] -= 1
            if slot[1] == 0 and self._async_locks.get(node) is slot:
                del self._async_locks[node]

    def queued(self, node: str) -> int:
        """How many binds to the node are taking their turn on the event loop (waiting, or running)."""
        slot = self._async_locks.get(node)
        return slot[1] if slot is not None else 0

    async def _until_clear(self, node: str, key: str, deadline: float) -> bool:
        """Wait until no young pod is ahead on the node or the deadline passes; whether it waited at all."""
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        self._enlist(waiter)
        waited = False
        try:
            while True:
                event.clear()  # before the look: a change after it sets the event again
                with self.store.lock:
                    blockers = self._blockers_locked(node, key)
                now = self.wall()
                young = [b for b in blockers if b.age_s(now) <= self.stale_s]
                remaining = deadline - self.clock()
                if not young or remaining <= 0:
                    return waited
                waited = True
                until_stale = min(self.stale_s - b.age_s(now) for b in young) + _EPSILON_S
                try:
                    await asyncio.wait_for(event.wait(), min(remaining, until_stale))
                except TimeoutError:
                    pass
        finally:
            with self._waiters_guard:
                self._waiters.discard(waiter)

    def _enlist(self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event]) -> None:
        with self._waiters_guard:
            self._waiters.add(waiter)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="vramfit-admission-watch", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        """Wake every waiting bind after each store change (and every WATCH_IDLE_S); leave when none waits.
        The store's lock is held except while waiting, so no change slips between two waits."""
        with self.store.changed:
            while True:
                with self._waiters_guard:
                    waiters = list(self._waiters)
                    if not waiters:
                        self._watcher = None
                        return
                for loop, event in waiters:
                    try:
                        loop.call_soon_threadsafe(event.set)
                    except RuntimeError:  # its loop closed (a server stopped): nothing to wake
                        with self._waiters_guard:
                            self._waiters.discard((loop, event))
                self.store.changed.wait(WATCH_IDLE_S)

    # ---- who is ahead -----------------------------------------------------------------------------
    def blockers(self, node: str, key: str) -> list[Blocker]:
        """Pods on the node, other than `key`, that a bind there would have to wait for now."""
        with self.store.lock:
            return self._blockers_locked(node, key)

    def _blockers_locked(self, node: str, key: str) -> list[Blocker]:
        out: list[Blocker] = []
        for obj in self.store.pods_on(node):
            k, uid = _key_uid(obj)
            if k != key and uid not in self._ignored and in_admission(obj, node):
                out.append(Blocker(k, uid, bound_at(obj)))
        recent = self._recent.get(node, {})
        for k, r in list(recent.items()):
            if self._caught_up(r):
                del recent[k]  # the watched object speaks for it now
            elif k != key and r.uid not in self._ignored and all(b.key != k for b in out):
                out.append(Blocker(k, r.uid, r.bound_at))
        return out

    def _caught_up(self, r: _Recent) -> bool:
        obj = self.store.pod_object(r.key)
        if obj is None:
            return r.seen  # known before the bind, gone now: the watch delivered its deletion
        meta = obj.get("metadata") or {}
        if str(meta.get("uid") or "") != r.uid:
            return True  # re-created under the same name: the pod we bound is gone
        return bool((obj.get("spec") or {}).get("nodeName"))

    def bound(self, node: str, key: str, uid: str, *, seen: bool) -> None:
        """A Binding to the node just succeeded (call with the node held): the pod is ahead of the next bind
        until the watch shows it (`seen`: the store had its object before)."""
        with self.store.lock:
            self._recent.setdefault(node, {})[key] = _Recent(key, uid, self.wall(), seen)

    # ---- waiting ----------------------------------------------------------------------------------
    def await_turn(self, turn: Turn, node: str, key: str) -> None:
        """Inside `hold`: wait until no other pod on the node is allocating and not admitted, at most until
        the turn's deadline; then re-read those left. Sets `turn.busy` if one is still legitimately ahead."""
        with self.store.changed:
            while True:
                blockers = self._blockers_locked(node, key)
                now = self.wall()
                young = [b for b in blockers if b.age_s(now) <= self.stale_s]
                remaining = turn.deadline - self.clock()
                if not young or remaining <= 0:
                    break
                turn.waited = True
                until_stale = min(self.stale_s - b.age_s(now) for b in young) + _EPSILON_S
                self.store.changed.wait(min(remaining, until_stale))
        if blockers:
            self._verify(turn, node, blockers)
        if turn.waited:
            turn.waited_s = self.clock() - turn.started

    def _verify(self, turn: Turn, node: str, blockers: list[Blocker]) -> None:
        """Re-read each blocker from the API (outside the store lock: network I/O)."""
        for b in blockers:
            verdict, age = self._judge(b, node)
            if verdict is _Verdict.BUSY:
                if turn.busy is None:
                    turn.busy = (f"node {node} is admitting pod {b.key}; retry (bound {age:.0f}s ago, "
                                 "waiting for its kubelet to admit it)")
                continue
            self._remember(node, b)
            if verdict is _Verdict.STALE:
                turn.released.append(b.key)
                self._warn_stale(b, node, age)

    def _judge(self, b: Blocker, node: str) -> tuple[_Verdict, float]:
        namespace, _, name = b.key.partition("/")
        try:
            obj = self.api.read_pod(namespace, name)
        except Exception as exc:  # noqa: BLE001 - an unreadable pod is judged by what the watch showed
            log.warning("could not re-read pod %s ahead of a bind to %s: %s", b.key, node, exc)
            age = b.age_s(self.wall())
            return (_Verdict.STALE if age > self.stale_s else _Verdict.BUSY), age
        if obj is None or (b.uid and _key_uid(obj)[1] != b.uid) or not in_admission(obj, node):
            return _Verdict.CLEAR, 0.0
        stamp = bound_at(obj)
        if stamp is None:
            stamp = b.bound_at
        age = math.inf if stamp is None else self.wall() - stamp
        return (_Verdict.STALE if age > self.stale_s else _Verdict.BUSY), age

    def _remember(self, node: str, b: Blocker) -> None:
        with self.store.lock:
            if b.uid:
                self._ignored[b.uid] = None
                self._ignored.move_to_end(b.uid)
                while len(self._ignored) > REMEMBERED:
                    self._ignored.popitem(last=False)
            recent = self._recent.get(node, {})
            if b.key in recent and recent[b.key].uid == b.uid:
                del recent[b.key]

    def _warn_stale(self, b: Blocker, node: str, age: float) -> None:
        since = "an unknown time" if math.isinf(age) else f"{age:.0f}s"
        message = (f"Node {node} is no longer held for this pod: bound {since} ago and still {PHASE_ALLOCATING} "
                   "(the kubelet has not admitted it: no status.startTime); vramfit binds other pods to the "
                   "node again, so its node agent may no longer tell which pod an Allocate call is for")
        log.warning("pod %s on %s: %s", b.key, node, message)
        namespace, _, name = b.key.partition("/")
        try:
            self.api.post_event(namespace, name, b.uid, reason=STALE_REASON, message=message,
                                event_type="Warning")
        except Exception as exc:  # noqa: BLE001 - the release stands whether or not the Event posts
            log.info("could not post %s for %s: %s", STALE_REASON, b.key, exc)
