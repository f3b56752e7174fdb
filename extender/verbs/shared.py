"""What the four verbs share: a pod's demand (parsed once per Pod object, checked against what the cluster
could ever hold), the policy behind its guard, and the core's verdict per pod shape.

Filter and prioritize of one scheduling cycle ask the same question of the same state; the feasibility mask
and policy scores are cached per (pod shape, store generation) so the second call is a lookup, and the state
rows of a requested name list are cached while the node set stays the same.

Nothing a request teaches can break a later one: a pod is checked against what the cluster could ever hold
(`DemandLimits`) before it is remembered or learnt from, and the policy is `Guarded` (its failure costs the
pod its polish, best-fit units or neutral scores, never the verb).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
from prometheus_client import Counter

from extender import wire
from extender.metrics import Metrics
from extender.store import Store
from packing import fit
from packing.catalog import Catalog
from packing.k8s.demand import ANN_GPUS, ANN_MODELS, MAX_GPUS_PER_POD, VRAM_RESOURCE, pod_demand
from packing.model import InputError, PodDemand
from packing.model_names import unknown_models_problem
from packing.modes import UNLIMITED
from packing.policies import Guarded, Policy
from packing.state import ClusterState

log = logging.getLogger("vramfit.extender")

CACHE_SHAPES = 256
# Pod demands by Pod object: the sum of the cached objects' JSON sizes stays within this (a count alone let
# 130 pods of 16 MiB hold 2 GiB), and the entries within a count (tiny pods, a flood of distinct ones).
CACHE_DEMAND_BYTES = 64 * 2**20
CACHE_DEMANDS = 4096
# API limits on names (a pod beyond them cannot exist; its strings would sit in every cache key).
MAX_NAME = 253  # a DNS subdomain: pod names, GPU products
MAX_LABEL = 63  # namespaces, label values (the tenant)
MAX_UID = 128
MAX_MODELS = 64


@dataclass
class Eval:
    """The core's verdict for one pod shape at one store generation."""

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
    def of(catalog: Catalog, state: ClusterState, sizes: NodeSizes | None = None) -> DemandLimits:
        """Lock held (reads the state's arrays). `sizes`: the state's per-node sizes kept up to date row by row
        (`NodeSizes`), so a placement does not cost a pass over every node."""
        largest_model = max((m.memory_mib for m in catalog.models.values()), default=0)
        if len(state) == 0:
            return DemandLimits(largest_model, MAX_GPUS_PER_POD, UNLIMITED, UNLIMITED)
        top = (sizes or NodeSizes()).maxima(state)
        return DemandLimits(vram_mib=max(largest_model, int(top[0])), gpus=int(top[1]), cpu_milli=int(top[2]),
                            memory_mib=int(top[3]))

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


class NodeSizes:
    """[N, 4] per node: its largest GPU's VRAM, its GPU count, allocatable CPU and memory, and their maxima over
    the nodes. A row is read again only when its version moves (a placement moves one row; this runs once per
    store generation), and the maxima are taken again only when a row's sizes moved: a placement changes what a
    node holds, not its sizes."""

    def __init__(self) -> None:
        self._epoch: int | None = None
        self._version = np.zeros(0, dtype=np.int64)
        self._table = np.zeros((0, 4), dtype=np.int64)
        self._top = np.zeros(4, dtype=np.int64)

    def maxima(self, state: ClusterState) -> np.ndarray:
        """[4] the largest of each size over the state's nodes (the state has at least one node)."""
        version = state.version
        if self._epoch != state.rows_epoch or self._version.shape != version.shape:
            rows = np.arange(len(state))
            self._table = np.full((len(state), 4), -1, dtype=np.int64)  # -1: no node has it, so every row moves
            self._epoch = state.rows_epoch
        else:
            rows = np.flatnonzero(self._version != version)
        if rows.size:
            present = state.present[rows]
            read = np.stack([np.where(present, state.vram[rows], 0).max(axis=1, initial=0), present.sum(axis=1),
                             state.cpu_cap[rows], state.host_mem_cap[rows]], axis=1)
            if (read != self._table[rows]).any():
                self._table[rows] = read
                self._top = self._table.max(axis=0)
            self._version = version.copy()
        return self._top


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


