"""DRA allocation at scrape time, in the extender's one registry: DRA nodes, claims allocated, pods kept at the gate
(from the store's `DraBook`), allocations and failures (the allocator's counters), and the time from a pod's first
sight at the gate to its ungating (`DraAllocator.latencies`).

The histogram's counts live here: each scrape adds only the latencies appended since the last one, so a scrape costs
the new samples, not the whole history."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from extender.dra.allocator import DraAllocator

# A batch window is 0.05 s by default; a gated pod is ungated within a round or two, seconds when writes conflict.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class LatencyHistogram:
    """Cumulative bucket counts of an append-only list of seconds, read incrementally."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0
    read: int = 0  # samples of the list taken so far

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def take(self, samples: list[float]) -> None:
        if len(samples) < self.read:  # the list was replaced: what it holds now is all new
            self.read = 0
        new = samples[self.read:]  # a copy: the allocator's thread may append meanwhile
        self.read += len(new)
        for s in new:
            self.counts[bisect.bisect_left(self.bounds, s)] += 1  # le: a sample equal to a bound is in it
            self.total += s

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            buckets.append((floatToGoString(bound), float(running)))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.total)


class DraCollector(Collector):
    """`vramfit_dra_nodes`, `vramfit_dra_claims_allocated`, `vramfit_dra_pods_waiting`,
    `vramfit_dra_allocations_total`, `vramfit_dra_allocation_failures_total`,
    `vramfit_dra_gate_to_allocation_seconds`."""

    def __init__(self, allocator: DraAllocator) -> None:
        self.allocator = allocator
        self.latency = LatencyHistogram()
        self._lock = threading.Lock()  # two scrapes at once must not take the same samples twice

    def collect(self) -> Iterator[Metric]:
        store = self.allocator.store
        with store.lock:
            book = store.dra
            nodes = len(book.inventory.nodes) if book is not None else 0
            allocated = sum(1 for c in book.claims.values() if c.allocation is not None) if book is not None else 0
            waiting = len(book.waiting) if book is not None else 0
        with self._lock:
            self.latency.take(self.allocator.latencies)
            latency = self.latency.family("vramfit_dra_gate_to_allocation_seconds",
                                          "Seconds from a gated pod's first sight to the removal of its gate")
        yield GaugeMetricFamily("vramfit_dra_nodes", "Nodes whose devices DRA drivers publish in ResourceSlices",
                                value=float(nodes))
        yield GaugeMetricFamily("vramfit_dra_claims_allocated", "ResourceClaims with an allocation",
                                value=float(allocated))
        yield GaugeMetricFamily("vramfit_dra_pods_waiting", "Pods kept at the gate vramfit.io/allocate because "
                                "their claims cannot be allocated now", value=float(waiting))
        yield CounterMetricFamily("vramfit_dra_allocations", "Pods whose claims vramfit allocated and ungated",
                                  value=float(self.allocator.allocated_total))
        yield CounterMetricFamily("vramfit_dra_allocation_failures", "Rounds in which a pod's claims could not be "
                                  "allocated (no device fits, or a write was refused)",
                                  value=float(self.allocator.failed_total))
        yield latency
