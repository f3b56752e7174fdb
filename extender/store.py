"""The extender's live view of the cluster: the core's `ClusterState` behind one lock.

Everything that changes the state goes through here: nodes and pods from list+watch (or a snapshot file),
and the bind path's reservations. Raw API objects are the only input, parsed by `packing.k8s.snapshot`, so a
restart rebuilds exactly the same state from the API (bound pods carry `vramfit.io/assignment`).

Reservations: bind chooses units and books them at once as a *reserved* holder (the next pod's filter may
arrive before the Binding is written). A reservation ends when the bind succeeds (confirmed), fails
(released), the pod is deleted or turns up bound elsewhere (released, the real holding is recorded), or
its TTL passes without any of these (released by `sweep`).

Conflicts: a pod bound to a node whose units cannot be recorded (they clash with another holder's, or are
not on the node, e.g. after a MIG re-partition) is never dropped. It is kept in `conflicted`, the units of it
that clash with nobody are booked for it, and it is reported once (`on_conflict`, e.g. a Warning Event).
Every update that frees units on its node records the node's pods again (`packing.k8s.snapshot.settle_node`) in
the same locked step, so a freed unit goes to the conflicted pod before any filter can see it free; the order
of that settling depends only on the pod objects, so a restart rebuilds the same holders and conflicts.

The bind gate (`extender.admission`) reads the watched pod objects of one node (`pods_on`) and waits on
`changed`, a Condition on the store's lock notified after every list and watch event, for the kubelet to
admit the pod ahead of it. `resource_version` is the last version of a pod the watch delivered: the
Binding's precondition.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from extender.dra.book import DraBook
from extender.queue import Entry, PendingQueue
from kubeio.reflector import DRA_KINDS
from packing import cycle, fit
from packing.catalog import Catalog
from packing.k8s.demand import (
    ANN_ASSIGNMENT,
    is_active,
    pod_demand,
    pod_key,
)
from packing.k8s.inventory import agent_absent
from packing.k8s.snapshot import (
    forget_pod,
    namespace_objects,
    pod_units,
    record_pod,
    remove_node,
    settle_node,
    split_objects,
    upsert_node,
)
from packing.k8s.trust import (
    ANN_SIGNATURE,
    NamespaceTenancy,
    PodTrust,
    SigningKeys,
    Tenancy,
    namespace_tenancy,
)
from packing.model import Assignment, GpuGrant, InputError, PodDemand
from packing.policies import Policy
from packing.state import ClusterState, PlacementError
from packing.vendors.nvidia.plugin_names import DEFAULT_DEVICE_PLUGIN_NAMES, DevicePluginNames

log = logging.getLogger("vramfit.store")

DEMAND_CACHE = 10_000  # pods seen in filter, kept for their bind (which carries no Pod object)
CONFLICT_REASON = "VramfitUnitConflict"  # the Event reason for a conflicted pod
EDIT_REASON = "VramfitRecordEdited"  # the Event reason for a bound pod whose assignment was changed
# What a bound pod's holding is read from and may not change once recorded: only vramfit's Binding writes them.
RECORD_ANNOTATIONS = (ANN_ASSIGNMENT, ANN_SIGNATURE)
PENDING_REPORTS = 1_000  # conflicts kept for an `on_conflict` not set yet (it is set after the first list)


DRA_NODE_REASON = ("node {node} is a DRA node: its GPUs are allocated to ResourceClaims (vramfit's DRA allocator), "
                   "not to vramfit.io/vram pods")


class NoFit(Exception):
    """The pod does not fit the chosen node (any more); the message is the core's reason."""


@dataclass(frozen=True)
class Reservation:
    uid: str
    pod: PodDemand
    assignment: Assignment
    deadline: float  # store clock


@dataclass(frozen=True)
class Conflict:
    """A pod bound to `node` whose holding cannot be recorded in full; `held` is what is recorded for it."""

    key: str
    uid: str
    node: str
    reason: str
    held: tuple[GpuGrant, ...]
    since: float  # store clock: when it became conflicted on this node
    edit: bool = False  # the pod's assignment (or its signature) was edited after it was recorded

    @property
    def event_reason(self) -> str:
        return EDIT_REASON if self.edit else CONFLICT_REASON

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def message(self) -> str:
        """The Event text: what clashes, and that none of it is offered to another pod meanwhile."""
        if self.edit:
            return (f"vramfit ignores a change to this pod on node {self.node}: {self.reason}. Only vramfit's "
                    "Binding writes a pod's assignment; the units recorded when it was bound stay booked for it.")
        return (f"vramfit cannot record the GPU units this pod holds on node {self.node}: {self.reason}. "
                "None of them is offered to another pod meanwhile; they are recorded for this pod as soon as "
                "the clash clears.")

    def to_json(self, now: float) -> dict[str, Any]:
        return {"pod": self.key, "uid": self.uid, "node": self.node, "reason": self.reason,
                "held": [g.to_json() for g in self.held], "for_s": round(now - self.since, 3), "edit": self.edit}