class DemandCache:
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


def node_name(item: Any, k: int) -> str:
    """metadata.name of the k-th Node of an ExtenderArgs' Nodes.items; WireError when it has none."""
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise wire.WireError(f"invalid ExtenderArgs: Nodes.items.{k}.metadata.name is missing")
    return name


def requested(args: wire.ExtenderArgs) -> tuple[list[dict[str, Any]], list[str]]:
    """(Node objects, node names) an ExtenderArgs asks about: by Nodes.items or by NodeNames (then no objects)."""
    if args.NodeNames is not None:
        return [], args.NodeNames or []
    if args.Nodes is None or args.Nodes.items is None:
        raise wire.WireError("invalid ExtenderArgs: neither NodeNames nor Nodes.items is set")
    items = args.Nodes.items
    return items, [node_name(n, k) for k, n in enumerate(items)]


class Shared:
    """The store, the guarded policy and the caches the verbs share (one per Extender)."""

    def __init__(self, store: Store, policy: Policy, metrics: Metrics) -> None:
        self.store = store
        self.policy = policy  # as configured; every call goes through `guarded`, which survives its failures
        self.policy_errors = Counter("vramfit_policy_errors_total",
                                     "Policy calls that raised and were answered by the fallback (score: neutral "
                                     "scores; choose: best-fit units; observe: not learnt)",
                                     ["call"], registry=metrics.registry)
        self.guarded = Guarded(policy, self._policy_failed)
        self._failed_kinds: set[tuple[str, str]] = set()
        self._limits: tuple[int, DemandLimits] | None = None
        self._sizes = NodeSizes()
        self._evals: OrderedDict[tuple[object, ...], Eval] = OrderedDict()
        self._feasible = fit.FeasibleRows(CACHE_SHAPES)  # the masks behind the evals, kept row by row
        self._names: list[tuple[int, list[str], np.ndarray, np.ndarray]] = []
        self.demands = DemandCache(CACHE_DEMAND_BYTES, CACHE_DEMANDS)
        self.planner: Any = None  # extender.planning.planner.Planner when queue planning is on (its `plan` is followed)
        self._planned_nodes: tuple[Any, frozenset[str]] = (None, frozenset())
        self._models_checked: OrderedDict[tuple[object, int], str | None | bool] = OrderedDict()

    def plan(self) -> Any:
        """The queue plan to follow now (packing.planning.queue_plan.QueuePlan), or None (planning off, none yet)."""
        planner = self.planner
        return planner.plan if planner is not None else None

    def planned_nodes(self, plan: Any) -> frozenset[str]:
        """The nodes holding any planned units of `plan` (cached per plan)."""
        cached = self._planned_nodes
        if cached[0] is not plan:  # the plan object itself: an id could be reused by the next plan
            cached = (plan, frozenset(a.node for a in plan.assignments.values()))
            self._planned_nodes = cached
        return cached[1]

    def demand(self, pod_obj: dict[str, Any]) -> PodDemand | None:
        """`pod_demand` of a Pod object, its tenant by the store's namespace rules, within `DemandLimits`;
        raises InputError for a malformed or impossible pod, or one naming a tenant its namespace does not allow.
        Cached by content (a hash of the object's JSON) and the version of the namespace rules: filter and
        prioritize of one cycle, and every retry of an unschedulable pod, send the same Pod, and parsing its
        quantities and annotations is a tenth of a millisecond each time. Not by UID and resourceVersion: a
        filter call's Pod is whatever its caller sent, and one naming a real pod's UID and version must not
        decide what that pod is. A malformed pod is not cached (it raises). The limits are checked on every
        call: they follow the nodes."""
        encoded = wire.dumps(pod_obj)
        version = self.store.tenancy_version  # before the rules: a race caches newer rules under an older key
        tenancy = self.store.tenancy
        key = (hashlib.blake2b(encoded, digest_size=16).digest(), version)
        hit, pod = self.demands.get(key)
        if not hit:
            pod = pod_demand(pod_obj, tenancy)
            self.demands.put(key, pod, len(encoded))
        if pod is not None:
            self.demand_limits().check(pod)
            if pod.models:
                self._check_models(pod)
        return pod

    def _check_models(self, pod: PodDemand) -> None:
        """InputError when `vramfit.io/gpu-models` names no GPU the catalog or the cluster knows: the pod would
        otherwise be refused by every node for ever without a word of why (the webhook's rule, for pods it never
        saw). Cached per model list and store generation."""
        key = (pod.models, self.store.generation)
        problem = self._models_checked.get(key, False)
        if problem is False:
            problem = unknown_models_problem(self.store.catalog, sorted(pod.models or ()), self._products)
            self._models_checked[key] = problem
            if len(self._models_checked) > CACHE_SHAPES:
                self._models_checked.popitem(last=False)
        if problem is not None:
            raise InputError(f"pod {pod.key[:80]}", f"metadata.annotations[{ANN_MODELS}]", str(problem))

    def _products(self) -> set[str]:
        """The products of the GPUs the store holds (an uncatalogued GPU is named by its product)."""
        with self.store.lock:
            return {g.product for n in self.store.state.nodes() for g in n.gpus}

    def demand_limits(self) -> DemandLimits:
        """`DemandLimits` of the store as it is now (recomputed once per store generation)."""
        gen = self.store.generation
        cached = self._limits
        if cached is not None and cached[0] == gen:
            return cached[1]
        with self.store.lock:
            gen = self.store.generation
            limits = DemandLimits.of(self.store.catalog, self.store.state, self._sizes)
        self._limits = (gen, limits)
        return limits

    def _policy_failed(self, call: str, pod: PodDemand, err: Exception) -> None:
        self.policy_errors.labels(call).inc()
        kind = (call, type(err).__name__)
        first = kind not in self._failed_kinds  # the traceback once per kind: the same failure may repeat per pod
        self._failed_kinds.add(kind)
        log.error("policy %s: %s failed for pod %s (%s: %s); answered by the fallback", self.policy.name, call,
                  pod.key, type(err).__name__, err, exc_info=err if first else None)

    def eval(self, pod: PodDemand, want_scores: bool) -> Eval:
        """The core's verdict for the pod's shape, cached per store generation (lock held); the feasibility is
        re-judged only on the rows that moved since the shape was last asked (`fit.FeasibleRows`)."""
        key = (pod.shape, self.policy.whole_gpu)
        gen = self.store.generation
        ev = self._evals.get(key)
        if ev is None or ev.generation != gen:
            ev = Eval(gen, self._feasible.mask(self.store.state, pod, self.policy.whole_gpu))
            self._evals[key] = ev
            if len(self._evals) > CACHE_SHAPES:
                self._evals.popitem(last=False)
        else:
            self._evals.move_to_end(key)
        if want_scores and ev.scores is None:
            ev.scores = np.asarray(self.guarded.score(self.store.state, pod, ev.mask.now), dtype=np.float64)
        return ev

    def positions(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """State row of each requested name (-1 = unknown) and the names as an object array, cached while the
        list and the node set stay the same: kube-scheduler sends the same names cycle after cycle, and
        prioritize sends the names filter passed (registered by filter). Lock held."""
        version = self.store.node_set_version
        for pos, entry in enumerate(self._names):
            if entry[0] == version and entry[1] == names:
                if pos:
                    self._names.insert(0, self._names.pop(pos))
                return entry[2], entry[3]
        index = self.store.node_index()
        rows = np.fromiter(map(index.get, names, repeat(-1, len(names))), dtype=np.int64, count=len(names))
        as_array = np.array(names, dtype=object)
        self.remember_positions(list(names), rows, as_array)
        return rows, as_array

    def remember_positions(self, names: list[str], rows: np.ndarray, as_array: np.ndarray) -> None:
        """`names` must not change afterwards (callers pass a copy or a list of their own)."""
        self._names.insert(0, (self.store.node_set_version, names, rows, as_array))
        del self._names[4:]  # filter's list, its survivors, and those of the cycle before
