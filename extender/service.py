"""The four extender verbs on the live store. Every placement rule comes from `packing`.

Filter and prioritize of one scheduling cycle ask the same question of the same state; the feasibility
mask and policy scores are cached per (pod shape, store generation) so the second call is a lookup, and
per-node reasons per (pod shape, node, node version) so a busy node is explained once, not every cycle.

Bind on a live cluster goes through the binder's admission gate (`extender.admission`): one bind per node at
a time, and none while the node's previous pod is still allocating and not admitted by its kubelet.

Nothing a request teaches can break a later one: a pod is checked against what the cluster could ever hold
(`DemandLimits`) before it is remembered or learnt from, and the policy is `Guarded` (its failure costs the
pod its polish, best-fit units or neutral scores, never the verb). Bind places only pods that are pending for
vramfit's scheduler and that a filter call named within `bind_filter_window_s`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
from prometheus_client import Counter

from extender import wire
from extender.admission import AdmissionGate, Turn
from extender.binder import Binder, BindError, BindOutcomeUnknown
from extender.metrics import Metrics
from extender.store import NoFit, Store
from packing import fit
from packing.catalog import Catalog
from packing.k8s.demand import ANN_GPUS, MAX_GPUS_PER_POD, VRAM_RESOURCE, pod_demand
from packing.model import InputError, Node, PodDemand
from packing.modes import UNLIMITED
from packing.policies import Guarded, Policy
from packing.state import ClusterState, PlacementError

log = logging.getLogger("vramfit.extender")

EXPLAIN_LIMIT = 16  # per request: detailed core reasons; beyond it a vectorised summary reason
CACHE_SHAPES = 256
# Per-node reasons are explained for the first EXPLAIN_LIMIT nodes of a call: enough for every cached shape a few
# node versions over (100,000 held ~45 MiB under a flood of one-off shapes).
CACHE_REASONS = CACHE_SHAPES * EXPLAIN_LIMIT * 4
# Pod demands by Pod object: the sum of the cached objects' JSON sizes stays within this (a count alone let
# 130 pods of 16 MiB hold 2 GiB), and the entries within a count (tiny pods, a flood of distinct ones).
CACHE_DEMAND_BYTES = 64 * 2**20
CACHE_DEMANDS = 4096
FILTERED_MAX = 50_000  # pod UIDs remembered as filtered (bind's check); older ones also age out
# API limits on names (a pod beyond them cannot exist; its strings would sit in every cache key).
MAX_NAME = 253  # a DNS subdomain: pod names, GPU products
MAX_LABEL = 63  # namespaces, label values (the tenant)
MAX_UID = 128
MAX_MODELS = 64


@dataclass
class _Eval:
    generation: int
    mask: fit.FeasibleMask
    scores: np.ndarray | None = None
    largest: np.ndarray | None = None  # [N] largest free unit per node (summary reasons)


@dataclass(frozen=True)
class DemandLimits:
    """The largest pod vramfit considers, from the catalog and the nodes it knows: a bigger one fits nowhere,
    so it is refused before anything remembers or learns from it (its numbers could only overflow later)."""

    vram_mib: int  # largest GPU: any catalog model's memory, or a known node's GPU (an unlisted product)
    gpus: int  # most GPUs on one known node (the per-pod maximum while no node is known)
    cpu_milli: int  # largest allocatable CPU of a known node (untracked counts as unlimited, 2^40)
    memory_mib: int

    @staticmethod
    def of(catalog: Catalog, state: ClusterState) -> DemandLimits:
        """Lock held (reads the state's arrays)."""
        largest_model = max((m.memory_mib for m in catalog.models.values()), default=0)
        if len(state) == 0:
            return DemandLimits(largest_model, MAX_GPUS_PER_POD, UNLIMITED, UNLIMITED)
        present = state.present
        node_gpu = int(state.mem[present].max()) if present.any() else 0
        return DemandLimits(vram_mib=max(largest_model, node_gpu), gpus=int(present.sum(axis=1).max()),
                            cpu_milli=int(state.cpu_cap.max()), memory_mib=int(state.memcap.max()))

    def check(self, pod: PodDemand) -> None:
        """Raise InputError naming the first bound the pod exceeds."""
        _check_names(pod)
        who = f"pod {pod.key}"
        if pod.gpu_count and pod.vram_mib > self.vram_mib:
            raise InputError(who, f"resources[{VRAM_RESOURCE}]", f"{pod.vram_mib} MiB per GPU is more than any GPU "
                             f"has (the largest known: {self.vram_mib} MiB)")
        if pod.gpu_count > self.gpus:
            raise InputError(who, f"metadata.annotations[{ANN_GPUS}]", f"{pod.gpu_count} GPUs is more than any "
                             f"node has (the most on one node: {self.gpus})")
        if pod.cpu_milli > self.cpu_milli:
            raise InputError(who, "resources[cpu]", f"{pod.cpu_milli}m CPU is more than any node has "
                             f"(the largest allocatable: {self.cpu_milli}m)")
        if pod.memory_mib > self.memory_mib:
            raise InputError(who, "resources[memory]", f"{pod.memory_mib} MiB of memory is more than any node has "
                             f"(the largest allocatable: {self.memory_mib} MiB)")


def _check_names(pod: PodDemand) -> None:
    namespace, _, name = pod.key.partition("/")
    who = f"pod {pod.key[:80]}"
    for field_name, value, limit in (("metadata.name", name, MAX_NAME), ("metadata.namespace", namespace, MAX_LABEL),
                                     ("metadata.uid", pod.uid, MAX_UID), ("tenant", pod.tenant, MAX_LABEL)):
        if len(value) > limit:
            raise InputError(who, field_name, f"{len(value)} characters, more than the API allows ({limit})")
    if pod.models and (len(pod.models) > MAX_MODELS or max(map(len, pod.models)) > MAX_NAME):
        raise InputError(who, "metadata.annotations[vramfit.io/gpu-models]",
                         f"at most {MAX_MODELS} products of at most {MAX_NAME} characters")


@dataclass(frozen=True, slots=True)
class _Filtered:
    """What bind needs to know of a pod a filter call named."""

    at: float  # monotonic clock
    scheduler: object  # the filter's Pod spec.schedulerName (None when absent)
    node: object  # its spec.nodeName


class _DemandCache:
    """PodDemand (or None: not a vramfit pod) per Pod object, LRU within a byte and an entry budget."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._items: OrderedDict[object, tuple[PodDemand | None, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: object) -> tuple[bool, PodDemand | None]:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return False, None
            self._items.move_to_end(key)
            return True, hit[0]

    def put(self, key: object, demand: PodDemand | None, size: int) -> None:
        if size > self.max_bytes:
            return  # one object over the whole budget is parsed each time rather than evict everything
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = (demand, size)
            self.bytes += size
            while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped


def _demand_key(pod_obj: dict[str, Any]) -> tuple[str, ...] | None:
    """(uid, resourceVersion, namespace, name) of a Pod object, or None when it lacks either. The API server
    gives every change of an object a new resourceVersion, so the pair names one content."""
    meta = pod_obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if not (isinstance(uid, str) and uid and isinstance(rv, str) and rv):
        return None
    return uid, rv, str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Extender:
    def __init__(self, store: Store, binder: Binder, policy: Policy, metrics: Metrics, *,
                 scheduler_names: Iterable[str] = ("vramfit-scheduler",), filter_window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.binder = binder
        self.policy = policy  # as configured; every call goes through `_policy`, which survives its failures
        self.metrics = metrics
        self.policy_errors = Counter("vramfit_policy_errors_total",
                                     "Policy calls that raised and were answered by the fallback (score: neutral "
                                     "scores; choose: best-fit units; observe: not learnt)",
                                     ["call"], registry=metrics.registry)
        self._policy = Guarded(policy, self._policy_failed)
        self._failed_kinds: set[tuple[str, str]] = set()
        self.scheduler_names = frozenset(scheduler_names)
        self.filter_window_s = filter_window_s
        self.clock = clock
        self._filtered: OrderedDict[str, _Filtered] = OrderedDict()
        self._filtered_lock = threading.Lock()
        self._limits: tuple[int, DemandLimits] | None = None
        self._evals: OrderedDict[tuple[object, ...], _Eval] = OrderedDict()
        self._reasons: OrderedDict[tuple[object, ...], str] = OrderedDict()
        self._names: list[tuple[int, list[str], np.ndarray, np.ndarray]] = []
        self._never: OrderedDict[tuple[object, ...], tuple[np.ndarray, dict[str, str]]] = OrderedDict()
        self._prefix_key: tuple[int, int] | None = None
        self.demands = _DemandCache(CACHE_DEMAND_BYTES, CACHE_DEMANDS)
        self._fit_count = metrics.filter_nodes.labels("fit")  # children bound once: labels() is a lookup
        self._full_count = metrics.filter_nodes.labels("full")
        self._never_count = metrics.filter_nodes.labels("never")
        self._prefix_table = np.zeros(0, dtype=object)

    def _demand(self, pod_obj: dict[str, Any]) -> PodDemand | None:
        """`pod_demand` of a Pod object, within `DemandLimits`; raises InputError for a malformed or impossible
        pod. Cached by uid + resourceVersion (a hash of the JSON without them): filter and prioritize of one
        cycle, and every retry of an unschedulable pod, send the same Pod, and parsing its quantities and
        annotations is a tenth of a millisecond each time. A malformed pod is not cached (it raises). The
        limits are checked on every call: they follow the nodes."""
        key: object = _demand_key(pod_obj)
        encoded: bytes | None = None
        if key is None:
            encoded = wire.dumps(pod_obj)
            key = hashlib.blake2b(encoded, digest_size=16).digest()
        hit, pod = self.demands.get(key)
        if not hit:
            pod = pod_demand(pod_obj)
            size = len(encoded if encoded is not None else wire.dumps(pod_obj))
            self.demands.put(key, pod, size)
        if pod is not None:
            self._demand_limits().check(pod)
        return pod

    def _demand_limits(self) -> DemandLimits:
        gen = self.store.generation
        cached = self._limits
        if cached is not None and cached[0] == gen:
            return cached[1]
        with self.store.lock:
            gen = self.store.generation
            limits = DemandLimits.of(self.store.catalog, self.store.state)
        self._limits = (gen, limits)
        return limits

    def _policy_failed(self, call: str, pod: PodDemand, err: Exception) -> None:
        self.policy_errors.labels(call).inc()
        kind = (call, type(err).__name__)
        first = kind not in self._failed_kinds  # the traceback once per kind: the same failure may repeat per pod
        self._failed_kinds.add(kind)
        log.error("policy %s: %s failed for pod %s (%s: %s); answered by the fallback", self.policy.name, call,
                  pod.key, type(err).__name__, err, exc_info=err if first else None)

    # ---- bind's memory of filter calls --------------------------------------------------------------
    def _note_filtered(self, pod: PodDemand, pod_obj: dict[str, Any]) -> None:
        if not pod.uid:
            return
        spec = pod_obj.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        now = self.clock()
        with self._filtered_lock:
            self._filtered[pod.uid] = _Filtered(now, spec.get("schedulerName"), spec.get("nodeName"))
            self._filtered.move_to_end(pod.uid)
            horizon = now - self.filter_window_s
            while self._filtered and (len(self._filtered) > FILTERED_MAX
                                      or next(iter(self._filtered.values())).at < horizon):
                self._filtered.popitem(last=False)

    def _filtered_recently(self, uid: str) -> _Filtered | None:
        with self._filtered_lock:
            seen = self._filtered.get(uid)
        if seen is None or seen.at < self.clock() - self.filter_window_s:
            return None
        return seen

    def _bind_refusal(self, key: str, uid: str) -> tuple[str, str] | None:
        """(metric label, reason) when this bind is not one the scheduler is making, else None."""
        seen = self._filtered_recently(uid) if uid else None
        if seen is None:
            return "not_filtered", (f"pod {key} (uid {uid}) is unknown to vramfit: no filter call named it in the "
                                    f"last {self.filter_window_s:g} s, and vramfit binds only pods it filtered")
        scheduler, node = seen.scheduler, seen.node
        obj = self.store.pod_object(key)  # the watched object, when there is one, is the fresher word
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and str(meta.get("uid") or "") == uid:
            spec = obj.get("spec") if isinstance(obj, dict) else None
            spec = spec if isinstance(spec, dict) else {}
            scheduler, node = spec.get("schedulerName"), spec.get("nodeName")
        if node:
            return "already_bound", f"pod {key} is already bound to node {node}: only pending pods are bound"
        if scheduler is not None and scheduler not in self.scheduler_names:
            return "wrong_scheduler", (f"pod {key} is for scheduler {scheduler!r}, not "
                                       f"{' or '.join(sorted(self.scheduler_names))}")
        return None

    # ---- shared: the core's verdict for a pod shape, cached per store generation (lock held) ----------
    def _eval(self, pod: PodDemand, want_scores: bool) -> _Eval:
        key = (pod.shape, self.policy.whole_gpu)
        gen = self.store.generation
        ev = self._evals.get(key)
        if ev is None or ev.generation != gen:
            ev = _Eval(gen, fit.feasible(self.store.state, pod, self.policy.whole_gpu))
            self._evals[key] = ev
            if len(self._evals) > CACHE_SHAPES:
                self._evals.popitem(last=False)
        else:
            self._evals.move_to_end(key)
        if want_scores and ev.scores is None:
            ev.scores = np.asarray(self._policy.score(self.store.state, pod, ev.mask.now), dtype=np.float64)
        return ev

    def _reason(self, pod: PodDemand, name: str, i: int) -> str:
        state = self.store.state
        key = (pod.shape, self.policy.whole_gpu, name, int(state.version[i]))
        text = self._reasons.get(key)
        if text is None:
            text = fit.explain(state, name, pod, self.policy.whole_gpu).reason or "does not fit"
            self._reasons[key] = text
            if len(self._reasons) > CACHE_REASONS:
                self._reasons.popitem(last=False)
        return text

    def _largest_free(self, ev: _Eval) -> np.ndarray:
        if ev.largest is None:
            state = self.store.state
            um = state.unit_max * state.present
            ev.largest = um.max(axis=1) if um.shape[1] else np.zeros(len(state), dtype=np.int64)
        return ev.largest

    def _positions(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """State row of each requested name (-1 = unknown) and the names as an object array, cached while the
        list and the node set stay the same: kube-scheduler sends the same names cycle after cycle, and
        prioritize sends the names filter passed (registered by filter)."""
        version = self.store.node_set_version
        for pos, entry in enumerate(self._names):
            if entry[0] == version and entry[1] == names:
                if pos:
                    self._names.insert(0, self._names.pop(pos))
                return entry[2], entry[3]
        index = self.store.node_index()
        rows = np.fromiter(map(index.get, names, repeat(-1, len(names))), dtype=np.int64, count=len(names))
        as_array = np.array(names, dtype=object)
        self._remember_positions(list(names), rows, as_array)
        return rows, as_array

    def _remember_positions(self, names: list[str], rows: np.ndarray, as_array: np.ndarray) -> None:
        """`names` must not change afterwards (callers pass a copy or a list of their own)."""
        self._names.insert(0, (self.store.node_set_version, names, rows, as_array))
        del self._names[4:]  # filter's list, its survivors, and those of the cycle before

    def _never_map(self, pod: PodDemand, is_never: np.ndarray, name_arr: np.ndarray) -> dict[str, str]:
        key = (pod.shape, self.policy.whole_gpu, np.packbits(is_never).tobytes(), len(name_arr), id(name_arr))
        hit = self._never.get(key)
        if hit is not None and hit[0] is name_arr:
            return hit[1]
        text = (f"never fits: no GPU here can hold {pod.vram_mib} MiB"
                + (f" on each of {pod.gpu_count} GPUs" if pod.gpu_count > 1 else "")
                + f" with isolation {pod.isolation.value}"
                + (f" and models {','.join(sorted(pod.models))}" if pod.models else ""))
        mapping = dict.fromkeys(name_arr[is_never].tolist(), text)
        self._never[key] = (name_arr, mapping)
        if len(self._never) > CACHE_SHAPES:
            self._never.popitem(last=False)
        return mapping

    # ---- filter ---------------------------------------------------------------------------------
    def filter(self, args: wire.ExtenderArgs) -> dict[str, Any]:
        by_nodes = args.NodeNames is None
        if by_nodes:
            if args.Nodes is None or args.Nodes.items is None:
                raise wire.WireError("invalid ExtenderArgs: neither NodeNames nor Nodes.items is set")
            items = args.Nodes.items
            names = [_node_name(n, k) for k, n in enumerate(items)]
        else:
            items = []
            names = args.NodeNames or []

        def answer(passed: list[int], failed: dict[str, str], never: dict[str, str],
                   passed_names: list[str] | None = None) -> dict[str, Any]:
            self._fit_count.inc(len(passed))
            self._full_count.inc(len(failed))
            self._never_count.inc(len(never))
            if by_nodes:
                return wire.filter_result(nodes=[items[k] for k in passed], failed=failed, unresolvable=never)
            if passed_names is None:
                passed_names = [names[k] for k in passed]
            return wire.filter_result(node_names=passed_names, failed=failed, unresolvable=never)

        try:
            pod = self._demand(args.Pod)
        except InputError as err:
            # Short: the text is repeated for every node, and a hostile pod's name may be megabytes long.
            reason = _short(f"pod cannot be placed by vramfit: {err}")
            return answer([], {}, dict.fromkeys(names, reason))
        if pod is None:  # not a vramfit pod: every node passes
            return answer(list(range(len(names))), {}, {}, passed_names=list(names))
        self._note_filtered(pod, args.Pod)
        if self.store.remember(pod):
            with self.store.lock:  # a learning policy's state is read by score/choose under the same lock
                self._policy.observe(pod)
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        with self.store.lock:
            self.store.sweep()
            ev = self._eval(pod, want_scores=False)
            rows, name_arr = self._positions(names)
            known = rows >= 0
            if len(ev.mask.now):
                safe = np.where(known, rows, 0)
                now = ev.mask.now[safe] & known
                is_never = ev.mask.never[safe] & known
            else:  # an empty state: no name is known (and there is no row 0 to stand in for them)
                now = is_never = np.zeros(len(rows), dtype=bool)
            for k in np.flatnonzero(~known).tolist():
                never[names[k]] = self.store.bad_nodes.get(names[k]) or f"node {names[k]} is not known to vramfit"
            fail = np.flatnonzero(known & ~now)
            # A vectorised summary reason for every rejected node, the core's full reason for the first few
            # (with thousands of nodes, kube-scheduler's event groups identical texts, so the summary is also
            # the readable one). Where a pod can never go depends on the pod's shape and the hardware, not on
            # occupancy: that map is reused across cycles.
            if is_never.any():
                never.update(self._never_map(pod, is_never, name_arr))
            for k in fail[:EXPLAIN_LIMIT].tolist():
                (never if is_never[k] else failed)[names[k]] = self._reason(pod, names[k], int(rows[k]))
            rest = fail[EXPLAIN_LIMIT:]
            if rest.size:
                rest_full = rest[~is_never[rest]]
                if rest_full.size:
                    largest = self._largest_free(ev)[rows[rest_full]]
                    values, inverse = np.unique(largest, return_inverse=True)
                    texts = np.array([f"full now: needs {pod.vram_mib} MiB, largest free unit {int(v)} MiB"
                                      for v in values], dtype=object)
                    failed.update(zip(name_arr[rest_full].tolist(), texts[inverse].tolist(), strict=True))
            passed = np.flatnonzero(now)
            passed_names = None
            if not by_nodes:
                passed_names = name_arr[passed].tolist()
                # The scheduler's prioritize call names (a subset of) these: register their rows now.
                self._remember_positions(passed_names, rows[passed], name_arr[passed])
        return answer(passed.tolist(), failed, never, passed_names)

    # ---- prioritize -----------------------------------------------------------------------------
    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        """HostPriorityList, encoded: the answer holds one entry per requested node (thousands), so it is
        assembled from cached per-node JSON fragments instead of dicts."""
        if args.NodeNames is not None:
            names = args.NodeNames
        elif args.Nodes is not None and args.Nodes.items is not None:
            names = [_node_name(n, k) for k, n in enumerate(args.Nodes.items)]
        else:
            raise wire.WireError("invalid ExtenderArgs: neither NodeNames nor Nodes.items is set")
        try:
            pod = self._demand(args.Pod)
        except InputError:
            pod = None  # filter already rejected it everywhere; prioritize has no error channel
        with self.store.lock:
            idx, _ = self._positions(names)
            prefixes = self._host_prefixes(idx, names)
            if pod is None:
                scores = np.zeros(len(names), dtype=np.int64)
            else:
                ev = self._eval(pod, want_scores=True)
                assert ev.scores is not None
                scores = _scaled(ev.scores, ev.mask.now, idx)
        return wire.host_priorities_json(prefixes, scores)

    def _host_prefixes(self, idx: np.ndarray, names: list[str]) -> np.ndarray:
        """`wire.host_prefix` of each requested node: per state row, built once per node set (lock held)."""
        key = (self.store.node_set_version, len(self.store.state))
        if self._prefix_key != key:
            self._prefix_table = np.array([wire.host_prefix(n) for n in self.store.state.node_names] or [b""],
                                          dtype=object)
            self._prefix_key = key
        out = self._prefix_table[np.where(idx >= 0, idx, 0)]
        for k in np.flatnonzero(idx < 0).tolist():
            out[k] = wire.host_prefix(names[k])  # a node vramfit does not know: still answered, score 0
        return out

    # ---- bind -----------------------------------------------------------------------------------
    def bind(self, args: wire.ExtenderBindingArgs) -> dict[str, str]:
        ns, name, uid, node = args.PodNamespace, args.PodName, args.PodUID, args.Node
        key = f"{ns}/{name}"
        with self.store.lock:
            held = self.store.state.holder(key)
            if held is not None and (not uid or held.pod.uid == uid):
                if held.reserved:
                    return self._bind_error("in_progress", f"a bind of pod {key} is already in progress")
                if held.assignment.node == node:
                    self.metrics.binds.labels("repeat").inc()
                    return wire.binding_result()  # a retry of a bind that succeeded: same answer
                return self._bind_error("conflict", f"pod {key} is already bound to {held.assignment.node}")
        refusal = self._bind_refusal(key, uid)
        if refusal is not None:
            return self._bind_error(*refusal)
        try:
            pod = self.store.demand_for(ns, name, uid)
            if pod is not None:
                self._demand_limits().check(pod)
        except InputError as err:
            return self._bind_error("bad_pod", f"pod {key}: {err}")
        if pod is None:
            return self._bind_error("unknown_pod", f"pod {key} (uid {uid}) is unknown to vramfit: "
                                                   "no filter call named it and the pod was not seen in the API")
        gate: AdmissionGate | None = getattr(self.binder, "admission", None)
        if gate is None:  # snapshot mode: no kubelet, nothing to wait for
            return self._place(pod, ns, name, uid, node, None)
        # One bind at a time per node (check + reserve + Binding), so that at most one pod there is
        # allocating and not yet admitted: the node agent's Allocate relies on it (extender.admission).
        with gate.hold(node) as turn:
            if turn.busy is not None:
                self._count_wait(turn)
                return self._bind_error("node_busy", turn.busy)
            return self._place(pod, ns, name, uid, node, (gate, turn))

    def _place(self, pod: PodDemand, ns: str, name: str, uid: str, node: str,
               gated: tuple[AdmissionGate, Turn] | None) -> dict[str, str]:
        """Reserve units, pass the gate (if any), write the Binding; never leaves units booked on failure."""
        key = f"{ns}/{name}"
        try:
            assignment = self.store.reserve(pod, node, self._policy)
        except NoFit as err:
            return self._bind_error("no_fit", str(err))
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

    # ---- preempt --------------------------------------------------------------------------------
    def preempt(self, args: wire.ExtenderPreemptionArgs) -> bytes:
        candidates: dict[str, tuple[list[str], int]] = {}
        if args.NodeNameToMetaVictims is not None:
            for node, mv in args.NodeNameToMetaVictims.items():
                if mv is not None:
                    candidates[node] = ([p.UID for p in mv.Pods or []], mv.NumPDBViolations)
        elif args.NodeNameToVictims is not None:
            for node, v in args.NodeNameToVictims.items():
                if v is not None:
                    uids = [_uid_of(p) for p in v.Pods or []]
                    candidates[node] = ([u for u in uids if u], v.NumPDBViolations)
        try:
            pod = self._demand(args.Pod)
        except InputError:
            self.metrics.preemptions.labels("dropped").inc(len(candidates))
            return wire.preemption_result_json({})  # the pod fits nowhere; preemption cannot change that
        if pod is None:
            return wire.preemption_result_json(candidates)  # not ours to judge
        kept: dict[str, tuple[list[str], int]] = {}
        for node, (uids, pdb) in candidates.items():
            with self.store.lock:  # per node: a call naming thousands of nodes does not hold binds up meanwhile
                chosen = self._victims_on(node, pod, uids)
            if chosen is None:
                self.metrics.preemptions.labels("dropped").inc()
                continue
            self.metrics.preemptions.labels("kept").inc()
            kept[node] = (chosen, pdb)
        return wire.preemption_result_json(kept)

    def _victims_on(self, node_name: str, pod: PodDemand, uids: list[str]) -> list[str] | None:
        """The fewest of the scheduler's victims whose eviction lets the pod fit here, or None."""
        state = self.store.state
        if not state.has_node(node_name):
            return None
        holders = state.holders_on(node_name)
        by_uid = {h.pod.uid: h for h in holders if h.pod.uid}
        # Each once; the others hold no GPU here: the scheduler's call, kept as they are.
        gpu_victims = list(dict.fromkeys(u for u in uids if u in by_uid))
        sim = _node_copy(state, state.node(node_name), holders)
        whole = self.policy.whole_gpu

        def fits() -> bool:
            return fit.explain(sim, node_name, pod, whole).fits

        removed: list[str] = []
        if not fits():
            # Lowest priority first, then the biggest VRAM holder: the order a scheduler would evict in.
            order = sorted(gpu_victims, key=lambda u: (by_uid[u].pod.priority,
                                                       -sum(g.vram_mib for g in by_uid[u].assignment.gpus)))
            for u in order:
                sim.release(by_uid[u].pod.key)
                removed.append(u)
                if fits():
                    break
            else:
                return None
            # Put back every victim the pod does not need gone (latest first): a minimal set.
            for u in reversed(list(removed)):
                h = by_uid[u]
                sim.allocate(h.pod, h.assignment, force=True)
                if fits():
                    removed.remove(u)
                else:
                    sim.release(h.pod.key)
        evicted = set(removed)  # sets: a call may name thousands of victims per node
        chosen = [u for u in uids if u not in by_uid or u in evicted]
        # Nothing GPU-side needs evicting: the scheduler's own victims are for its own resources.
        return chosen or list(uids) or None


def _short(text: str, limit: int = 512) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _uid_of(pod_obj: Any) -> str:
    meta = pod_obj.get("metadata") if isinstance(pod_obj, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else ""


def _node_name(item: Any, k: int) -> str:
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise wire.WireError(f"invalid ExtenderArgs: Nodes.items.{k}.metadata.name is missing")
    return name


def scale_scores(scores: np.ndarray, feasible: np.ndarray, idx: np.ndarray) -> list[int]:
    """Policy scores of the requested nodes -> integers 0..10 (extender/v1 MaxExtenderPriority).

    Min-max over the feasible requested nodes; the best node(s) get 10 and every other node at most 9, so the
    policy's pick is strictly preferred by this extender. Unknown or infeasible nodes get 0."""
    return _scaled(scores, feasible, idx).tolist()


def _scaled(scores: np.ndarray, feasible: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`scale_scores` as an int64 array."""
    out = np.zeros(idx.shape[0], dtype=np.int64)
    ok = idx >= 0
    ok[ok] = feasible[idx[ok]]
    if not ok.any():
        return out
    big = np.finfo(np.float64).max / 4
    s = np.nan_to_num(scores[idx[ok]].astype(np.float64), nan=-big, posinf=big, neginf=-big)
    lo, hi = float(s.min()), float(s.max())
    if hi > lo:
        scaled = np.floor((s - lo) / (hi - lo) * (wire.MAX_EXTENDER_PRIORITY - 1)).astype(np.int64)
        out[ok] = np.where(s == hi, wire.MAX_EXTENDER_PRIORITY, np.clip(scaled, wire.MIN_EXTENDER_PRIORITY,
                                                                        wire.MAX_EXTENDER_PRIORITY - 1))
    else:
        out[ok] = wire.MAX_EXTENDER_PRIORITY
    return out


def _node_copy(state: ClusterState, node: Node, holders: list[Any]) -> ClusterState:
    """A one-node ClusterState holding the same pods: preemption is simulated there, never on the live state."""
    sim = ClusterState([node], relax_tenancy=state.relax_tenancy)
    for h in holders:
        try:
            sim.allocate(h.pod, h.assignment, reserved=h.reserved, force=True)
        except PlacementError:
            continue
    return sim
