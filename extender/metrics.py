"""Prometheus metrics: request latency and decisions per verb, plus a scrape-time view of the store.

The VRAM gauges are not updated on the hot path: `StoreCollector` reads them from the core's arrays when
Prometheus scrapes. Under the store lock it only copies a few [N] arrays (and recomputes stranded VRAM for
the nodes whose version changed since the last scrape); the 5,000-node families are built after the lock
is released, so a scrape never holds up filter or bind for long.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from extender.store import Store
from packing.state import ClusterState

# Filter/prioritize answer in well under 10 ms; bind includes an API round trip, and may wait at the gate.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A bind waits for the node's previous pod to be admitted: the kubelet's admission takes 0.1 s to seconds,
# and the wait is capped by admission_wait_s (default 5 s).
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0)


# `_created` series double every counter and histogram for a timestamp nobody graphs.
disable_created_metrics()


def _version() -> str:
    try:
        return metadata.version("vramfit")
    except metadata.PackageNotFoundError:
        return "unknown"


MIB = 1 << 20
# Prometheus convention (and HAMi's): memory in bytes. The core counts MiB; the families multiply once.
NODE_FAMILIES = {
    "vramfit_node_free_vram_bytes": "VRAM no pod holds, per node",
    "vramfit_node_largest_free_unit_bytes": "Largest VRAM one new pod could get on the node now",
    "vramfit_node_stranded_vram_bytes": "VRAM on the node's GPUs in use that no pod holds and no new pod can get",
}
GPU_FAMILIES = {
    "vramfit_gpu_memory_bytes": "The GPU's memory",
    "vramfit_gpu_free_vram_bytes": "VRAM on the GPU no pod holds",
    "vramfit_gpu_pods": "Pods holding a unit of the GPU",
    "vramfit_gpu_tenants": "Tenants holding a unit of the GPU (more than one only on MIG)",
}
MODE_NAMES = {0: "exclusive", 1: "mig", 2: "mps", 3: "timeslice"}


class StrandedByNode:
    """Stranded VRAM per state row, recomputed only for rows whose version moved (call with the lock held).

    Rows without a pod on any GPU strand nothing (the core counts only GPUs with grants), so a scrape of an
    idle 5,000-node cluster costs a few vectorised comparisons; after that, only the nodes that changed."""

    def __init__(self) -> None:
        self._state_id = 0
        self._version = np.zeros(0, dtype=np.int64)
        self._mib = np.zeros(0, dtype=np.int64)

    def compute(self, state: ClusterState) -> np.ndarray:
        n = len(state)
        if id(state) != self._state_id:  # a different state object: nothing cached applies
            self._state_id = id(state)
            self._version = np.full(n, -1, dtype=np.int64)
            self._mib = np.zeros(n, dtype=np.int64)
        elif n != self._version.shape[0]:
            # Rows only append or drop at the end; a moved node bumps its row's version, so it is recomputed.
            keep = min(n, self._version.shape[0])
            self._version = np.concatenate([self._version[:keep], np.full(n - keep, -1, dtype=np.int64)])
            self._mib = np.concatenate([self._mib[:keep], np.zeros(n - keep, dtype=np.int64)])
        version = state.version
        changed = np.flatnonzero(version != self._version)
        if changed.size:
            busy = (state.present & ~state.idle).any(axis=1)
            names = state.node_names
            for i in changed.tolist():
                self._mib[i] = state.node_stranded_mib(names[i]) if busy[i] else 0
            self._version[changed] = version[changed]
        return self._mib.copy()


class _NodeGauge(GaugeMetricFamily):
    """A per-node gauge family backed by arrays. Its `samples` are built only if a generic exposition asks for
    them; `exposition` writes the family straight from the arrays (15,000 `Sample`s through
    `generate_latest` cost ~130 ms a scrape at 5,000 nodes, the direct path a few ms)."""

    def __init__(self, name: str, documentation: str, nodes: list[str], values: np.ndarray,
                 prefixes: LinePrefixes | None = None) -> None:
        super().__init__(name, documentation, labels=["node"])
        # `nodes`: one label text per row; for per-GPU families it is the whole label set (see GpuLabels)
        self.nodes = nodes
        self.values = values
        self.prefixes = prefixes
        self._samples: list[Sample] | None = None

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = [Sample(self.name, _labels_of(node), value) for node, value in
                             zip(self.nodes, self.values.astype(np.float64).tolist(), strict=True)]
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._samples = value if value else None  # Metric.__init__ assigns []: keep the lazy build


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class LinePrefixes:
    """`name{node="..."} ` per node, kept while the node list stays the same (it rarely changes). One entry,
    swapped whole, so concurrent scrapes never pair one list's prefixes with another list."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entry: tuple[list[str], list[str]] | None = None

    def get(self, nodes: list[str]) -> list[str]:
        entry = self._entry
        if entry is None or entry[0] != nodes:
            entry = (list(nodes), [f"{self.name}{{{_label_text(n)}}} " for n in nodes])
            self._entry = entry
        return entry[1]