class _Reporter:
    """Hands new conflicts to `on_conflict` on a thread of its own: posting an Event is an API round trip,
    which must hold up neither the watch nor a filter holding the store's lock. Conflicts found before a
    callback is set (the first list runs before the binder exists) wait for it, up to PENDING_REPORTS."""

    def __init__(self) -> None:
        self._callback: Callable[[Conflict], None] | None = None
        self._pending: deque[Conflict] = deque(maxlen=PENDING_REPORTS)
        self._queue: queue.Queue[Conflict] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    @property
    def callback(self) -> Callable[[Conflict], None] | None:
        return self._callback

    @callback.setter
    def callback(self, fn: Callable[[Conflict], None] | None) -> None:
        with self._guard:
            self._callback = fn
            pending = list(self._pending) if fn is not None else []
            if fn is not None:
                self._pending.clear()
        for c in pending:
            self._enqueue(c)

    def report(self, conflict: Conflict) -> None:
        with self._guard:
            if self._callback is None:
                self._pending.append(conflict)
                return
        self._enqueue(conflict)

    def _enqueue(self, conflict: Conflict) -> None:
        with self._guard:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conflict-reports", daemon=True)
                self._thread.start()
        self._queue.put(conflict)

    def _run(self) -> None:
        while True:
            conflict = self._queue.get()
            try:
                fn = self._callback
                if fn is not None:
                    fn(conflict)
            except Exception:  # noqa: BLE001 - a report that fails must not stop the next ones
                log.exception("reporting the conflict of pod %s failed", conflict.key)
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued report was handed over; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True


