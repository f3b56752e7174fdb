"""Prometheus metrics: request latency and decisions per verb, plus a scrape-time view of the store."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.store import Store

# Filter/prioritize answer in well under 10 ms; bind includes two API round trips.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StoreCollector(Collector):
    """Free VRAM per node, stranded VRAM, reservations, readiness: read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        free = GaugeMetricFamily("vramfit_node_free_vram_mib", "VRAM no pod holds, per node (MiB)", labels=["node"])
        largest = GaugeMetricFamily("vramfit_node_largest_free_unit_mib",
                                    "Largest VRAM one new pod could get on the node now (MiB)", labels=["node"])
        with self.store.lock:
            state = self.store.state
            names = state.node_names
            present = state.present
            pool = (state.pool_free * present).sum(axis=1)
            unit = (state.unit_max * present).max(axis=1) if len(names) else pool
            for i, name in enumerate(names):
                free.add_metric([name], float(pool[i]))
                largest.add_metric([name], float(unit[i]))
            stranded = float(state.stranded_mib())
            reservations = float(len(self.store.reservations))
            nodes = float(len(names))
            bad = float(len(self.store.bad_nodes))
            ready = 1.0 if self.store.ready else 0.0
            generation = float(self.store.generation)
        yield free
        yield largest
        yield GaugeMetricFamily("vramfit_stranded_vram_mib",
                                "VRAM on GPUs in use that no pod holds and no new pod can get (MiB)", value=stranded)
        yield GaugeMetricFamily("vramfit_reservations", "Pods with units booked whose Binding is not yet confirmed",
                                value=reservations)
        yield GaugeMetricFamily("vramfit_nodes", "Nodes in the extender's view", value=nodes)
        yield GaugeMetricFamily("vramfit_nodes_unusable", "Nodes whose GPU description could not be parsed", value=bad)
        yield GaugeMetricFamily("vramfit_ready", "1 once nodes and pods were listed", value=ready)
        yield GaugeMetricFamily("vramfit_state_generation", "Changes applied to the cluster view", value=generation)


class Metrics:
    """One registry per app instance (tests create many apps in one process)."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("vramfit_request_duration_seconds", "Extender request latency by verb",
                                 ["verb"], buckets=BUCKETS, registry=self.registry)
        self.requests = Counter("vramfit_requests_total", "Extender requests by verb and HTTP status",
                                ["verb", "code"], registry=self.registry)
        self.filter_nodes = Counter("vramfit_filter_nodes_total",
                                    "Filter verdicts per node: fit, full (FailedNodes), never (FailedAndUnresolvable)",
                                    ["result"], registry=self.registry)
        self.binds = Counter("vramfit_binds_total", "Bind outcomes", ["result"], registry=self.registry)
        self.preemptions = Counter("vramfit_preempt_nodes_total",
                                   "Preemption candidates kept or dropped", ["result"], registry=self.registry)
        self.registry.register(StoreCollector(store))
