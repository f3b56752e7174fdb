"""bind: reserve the pod's units on the chosen node and write its Binding, or say why not.

Only pods that are pending for vramfit's scheduler and that a filter call named within the window are
placed. On a live cluster the bind goes through the binder's admission gate (`extender.admission`): one bind
per node at a time, and none while the node's previous pod is still allocating and not admitted by its
kubelet. The units are booked when the bind arrives, before it queues at the gate (`Bind.promise`): filter
counts the binds it promised and has not made yet. A failed bind never leaves units booked, except where the
API's answer is unknown.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from extender import wire
from extender.admission import AdmissionGate, Turn
from extender.binder import Binder, BindError, BindOutcomeUnknown
from extender.metrics import Metrics
from extender.planning import verbs as planning
from extender.store import NoFit
from extender.verbs.filter import FilterMemory
from extender.verbs.shared import Shared
from packing.model import Assignment, InputError, PodDemand

log = logging.getLogger("vramfit.extender")


@dataclass
class Promise:
    """A bind checked and its units booked (or its refusal), made before it waits at the node's gate."""

    args: wire.ExtenderBindingArgs
    refusal: dict[str, str] | None = None
    pod: PodDemand | None = None
    assignment: Assignment | None = None
    via: str | None = None
    taken: bool = False  # the bind's thread took it over (and releases it on failure)


# The promise made on the event loop (`Bind.turn`), handed to the bind's pool thread (a copy of its context).
_PROMISE: contextvars.ContextVar[Promise | None] = contextvars.ContextVar("vramfit_bind_promise", default=None)