def _label_text(row: str) -> str:
    """A row key is a node name, or `\x00`-joined label=value pairs for the per-GPU families."""
    if "\x00" not in row:
        return f'node="{_label_value(row)}"'
    # sorted by label name, as generate_latest writes them
    return ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(p.split("=", 1) for p in row.split("\x00")))


def _labels_of(row: str) -> dict[str, str]:
    if "\x00" not in row:
        return {"node": row}
    return dict(p.split("=", 1) for p in row.split("\x00"))


def _label_value(text: str) -> str:
    """Label-value escaping of the text format (backslash, newline, double quote), as generate_latest does."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _node_gauge_text(family: _NodeGauge) -> str:
    prefixes = (family.prefixes or LinePrefixes(family.name)).get(family.nodes)
    # Values repeat a lot (same GPU shapes): format each distinct one once, exactly as generate_latest does.
    uniq, inverse = np.unique(family.values.astype(np.float64), return_inverse=True)
    texts = [floatToGoString(v) + "\n" for v in uniq.tolist()]
    lines = list(map(str.__add__, prefixes, [texts[k] for k in inverse.tolist()]))
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {family.name} {doc}\n# TYPE {family.name} gauge\n" + "".join(lines)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format: byte-for-byte what `generate_latest` writes, with the
    per-node families rendered from their arrays."""
    generic: list[Metric] = []
    fast: list[_NodeGauge] = []
    for family in registry.collect():
        if isinstance(family, _NodeGauge):
            fast.append(family)
        else:
            generic.append(family)
    return generate_latest(_Families(generic)) + "".join(_node_gauge_text(f) for f in fast).encode()


class GpuLabels:
    """Per-GPU label rows (node, gpu index, uuid, mode) for the present GPUs, rebuilt only when the node set
    or a node's version changes."""

    def __init__(self) -> None:
        self._key: tuple[int, bytes] | None = None
        self.rows: list[str] = []
        self.where: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def get(self, state: ClusterState) -> tuple[list[str], tuple[np.ndarray, np.ndarray]]:
        key = (id(state), state.version.tobytes() + str(state.node_names).encode())
        if key != self._key:
            n_idx, g_idx = np.nonzero(state.present)
            names = state.node_names
            modes = state.mode
            rows = []
            for i, g in zip(n_idx.tolist(), g_idx.tolist(), strict=True):
                node = state.node(names[i])
                gpu = next((x for x in node.gpus if x.index == g), None)
                uuid = gpu.uuid if gpu is not None and gpu.uuid else ""
                rows.append(f"node={names[i]}\x00gpu={g}\x00uuid={uuid}\x00mode={MODE_NAMES.get(int(modes[i, g]), '')}")
            self._key, self.rows, self.where = key, rows, (n_idx, g_idx)
        return self.rows, self.where