class Store:
    def __init__(self, catalog: Catalog, *, relax_tenancy: bool = False, reservation_ttl_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic,
                 device_plugin_names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES,
                 on_conflict: Callable[[Conflict], None] | None = None,
                 signing_keys: SigningKeys | None = None,
                 serves: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        """`device_plugin_names`: the extended resources through which the device plugin hands out GPUs (see
        `packing.vendors.nvidia.plugin_names.DevicePluginNames`). `on_conflict`: called once for each pod that becomes conflicted
        or whose recorded assignment is edited (on a thread of the store's, never under its lock); may also be
        set later as `store.on_conflict`. `signing_keys`: a bound pod's assignment is booked only when signed
        with one of them (`packing.k8s.trust`); None books assignments as written (a snapshot, or a cluster
        run with `allow_unsigned`). `serves`: why a Node is not vramfit capacity, or None when it is
        (`agent_rule`); None counts every node (the what-if's and the tests' stores)."""
        self.lock = threading.RLock()
        self.catalog = catalog
        self.names = device_plugin_names
        self.ttl = reservation_ttl_s
        self.clock = clock
        self.state = ClusterState(relax_tenancy=relax_tenancy)
        self.generation = 0  # bumped on every change; with a pod shape it keys per-request caches
        # (node-set version, rows, name -> state row of the nodes vramfit.io/vram pods may use)
        self._index: tuple[int, int, dict[str, int]] = (-1, -1, {})
        self.node_set_version = 0
        self.reservations: dict[str, Reservation] = {}  # pod UID -> reservation
        self.bad_nodes: dict[str, str] = {}  # node name -> why its GPU description is unusable
        self.serves = serves
        self.unserved: dict[str, str] = {}  # node name -> why it is not vramfit capacity (no node agent there)
        self.warnings: deque[str] = deque(maxlen=500)
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self._on_node: dict[str, set[str]] = {}  # spec.nodeName -> keys of watched pods bound there
        # Notified (lock held) after every list and watch event: the bind gate waits on it.
        self.changed = threading.Condition(self.lock)
        self._waiting: dict[str, set[str]] = {}  # node name not (yet) known -> pods bound to it
        self._demands: OrderedDict[str, PodDemand] = OrderedDict()
        self._synced: set[str] = set()
        self.ready = False
        # Pods bound to a known node whose holding cannot be recorded in full: key -> conflict.
        self.conflicted: dict[str, Conflict] = {}
        self._conflicted_on: dict[str, set[str]] = {}  # node name -> keys of its conflicted pods
        self._reporter = _Reporter()
        self._reporter.callback = on_conflict
        self.keys = signing_keys
        # The namespaces' tenancy rules (rebuilt on every namespace event) and its version (keys demand caches).
        self.tenancy = Tenancy()
        self.tenancy_version = 0
        self._namespaces: dict[str, dict[str, Any]] = {}
        # A bound pod's record as first seen bound: key -> (uid, the RECORD_ANNOTATIONS values). Its holding is
        # read from these for the pod's life; a later edit is reported (`edited`), never followed.
        self._records: dict[str, tuple[str, tuple[Any, ...]]] = {}
        self.edited: dict[str, Conflict] = {}
        # The pending vramfit pods (extender.queue); the app narrows `queue.schedulers` in cluster mode.
        self.queue = PendingQueue()
        # DRA: ResourceSlices, DeviceClasses and claims (extender/dra/book.py), when DRA allocation is on.
        self.dra: DraBook | None = None
        self.required: set[str] = {"nodes", "pods"}  # the kinds listed before the store is ready

    def enable_dra(self, managed: Iterable[str]) -> DraBook:
        """Read DRA objects too; the store is ready once they are listed as well."""
        self.dra = DraBook(self.catalog, frozenset(managed), warn=self._warn)
        self.required |= set(DRA_KINDS)
        return self.dra

    @property
    def on_conflict(self) -> Callable[[Conflict], None] | None:
        return self._reporter.callback

    @on_conflict.setter
    def on_conflict(self, fn: Callable[[Conflict], None] | None) -> None:
        self._reporter.callback = fn

    @property
    def trust(self) -> PodTrust:
        """How pod objects are read: the namespaces' tenancy rules and the signing keys."""
        return PodTrust(self.tenancy, self.keys)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_objects(cls, objs: Iterable[Any], catalog: Catalog, **kwargs: Any) -> Store:
        """A ready store from Node and Pod objects (snapshot file, tests)."""
        store = cls(catalog, **kwargs)
        objs = list(objs)
        nodes, pods = split_objects(objs, "snapshot")
        store.replace("namespaces", namespace_objects(objs))
        store.replace("nodes", nodes)
        store.replace("pods", pods)
        return store

    def not_served_reason(self, name: str) -> str:
        """Why a node the rule does not serve takes no vramfit pod (filter's and bind's words)."""
        return (f"node {name} is not vramfit capacity: {self.unserved.get(name, 'not served')} (config "
                "nodes_without_agent names nodes to count all the same)")

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        log.warning("%s", text)

    def _changed(self) -> None:
        self.generation += 1

    # ---- ClusterSink: list+watch ----------------------------------------------------------------
    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        """A full list of one kind: the state becomes exactly this (reservations of live pods survive)."""
        with self.lock:
            if kind == "nodes":
                names = {str((o.get("metadata") or {}).get("name")) for o in items}
                for name in [n for n in self._nodes if n not in names]:
                    self._remove_node(name)
                for obj in items:
                    self._sync_node(obj)
            elif kind == "pods":
                keys = set()
                for obj in items:
                    try:
                        keys.add(pod_key(obj))
                    except InputError:
                        continue
                for key in [k for k in self._pods if k not in keys]:
                    self._forget_pod(key)
                for obj in items:
                    self._sync_pod(obj)
                if self.dra is not None:
                    self.dra.version += 1
            elif kind == "namespaces":
                self._namespaces = {_name_of(o): o for o in items if _name_of(o)}
                self._sync_tenancy(first="namespaces" not in self._synced)
            elif kind in DRA_KINDS and self.dra is not None:
                self._dra_event(kind, lambda book: book.replace(kind, items, self.state, self._nodes, self.tenancy))
            else:
                raise ValueError(f"unknown kind {kind!r}")
            self._synced.add(kind)
            self.ready = self.required <= self._synced
            self._changed()
            self.changed.notify_all()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED)."""
        with self.lock:
            try:
                if self._apply(kind, event_type, obj):
                    self._changed()
                if kind == "pods" and self.dra is not None and _uses_claims(obj):
                    self.dra.version += 1  # the DRA allocator's wake-up: only pods with claims concern it
            finally:
                # Also for events that leave the placement alone: a pod's status.startTime (the kubelet
                # admitted it) changes nothing vramfit accounts for, but a bind may be waiting for it.
                self.changed.notify_all()

    def _apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> bool:
        """Apply one event (lock held); False when nothing the placement reads has changed."""
        if kind == "nodes":
            name = str((obj.get("metadata") or {}).get("name"))
            if event_type == "DELETED":
                self._remove_node(name)
            elif event_type == "MODIFIED" and _same_inputs(_node_inputs, self._nodes.get(name), obj):
                self._nodes[name] = obj  # a status heartbeat: nothing vramfit reads has changed
                return False
            else:
                self._sync_node(obj)
        elif kind == "pods":
            try:
                key = pod_key(obj)
            except InputError as err:
                self._warn(str(err))
                return False
            if event_type == "DELETED":
                self._forget_pod(key)
            elif event_type == "MODIFIED" and _same_inputs(_pod_inputs, self._pods.get(key), obj):
                self._put_pod(key, obj)  # e.g. container status: the pod holds what it held
                return False
            else:
                self._sync_pod(obj)
        elif kind == "namespaces":
            return self._apply_namespace(event_type, obj)
        elif kind in DRA_KINDS and self.dra is not None:
            self._dra_event(kind, lambda book: book.apply(kind, event_type, obj, self.state, self._nodes,
                                                          self.tenancy))
        return True

    def _apply_namespace(self, event_type: str, obj: dict[str, Any]) -> bool:
        name = _name_of(obj)
        old = self._namespaces.get(name)
        if event_type == "DELETED":
            self._namespaces.pop(name, None)
        elif name:
            self._namespaces[name] = obj
            if old is not None and _namespace_inputs(old) == _namespace_inputs(obj):
                return False  # nothing the tenancy rules read has changed
        self._sync_tenancy()
        return True

    def _dra_event(self, kind: str, change: Callable[[DraBook], None]) -> None:
        """A DRA list or event (lock held); nodes that stop being DRA nodes go back to their Node object's GPUs."""
        assert self.dra is not None
        before = set(self.dra.inventory.nodes)
        rows = len(self.state)
        change(self.dra)
        if before != set(self.dra.inventory.nodes) or rows != len(self.state):
            self.node_set_version += 1
        for name in sorted(before - set(self.dra.inventory.nodes)):
            obj = self._nodes.get(name)
            if obj is not None:
                self._sync_node(obj)

    # ---- namespaces: who may name which tenant ------------------------------------------------------
    def _sync_tenancy(self, first: bool = False) -> None:
        """Rebuild `tenancy` from the watched Namespaces and re-read the pending pods' demands with it (lock
        held). Held pods are not settled again, except on the first list (their pods may have been listed first,
        read with no namespace rules): their units stay, only the tenant they count under follows the rules."""
        rules: dict[str, NamespaceTenancy] = {}
        for name in sorted(self._namespaces):
            try:
                ns_name, ns_rules = namespace_tenancy(self._namespaces[name])
            except InputError as err:
                self._warn(f"{err}: the namespace allows no tenant but its own name")
                continue
            rules[ns_name] = ns_rules
        self.tenancy = Tenancy(rules)
        self.tenancy_version += 1
        for key, obj in self._pods.items():
            if not _node_of(obj):
                self.queue.observe(key, obj, self.tenancy)
        if first and "pods" in self._synced:
            for node_name in sorted(self._on_node):
                self._settle(node_name)

    def _sync_node(self, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        known = self.state.has_node(name)
        if self.dra is not None and self.dra.owns(name):
            # Its GPUs are its ResourceSlices' devices (no vramfit node agent runs there); the Node object gives
            # the host side only.
            self._nodes[name] = obj
            self.unserved.pop(name, None)
            self.bad_nodes.pop(name, None)
            self.dra.sync_host(name, self.state, obj)
            if not known:
                self.node_set_version += 1
            return
        why_not = self.serves(obj) if self.serves is not None else None
        if why_not is not None:
            # kube-scheduler never offers vramfit pods this node: counting it would promise capacity nobody gets.
            self.unserved[name] = why_not
            self.bad_nodes.pop(name, None)
            if known:
                self.node_set_version += 1
                self._evict_node(name)
            self._nodes[name] = obj
            return
        self.unserved.pop(name, None)
        try:
            result = upsert_node(self.state, obj, self.catalog, self.names)
        except InputError as err:
            # A node whose GPU description is broken cannot be used; say why on every filter.
            self.bad_nodes[name] = str(err)
            self._warn(str(err))
            if self.state.has_node(name):
                self.node_set_version += 1
                self._evict_node(name)
            self._nodes[name] = obj
            return
        for w in result.warnings:
            self._warn(w)
        self.bad_nodes.pop(name, None)
        self._nodes[name] = obj
        if not known:
            self.node_set_version += 1
            for key in sorted(self._waiting.pop(name, set())):
                pod = self._pods.get(key)
                if pod is not None:
                    self._sync_pod(pod)
        elif result.displaced or name in self._conflicted_on:
            # Holders that no longer fit (a MIG re-partition) become conflicted, and a node that changed may now
            # hold what a conflicted pod asks: settle the node's pods in their canonical order.
            self._settle(name)

    def _remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)
        if self.dra is not None and self.dra.owns(name):
            if self.state.has_node(name):
                self.dra.sync_host(name, self.state, None)  # the devices stay while their slices do
            return
        self.bad_nodes.pop(name, None)
        self.unserved.pop(name, None)
        if self.state.has_node(name):
            self.node_set_version += 1  # rows move when a node leaves
            self._evict_node(name)

    def _evict_node(self, name: str) -> None:
        """The node leaves the state (deleted, or its description became unusable): its pods, holders and
        conflicted alike, wait for it to come back, to be recorded then (lock held)."""
        keys = remove_node(self.state, name)
        keys.extend(sorted(self._conflicted_on.get(name, ())))
        for key in keys:
            self._drop_record(key)
            self._clear_conflict(key)
            if key in self._pods:  # still bound there: record it if the node comes back
                self._waiting.setdefault(name, set()).add(key)

    def _sync_pod(self, obj: dict[str, Any]) -> None:
        try:
            key = pod_key(obj)
        except InputError as err:
            self._warn(str(err))
            return
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        node_name = _node_of(obj)
        before = self._recorded_on(key)
        self._put_pod(key, obj)
        held = self.state.holder(key)
        if held is not None and held.reserved:
            # Re-created under the same name, or bound somewhere other than we reserved: the reservation is void.
            if (uid and held.pod.uid and uid != held.pod.uid) or (node_name and node_name != held.assignment.node):
                self._release_reserved(key)
        try:
            result = record_pod(self.state, self._record_view(key, obj), self.names, self.trust)
        except InputError as err:
            self._warn(f"cannot account for pod {key}: {err}")
            return
        for w in result.warnings:
            self._warn(w)
        if node_name and is_active(obj) and not self.state.has_node(node_name):
            self._waiting.setdefault(node_name, set()).add(key)
        h = self.state.holder(key)
        if h is not None and not h.reserved:
            # Bound where we reserved it (record_pod confirmed), or recorded from the API.
            self._drop_record(key)
        settled = ""
        if result.unrecorded is not None:
            # A clash: who holds the unit is decided by the canonical order, not by which event came first.
            settled = result.unrecorded.node
            self._settle(settled)
        for name in dict.fromkeys((before, node_name)):
            if name and name != settled and name in self._conflicted_on:
                self._settle(name)  # this pod freed units there, or is (was) conflicted there

    def _record_view(self, key: str, obj: dict[str, Any], report: bool = True) -> dict[str, Any]:
        """The pod object as its holding is read: a bound pod's assignment and signature as first seen bound
        (lock held). The first sight of a bound pod (UID) is its Binding, which writes them in the same update
        that binds it; a later change is someone else's edit: reported, and the units recorded stay booked."""
        meta = obj.get("metadata")
        if not is_active(obj) or not isinstance(meta, dict):
            if report:
                self._records.pop(key, None)
                self._clear_edit(key)
            return obj
        uid = str(meta.get("uid") or "")
        annotations = meta.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        now = tuple(annotations.get(a) for a in RECORD_ANNOTATIONS)
        first = self._records.get(key)
        if first is None or first[0] != uid:  # a new pod, or one re-created under the same name
            self._records[key] = (uid, now)
            self._clear_edit(key)
            return obj
        if now == first[1]:
            if report:
                self._clear_edit(key)
            return obj
        if report:
            self._report_edit(key, uid, obj, first[1], now)
        kept = {k: v for k, v in annotations.items() if k not in RECORD_ANNOTATIONS}
        kept.update({a: v for a, v in zip(RECORD_ANNOTATIONS, first[1], strict=True) if v is not None})
        return {**obj, "metadata": {**meta, "annotations": kept}}

    def _report_edit(self, key: str, uid: str, obj: dict[str, Any], was: tuple[Any, ...],
                     now: tuple[Any, ...]) -> None:
        changed = [a for a, old, new in zip(RECORD_ANNOTATIONS, was, now, strict=True) if old != new]
        reason = (f"metadata.annotations[{', '.join(changed)}] changed after the pod was bound "
                  f"(assignment {_short(now[0])}, was {_short(was[0])}); the change is ignored")
        old = self.edited.get(key)
        if old is not None and old.reason == reason:
            return
        node = _node_of(obj)
        conflict = Conflict(key, uid, node, reason, tuple(pod_units(self.state, key)), self.clock(), edit=True)
        self.edited[key] = conflict
        self._warn(f"pod {key} on {node}: {reason}; its recorded units stay booked")
        self._reporter.report(conflict)

    def _clear_edit(self, key: str) -> None:
        self.edited.pop(key, None)

    def edited_view(self) -> list[dict[str, Any]]:
        """Bound pods whose assignment was edited after vramfit recorded it (for `/state`)."""
        with self.lock:
            now = self.clock()
            return [self.edited[k].to_json(now) for k in sorted(self.edited)]

    def _recorded_on(self, key: str) -> str:
        """The node a pod holds units on, or is conflicted on; "" when neither."""
        h = self.state.holder(key)
        if h is not None:
            return h.assignment.node
        c = self.conflicted.get(key)
        return c.node if c is not None else ""

    # ---- conflicts ------------------------------------------------------------------------------
    def _settle(self, node_name: str) -> None:
        """Record the pods bound to a node afresh in their canonical order; update its conflicts (lock held).

        Runs in the same locked update as the change that freed units, so a unit a conflicted pod holds in
        truth is never seen free in between."""
        if not self.state.has_node(node_name):
            return
        keys = sorted(self._on_node.get(node_name, ()))
        settled = settle_node(self.state, node_name, [self._record_view(k, self._pods[k], report=False) for k in keys],
                              self.names, self.trust)
        for err in settled.errors:
            log.debug("settling %s: %s", node_name, err)  # warned when the pod's event arrived
        found = {u.key: u for u in settled.unrecorded}
        for key in sorted(self._conflicted_on.get(node_name, set()) - found.keys()):
            self._clear_conflict(key)
            if self.state.holder(key) is not None:
                log.info("pod %s on %s: its units are recorded again (the clash cleared)", key, node_name)
        for u in settled.unrecorded:
            old = self.conflicted.get(u.key)
            fresh = old is None or old.node != u.node
            since = self.clock() if old is None or fresh else old.since
            self._clear_conflict(u.key)
            conflict = Conflict(u.key, u.uid, u.node, u.reason, u.held, since)
            self.conflicted[u.key] = conflict
            self._conflicted_on.setdefault(u.node, set()).add(u.key)
            if fresh:
                self._warn(f"pod {u.key} on {u.node}: cannot record what it holds ({u.reason}); kept as "
                           "conflicted, its units offered to no other pod")
                self._reporter.report(conflict)
        for key in keys:
            h = self.state.holder(key)
            if h is not None and not h.reserved:
                self._drop_record(key)  # a reservation bound here is now recorded from the API

    def _clear_conflict(self, key: str) -> None:
        c = self.conflicted.pop(key, None)
        if c is not None:
            keys = self._conflicted_on.get(c.node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._conflicted_on[c.node]

    def _after_release(self, node_name: str) -> None:
        """Units on the node were freed: a conflicted pod there may now be recorded (lock held)."""
        if node_name in self._conflicted_on:
            self._settle(node_name)

    def conflicted_view(self) -> list[dict[str, Any]]:
        """The conflicted pods for `/state`: pod, uid, node, reason, the units held meanwhile, for how long."""
        with self.lock:
            now = self.clock()
            return [self.conflicted[k].to_json(now) for k in sorted(self.conflicted)]

    def waiting_view(self) -> dict[str, list[str]]:
        """Pods bound to a node vramfit does not know (yet), by node: recorded when it appears."""
        with self.lock:
            return {node: sorted(keys) for node, keys in sorted(self._waiting.items()) if keys}

    def _put_pod(self, key: str, obj: dict[str, Any]) -> None:
        """Record the watched object, keeping the node index in step (a pod moves from "" to a node once)."""
        old = self._pods.get(key)
        if old is not None:
            self._unindex(key, _node_of(old))
        self._pods[key] = obj
        self.queue.observe(key, obj, self.tenancy)
        node_name = _node_of(obj)
        if node_name:
            self._on_node.setdefault(node_name, set()).add(key)

    def _unindex(self, key: str, node_name: str) -> None:
        keys = self._on_node.get(node_name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._on_node[node_name]

    def _forget_pod(self, key: str) -> None:
        before = self._recorded_on(key)
        obj = self._pods.pop(key, None)
        self.queue.drop(key)
        if obj is not None:
            node_name = _node_of(obj)
            self._unindex(key, node_name)
            self._waiting.get(node_name, set()).discard(key)
        forget_pod(self.state, key)
        self._drop_record(key)
        self._clear_conflict(key)
        self._records.pop(key, None)
        self._clear_edit(key)
        if before:
            self._after_release(before)  # the same update: what it held goes to a conflicted pod first

    # ---- reservations ---------------------------------------------------------------------------
    def _drop_record(self, key: str) -> None:
        for uid, r in list(self.reservations.items()):
            if r.pod.key == key:
                del self.reservations[uid]

    def _release_reserved(self, key: str) -> None:
        h = self.state.holder(key)
        if h is not None and h.reserved:
            self.state.release(key)
        self._drop_record(key)
        if h is not None and h.reserved:
            self._after_release(h.assignment.node)  # a conflicted pod may have waited for these units

    def reserve(self, pod: PodDemand, node_name: str, policy: Policy) -> Assignment:
        """Choose the pod's units on `node_name` by the core cycle's rule (`packing.cycle.choose_and_commit`: the
        policy's units, else the core's best fit) and book them now (reserved)."""
        with self.lock:
            self.sweep()
            if node_name in self.bad_nodes:
                raise NoFit(self.bad_nodes[node_name])
            if node_name in self.unserved:
                raise NoFit(self.not_served_reason(node_name))
            if self.is_dra_node(node_name):
                raise NoFit(DRA_NODE_REASON.format(node=node_name))
            if not self.state.has_node(node_name):
                raise NoFit(f"node {node_name} is not known to vramfit")
            # Decide with the cycle's rule, book here: a refusal must carry allocate's own words.
            assignment = cycle.choose_and_commit(self.state, pod, policy, self.state.index_of(node_name),
                                                 commit=False)
            if assignment is None:
                reason = fit.explain(self.state, node_name, pod, policy.whole_gpu).reason
                raise NoFit(f"pod {pod.key} no longer fits {node_name}: {reason}")
            return self._book(pod, assignment)

    def reserve_assignment(self, pod: PodDemand, assignment: Assignment) -> Assignment:
        """Book given units (a plan's, `packing.planning.follow`) for the pod now (reserved); NoFit when they no longer
        pass `ClusterState.allocate`."""
        with self.lock:
            self.sweep()
            if assignment.node in self.bad_nodes:
                raise NoFit(self.bad_nodes[assignment.node])
            return self._book(pod, assignment)

    def _book(self, pod: PodDemand, assignment: Assignment) -> Assignment:
        """Reserve the units (the lock held): allocate's refusal becomes NoFit in its own words."""
        try:
            self.state.allocate(pod, assignment, reserved=True)
        except PlacementError as err:
            raise NoFit(str(err)) from None
        self.reservations[pod.uid] = Reservation(pod.uid, pod, assignment, self.clock() + self.ttl)
        self._changed()
        return assignment

    def queued(self) -> list[Entry]:
        """The pending queue as the planner reads it (`extender.queue.PendingQueue.read`)."""
        with self.lock:
            return self.queue.read(self.state)

    def confirm(self, uid: str) -> None:
        """The Binding was created: the units are simply held now."""
        with self.lock:
            r = self.reservations.pop(uid, None)
            if r is not None:
                self.state.confirm(r.pod.key)
                self._changed()

    def release(self, uid: str) -> None:
        """The bind failed: give the units back."""
        with self.lock:
            r = self.reservations.get(uid)
            if r is not None:
                self._release_reserved(r.pod.key)
                self._changed()

    def sweep(self) -> list[str]:
        """Drop reservations past their deadline; returns the pod keys released."""
        if not self.reservations:
            return []
        with self.lock:
            now = self.clock()
            expired = [r for r in self.reservations.values() if r.deadline <= now]
            for r in expired:
                self._warn(f"reservation of {r.pod.key} on {r.assignment.node} expired unbound")
                self._release_reserved(r.pod.key)
            if expired:
                self._changed()
            return [r.pod.key for r in expired]

    # ---- pods for bind --------------------------------------------------------------------------
    def remember(self, pod: PodDemand) -> bool:
        """Keep a filtered pod's demand for its bind (which carries only name, namespace, UID).

        Returns True the first time this pod (UID) is seen."""
        if not pod.uid:
            return False
        with self.lock:
            new = pod.uid not in self._demands
            self._demands[pod.uid] = pod
            self._demands.move_to_end(pod.uid)
            while len(self._demands) > DEMAND_CACHE:
                self._demands.popitem(last=False)
            return new

    def node_index(self) -> dict[str, int]:
        """Node name -> state row of the nodes `vramfit.io/vram` pods may use (DRA nodes' GPUs go to claims only),
        rebuilt only when the node set changes (call with the lock held)."""
        version, rows, index = self._index
        if version != self.node_set_version or rows != len(self.state):
            index = {name: i for i, name in enumerate(self.state.node_names) if not self.is_dra_node(name)}
            self._index = (self.node_set_version, len(self.state), index)
        return index

    def is_dra_node(self, name: str) -> bool:
        return self.dra is not None and self.dra.owns(name)

    def demand_for(self, namespace: str, name: str, uid: str, watched_only: bool = False) -> PodDemand | None:
        """The demand of the pod a bind names: from the watched pod object (same UID) when there is one, else,
        unless `watched_only` (a live cluster, where every pod is watched), from its filter call. A filter's
        demand that disagrees with the watched pod is ignored: a filter call's Pod is whatever its caller sent.

        Raises InputError when the watched pod's fields are malformed or name a tenant its namespace does not
        allow."""
        key = f"{namespace}/{name}"
        with self.lock:
            filtered = self._demands.get(uid)
            obj = self._pods.get(key)
            tenancy = self.tenancy
            queued = self.queue.entries.get(key)  # a pending pod's demand, read from `obj` when it was recorded
        if filtered is not None and filtered.key != key:
            filtered = None
        if obj is not None and (not uid or str((obj.get("metadata") or {}).get("uid") or "") == uid):
            watched = queued.pod if queued is not None else pod_demand(obj, tenancy)
            if filtered is not None and filtered != watched:
                log.warning("bind of pod %s: its filter call's Pod asked for %s, the watched pod for %s; "
                            "the watched pod's demand is used", key, _shape_text(filtered), _shape_text(watched))
            return watched
        return None if watched_only else filtered

    def pod_items(self) -> list[tuple[str, dict[str, Any]]]:
        """Every watched pod as (key, object) (lock held by the caller)."""
        return list(self._pods.items())

    def pod_object(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self._pods.get(key)

    def resource_version(self, key: str, uid: str = "") -> str:
        """The resourceVersion of the pod as the watch last delivered it; "" when unknown (not seen, or the
        watched pod under that name has another UID: the Binding then carries the UID precondition only)."""
        with self.lock:
            meta = (self._pods.get(key) or {}).get("metadata") or {}
        if uid and str(meta.get("uid") or "") != uid:
            return ""
        return str(meta.get("resourceVersion") or "")

    def pods_on(self, node_name: str) -> list[dict[str, Any]]:
        """The watched pod objects bound to a node (any scheduler's), as the API sent them."""
        with self.lock:
            return [self._pods[k] for k in sorted(self._on_node.get(node_name, ()))]


def agent_rule(nodes_without_agent: Iterable[str] = ()) -> Callable[[dict[str, Any]], str | None]:
    """The live extender's rule for which nodes are vramfit capacity: those the node agent serves
    (`packing.k8s.inventory.agent_absent`), and those the config names (`nodes_without_agent`)."""
    named = frozenset(nodes_without_agent)

    def why_not(obj: dict[str, Any]) -> str | None:
        return None if _name_of(obj) in named else agent_absent(obj)

    return why_not


def _uses_claims(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, dict) and bool(spec.get("resourceClaims"))


def _node_of(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _namespace_inputs(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What `packing.k8s.trust.namespace_tenancy` reads of a Namespace."""
    meta = obj.get("metadata") or {}
    return (meta.get("labels"), meta.get("annotations")) if isinstance(meta, dict) else (None, None)


def _short(value: Any, limit: int = 120) -> str:
    text = "none" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape_text(pod: PodDemand | None) -> str:
    if pod is None:
        return "no VRAM"
    return (f"{pod.vram_mib} MiB x {pod.gpu_count} GPU(s), isolation {pod.isolation.value}, tenant {pod.tenant}, "
            f"models {sorted(pod.models) if pod.models else 'any'}")


def _node_inputs(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What `packing.k8s.inventory.node_from_k8s` reads of a Node (its conditions' heartbeats are not among it)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return (meta.get("labels"), meta.get("annotations"), status.get("allocatable"), status.get("capacity"))


def _pod_inputs(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What decides a pod's demand and holding: identity, labels/annotations, spec, phase."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return (meta.get("uid"), meta.get("labels"), meta.get("annotations"), obj.get("spec"), status.get("phase"))


def _same_inputs(inputs: Callable[[dict[str, Any]], tuple[Any, ...]], old: dict[str, Any] | None,
                 new: dict[str, Any]) -> bool:
    return old is not None and inputs(old) == inputs(new)