class Bind:
    """ExtenderBindingArgs -> ExtenderBindingResult: the pod bound to the node, or the reason it is not."""

    def __init__(self, shared: Shared, memory: FilterMemory, binder: Binder, metrics: Metrics,
                 scheduler_names: Iterable[str]) -> None:
        self.shared = shared
        self.store = shared.store
        self.memory = memory
        self.binder = binder
        self.metrics = metrics
        self.scheduler_names = frozenset(scheduler_names)

    def __call__(self, args: wire.ExtenderBindingArgs) -> dict[str, str]:
        promise = _PROMISE.get()
        if promise is None or promise.args is not args:  # no turn on the event loop (snapshot mode, direct calls)
            promise = self.promise(args)
        promise.taken = True
        if promise.refusal is not None:
            return promise.refusal
        assert promise.pod is not None and promise.assignment is not None
        gate: AdmissionGate | None = getattr(self.binder, "admission", None)
        if gate is None:  # snapshot mode: no kubelet, nothing to wait for
            return self._write(promise, None)
        # One bind at a time per node (check + Binding), so that at most one pod there is allocating and not yet
        # admitted: the node agent's Allocate relies on it (extender.admission).
        with gate.hold(promise.args.Node) as turn:
            if turn.busy is not None:
                self._count_wait(turn)
                self.store.release(promise.pod.uid)
                return self._bind_error("node_busy", turn.busy)
            return self._write(promise, (gate, turn))

    def promise(self, args: wire.ExtenderBindingArgs) -> Promise:
        """Check the bind and book its units now, before it queues at the node's admission gate: a filter call
        meanwhile counts them, so a burst to one node is refused at filter, not at bind seconds later."""
        ns, name, uid, node = args.PodNamespace, args.PodName, args.PodUID, args.Node
        key = f"{ns}/{name}"
        refused = lambda result, text: Promise(args, refusal=self._bind_error(result, text))  # noqa: E731
        with self.store.lock:
            held = self.store.state.holder(key)
            if held is not None and (not uid or held.pod.uid == uid):
                if held.reserved:
                    return refused("in_progress", f"a bind of pod {key} is already in progress")
                if held.assignment.node == node:
                    self.metrics.binds.labels("repeat").inc()
                    return Promise(args, refusal=wire.binding_result())  # a retry of a bind that succeeded
                return refused("conflict", f"pod {key} is already bound to {held.assignment.node}")
        refusal = self._bind_refusal(key, uid)
        if refusal is not None:
            return refused(*refusal)
        # A live cluster (a binder with a bind gate) watches every pod: what is booked comes from the watched
        # pod, never from a filter call's Pod body alone.
        gated = getattr(self.binder, "admission", None) is not None
        try:
            pod = self.store.demand_for(ns, name, uid, watched_only=gated)
            if pod is not None:
                self.shared.demand_limits().check(pod)
        except InputError as err:
            return refused("bad_pod", f"pod {key}: {err}")
        if pod is None:
            seen = "the pod (this UID) was not seen in the API yet" if gated else \
                "no filter call named it and the pod was not seen in the API"
            return refused("unknown_pod", f"pod {key} (uid {uid}) is unknown to vramfit: {seen}")
        assignment, via = planning.bind(self.shared, pod, node)
        if assignment is None:
            try:
                assignment = self.store.reserve(pod, node, self.shared.guarded)
            except NoFit as err:
                return refused("no_fit", str(err))
        return Promise(args, pod=pod, assignment=assignment, via=via)

    @asynccontextmanager
    async def turn(self, gate: AdmissionGate, args: wire.ExtenderBindingArgs) -> AsyncIterator[None]:
        """On the event loop, around the bind's thread: the promise (`promise`), then the node's turn at the
        gate (no thread held while it waits). A promise the thread never took (the caller went away) is
        released."""
        promise = self.promise(args)
        token = _PROMISE.set(promise)
        try:
            if promise.refusal is not None:
                yield
            else:
                async with gate.turn(args.Node, f"{args.PodNamespace}/{args.PodName}"):
                    yield
        finally:
            _PROMISE.reset(token)
            if not promise.taken and promise.pod is not None:
                self.store.release(promise.pod.uid)

    def _bind_refusal(self, key: str, uid: str) -> tuple[str, str] | None:
        """(metric label, reason) when this bind is not one the scheduler is making, else None."""
        seen = self.memory.recent(uid) if uid else None
        if seen is None:
            return "not_filtered", (f"pod {key} (uid {uid}) is unknown to vramfit: no filter call named it in the "
                                    f"last {self.memory.window_s:g} s, and vramfit binds only pods it filtered")
        scheduler, node = seen.scheduler, seen.node
        obj = self.store.pod_object(key)  # the watched object, when there is one, is the fresher word
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and str(meta.get("uid") or "") == uid:
            spec = obj.get("spec") if isinstance(obj, dict) else None
            spec = spec if isinstance(spec, dict) else {}
            scheduler, node = spec.get("schedulerName"), spec.get("nodeName")
        if node:
            return "already_bound", f"pod {key} is already bound to node {node}: only pending pods are bound"
        if scheduler is not None and not isinstance(scheduler, str):  # a forged filter's Pod: not hashable
            return "wrong_scheduler", f"pod {key}: spec.schedulerName is not a string ({type(scheduler).__name__})"
        if scheduler is not None and scheduler not in self.scheduler_names:
            return "wrong_scheduler", (f"pod {key} is for scheduler {scheduler!r}, not "
                                       f"{' or '.join(sorted(self.scheduler_names))}")
        return None

    def _write(self, promise: Promise, gated: tuple[AdmissionGate, Turn] | None) -> dict[str, str]:
        """Pass the gate (if any) and write the Binding of the promised units; never leaves them booked on
        failure, except where the API's answer is unknown."""
        pod, node, assignment, via = promise.pod, promise.args.Node, promise.assignment, promise.via
        assert pod is not None and assignment is not None
        ns, name, uid = promise.args.PodNamespace, promise.args.PodName, promise.args.PodUID
        key = f"{ns}/{name}"
        if gated is not None:
            gate, turn = gated
            gate.await_turn(turn, node, key)
            self._count_wait(turn)
            if turn.busy is not None:
                self.store.release(pod.uid)
                return self._bind_error("node_busy", turn.busy)
        resource_version = self.store.resource_version(key, pod.uid)  # read last: the freshest view
        try:
            self.binder.bind(ns, name, uid, resource_version, assignment)
        except BindOutcomeUnknown as err:
            # It may be bound: keep the units booked until its watch event confirms them or the booking expires.
            log.error("%s", err)
            return self._bind_error("api_unknown", str(err))
        except BindError as err:
            self.store.release(pod.uid)
            return self._bind_error("api_error", str(err))
        except Exception as err:  # noqa: BLE001 - never leave units booked after an unexpected failure
            self.store.release(pod.uid)
            log.exception("bind of %s failed", key)
            return self._bind_error("api_error", f"binding pod {key}: {type(err).__name__}: {err}")
        if gated is not None:
            gated[0].bound(node, key, pod.uid, seen=bool(resource_version))
        self.store.confirm(pod.uid)
        self.metrics.binds.labels("bound").inc()
        if via is not None:
            self.metrics.queue_binds.labels(via).inc()
        return wire.binding_result()

    def _count_wait(self, turn: Turn) -> None:
        if turn.released:
            self.metrics.stale_releases.inc(len(turn.released))
        if not turn.waited:
            return
        outcome = "busy" if turn.busy is not None else ("stale" if turn.released else "cleared")
        self.metrics.bind_waits.labels(outcome).inc()
        self.metrics.bind_wait_seconds.observe(turn.waited_s)

    def _bind_error(self, result: str, text: str) -> dict[str, str]:
        self.metrics.binds.labels(result).inc()
        return wire.binding_result(text)