class StoreCollector(Collector):
    """Free, largest-unit and stranded VRAM per node and their cluster totals, reservations, conflicted pods,
    readiness: read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._stranded = StrandedByNode()
        self._gpu_labels = GpuLabels()
        self._prefixes = {name: LinePrefixes(name) for name in (*NODE_FAMILIES, *GPU_FAMILIES)}

    def _node_gauge(self, name: str, nodes: list[str], values: np.ndarray) -> _NodeGauge:
        doc = NODE_FAMILIES.get(name) or GPU_FAMILIES[name]
        return _NodeGauge(name, doc, nodes, values, self._prefixes[name])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.store.lock:
            state = self.store.state
            names = list(state.node_names)
            free = state.node_free.copy()
            um = state.unit_max * state.present
            largest = um.max(axis=1) if um.shape[1] else np.zeros(len(names), dtype=np.int64)
            stranded = self._stranded.compute(state)
            gpu_rows, (gn, gg) = self._gpu_labels.get(state)
            gpu_mem = state.vram[gn, gg].astype(np.int64)
            gpu_free = state.pool_free[gn, gg].astype(np.int64)
            pods: dict[tuple[str, int], int] = {}
            tenants: dict[tuple[str, int], set[str]] = {}
            for h in state.holders():
                for grant in h.assignment.gpus:
                    where = (h.assignment.node, grant.index)
                    pods[where] = pods.get(where, 0) + 1
                    tenants.setdefault(where, set()).add(h.pod.tenant)
            reservations = list(self.store.reservations.values())
            bad = len(self.store.bad_nodes)
            not_served = len(self.store.unserved)
            conflicted = len(self.store.conflicted)
            ready = 1.0 if self.store.ready else 0.0
            generation = float(self.store.generation)
        reserved_mib = sum(g.vram_mib for r in reservations for g in r.assignment.gpus)
        yield self._node_gauge("vramfit_node_free_vram_bytes", names, free.astype(np.int64) * MIB)
        yield self._node_gauge("vramfit_node_largest_free_unit_bytes", names, largest.astype(np.int64) * MIB)
        yield self._node_gauge("vramfit_node_stranded_vram_bytes", names, stranded.astype(np.int64) * MIB)
        node_names = names
        keys = [(node_names[i], g) for i, g in zip(gn.tolist(), gg.tolist(), strict=True)]
        yield self._node_gauge("vramfit_gpu_memory_bytes", gpu_rows, gpu_mem * MIB)
        yield self._node_gauge("vramfit_gpu_free_vram_bytes", gpu_rows, gpu_free * MIB)
        yield self._node_gauge("vramfit_gpu_pods", gpu_rows, np.array([pods.get(k, 0) for k in keys], dtype=np.int64))
        yield self._node_gauge("vramfit_gpu_tenants", gpu_rows,
                               np.array([len(tenants.get(k, ())) for k in keys], dtype=np.int64))
        yield GaugeMetricFamily("vramfit_free_vram_bytes", "VRAM no pod holds, all nodes",
                                value=float(int(free.sum()) * MIB))
        yield GaugeMetricFamily("vramfit_stranded_vram_bytes",
                                "VRAM on GPUs in use that no pod holds and no new pod can get, all nodes",
                                value=float(int(stranded.sum()) * MIB))
        yield GaugeMetricFamily("vramfit_reservations", "Pods with units booked whose Binding is not yet confirmed",
                                value=float(len(reservations)))
        yield GaugeMetricFamily("vramfit_reserved_vram_bytes",
                                "VRAM requested by pods whose units are booked but whose Binding is not yet confirmed",
                                value=float(reserved_mib * MIB))
        yield GaugeMetricFamily("vramfit_nodes", "Nodes in the extender's view", value=float(len(names)))
        yield GaugeMetricFamily("vramfit_nodes_unusable", "Nodes whose GPU description could not be parsed",
                                value=float(bad))
        by_reason = GaugeMetricFamily("vramfit_nodes_not_counted", "Nodes not counted as vramfit capacity, by reason "
                                      "(no_agent: no vramfit.io/gpu in status.allocatable; unusable: GPU "
                                      "description unreadable)", labels=["reason"])
        by_reason.add_metric(["no_agent"], float(not_served))
        by_reason.add_metric(["unusable"], float(bad))
        yield by_reason
        yield GaugeMetricFamily("vramfit_conflicted_pods",
                                "Pods bound to a node whose GPU units cannot be recorded (they clash with another "
                                "holder's, or are not on the node any more); recorded as soon as the clash clears",
                                value=float(conflicted))
        yield GaugeMetricFamily("vramfit_ready", "1 once nodes and pods were listed", value=ready)
        yield GaugeMetricFamily("vramfit_state_generation", "Changes applied to the cluster view", value=generation)


PLAN_STATUSES = ("none", "optimal", "feasible", "greedy", "roomy", "empty")


class PlanCollector(Collector):
    """The queue planner (extender/planning/planner.py) at scrape time: plan age, last solve time, status, queue size."""

    def __init__(self, planner: Any, store: Store) -> None:
        self.planner = planner
        self.store = store

    def collect(self) -> Iterator[Metric]:
        planner = self.planner
        plan = planner.plan
        age = planner.age_s()
        queued = len(self.store.queued())
        yield GaugeMetricFamily("vramfit_plan_age_seconds", "Seconds since the current queue plan was published "
                                "(-1 before the first)", value=-1.0 if age is None else float(age))
        yield GaugeMetricFamily("vramfit_plan_solve_seconds", "Wall time of the last queue plan",
                                value=float(plan.solve_s) if plan is not None else 0.0)
        status = GaugeMetricFamily("vramfit_plan_status", "1 for the status of the current queue plan",
                                   labels=["status"])
        current = plan.status if plan is not None else "none"
        for name in dict.fromkeys((*PLAN_STATUSES, current)):
            status.add_metric([name], 1.0 if name == current else 0.0)
        yield status
        yield GaugeMetricFamily("vramfit_plan_placed_pods", "Pods the current queue plan places",
                                value=float(plan.placed) if plan is not None else 0.0)
        yield GaugeMetricFamily("vramfit_pending_queue_pods", "Pending vramfit pods in the queue the planner sees",
                                value=float(queued))
        yield CounterMetricFamily("vramfit_plan_solves", "Queue plans published", value=float(planner.solves))
        yield CounterMetricFamily("vramfit_plan_rechecks", "Rounds where a roomy queue plan was checked again on "
                                  "the live state and published for the current queue, with no solve",
                                  value=float(planner.rechecks))
        yield CounterMetricFamily("vramfit_plan_errors", "Queue plans that failed (the last plan stays)",
                                  value=float(planner.errors))


class Metrics:
    """One registry per app instance (tests create many apps in one process)."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        Info("vramfit_build", "The running vramfit: version and Python", registry=self.registry).info(
            {"version": _version(), "python": platform.python_version()})
        self.latency = Histogram("vramfit_request_duration_seconds", "Extender request latency by verb",
                                 ["verb"], buckets=BUCKETS, registry=self.registry)
        self.requests = Counter("vramfit_requests_total", "Extender requests by verb and HTTP status",
                                ["verb", "code"], registry=self.registry)
        self.filter_nodes = Counter("vramfit_filter_nodes_total",
                                    "Filter verdicts per node: fit, full (FailedNodes), never (FailedAndUnresolvable), "
                                    "shortlist (fits, not among the best shortlist_k: FailedNodes)",
                                    ["result"], registry=self.registry)
        self.binds = Counter("vramfit_binds_total", "Bind outcomes", ["result"], registry=self.registry)
        self.bind_waits = Counter("vramfit_bind_waits_total",
                                  "Binds that waited for the node's previous pod to be admitted, by outcome: "
                                  "cleared (it was admitted, deleted or finished), stale (released after "
                                  "admission_stale_s), busy (still admitting: the bind failed, to be retried)",
                                  ["result"], registry=self.registry)
        self.bind_wait_seconds = Histogram("vramfit_bind_wait_seconds",
                                           "Time binds waited for the node's previous pod to be admitted",
                                           buckets=WAIT_BUCKETS, registry=self.registry)
        self.stale_releases = Counter("vramfit_allocation_stale_releases_total",
                                      "Allocating pods the kubelet never admitted within admission_stale_s, "
                                      "no longer waited for (a Warning Event names each)", registry=self.registry)
        self.preemptions = Counter("vramfit_preempt_nodes_total",
                                   "Preemption candidates kept or dropped", ["result"], registry=self.registry)
        self.queue_binds = Counter("vramfit_queue_binds",
                                   "Pods bound while a queue plan was followed, by how: plan (its planned units), "
                                   "fallback (planned, but the units were no good: the online policy), unplanned "
                                   "(not in the plan: the online policy)", ["via"], registry=self.registry)
        for via in ("plan", "fallback", "unplanned"):
            self.queue_binds.labels(via)  # every series from the start: a rate() needs its zero
        self.registry.register(StoreCollector(store))
