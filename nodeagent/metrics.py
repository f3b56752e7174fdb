"""The node agent's Prometheus metrics and its small HTTP endpoint (`/metrics`, `/healthz`).

Every Allocate decision is counted by result; the advertised devices by health; each MPS daemon's health
and restarts; divergences between the agent's answers and the kubelet's pod-resources view; each pod's VRAM
used, booked and peak per unit, over-use and evictions, and VRAM of processes no pod claims (docs/usage.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from packing.k8s.pod_usage import NodeUsageReport

disable_created_metrics()  # no `_created` twin for every counter and histogram
USAGE_LABELS = ["namespace", "pod", "container", "gpu_uuid", "unit"]
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AgentMetrics:
    def __init__(self, node_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.node = node_name
        self.allocations = Counter("vramfit_node_allocations", "Allocate calls answered, by result",
                                   ["result"], registry=r)
        self.allocate_seconds = Histogram("vramfit_node_allocate_seconds", "Allocate latency (incl. API re-reads)",
                                          buckets=BUCKETS, registry=r)
        self.units = Counter("vramfit_node_units_handed_out", "Units handed to containers, by mode", ["mode"],
                             registry=r)
        self.devices = Gauge("vramfit_node_devices", "Advertised vramfit.io/gpu devices, by health", ["health"],
                             registry=r)
        self.gpu_selection = Gauge("vramfit_node_gpu_selection",
                                   "1 for what the NVIDIA runtime's config lets a container do: open (any container "
                                   "may name GPUs through NVIDIA_VISIBLE_DEVICES), closed (only the device plugin's "
                                   "units), unknown (not checked)", ["state"], registry=r)
        self.registrations = Counter("vramfit_node_registrations", "Registrations with the kubelet, by result",
                                     ["result"], registry=r)
        self.publishes = Counter("vramfit_node_inventory_publishes", "Node annotation writes, by result",
                                 ["result"], registry=r)
        self.gpus = Gauge("vramfit_node_gpus", "GPUs seen through the inventory, by health", ["health"],
                          registry=r)
        self.mps_healthy = Gauge("vramfit_node_mps_daemon_healthy", "1 when the GPU's MPS control daemon answers",
                                 ["uuid"], registry=r)
        self.mps_restarts = Gauge("vramfit_node_mps_daemon_restarts", "Restarts of the GPU's MPS control daemon",
                                  ["uuid"], registry=r)
        self.divergences = Gauge("vramfit_node_reconcile_divergences",
                                 "Containers whose kubelet devices differ from the agent's answer (last pass)",
                                 registry=r)
        self.reconciles = Counter("vramfit_node_reconciles", "Pod-resources comparisons, by result", ["result"],
                                  registry=r)
        self.pod_used = Gauge("vramfit_pod_vram_used_bytes", "VRAM a container's processes use on a GPU unit "
                              "(NVML per process; absent while NVML cannot tell)", USAGE_LABELS, registry=r)
        self.pod_booked = Gauge("vramfit_pod_vram_booked_bytes", "VRAM vramfit booked for the pod on the unit",
                                USAGE_LABELS, registry=r)
        self.pod_peak = Gauge("vramfit_pod_vram_peak_bytes", "Most VRAM seen in use since the pod started",
                              USAGE_LABELS, registry=r)
        self.pod_over = Gauge("vramfit_pod_vram_over_booking", "1 while the pod uses more than its booking on a "
                              "shared unit", USAGE_LABELS, registry=r)
        self.unmapped = Gauge("vramfit_unmapped_process_vram_bytes", "VRAM of processes no pod's cgroup claims "
                              "(known figures only)", ["gpu_uuid"], registry=r)
        self.overuse_events = Counter("vramfit_overuse_events", "Pods found above their VRAM booking (one per "
                                      "episode)", registry=r)
        self.overuse_evictions = Counter("vramfit_overuse_evictions", "Pods evicted for staying above their VRAM "
                                         "booking", registry=r)

    def allocation(self, result: str, seconds: float) -> None:
        self.allocations.labels(result).inc()
        self.allocate_seconds.observe(seconds)

    def registration(self, result: str) -> None:
        self.registrations.labels(result).inc()

    def set_devices(self, devices: Iterable[Any]) -> None:
        counts = {"Healthy": 0, "Unhealthy": 0}
        for d in devices:
            counts[d.health] = counts.get(d.health, 0) + 1
        for health, n in counts.items():
            self.devices.labels(health).set(n)

    def set_mps(self, health: dict[str, dict[str, Any]]) -> None:
        for uuid, h in health.items():
            self.mps_healthy.labels(uuid).set(1 if h.get("healthy") else 0)
            self.mps_restarts.labels(uuid).set(int(h.get("restarts", 0)))

    def set_usage(self, report: NodeUsageReport) -> None:
        """The gauges from one sample (label sets of pods gone are dropped)."""
        for g in (self.pod_used, self.pod_booked, self.pod_peak, self.pod_over, self.unmapped):
            g.clear()
        for u in report.pods:
            labels = (u.namespace, u.pod, u.container, u.gpu_uuid, u.unit)
            if u.used_bytes is not None:
                self.pod_used.labels(*labels).set(u.used_bytes)
            if u.booked_bytes is not None:
                self.pod_booked.labels(*labels).set(u.booked_bytes)
            if u.peak_bytes is not None:
                self.pod_peak.labels(*labels).set(u.peak_bytes)
            self.pod_over.labels(*labels).set(1 if u.over else 0)
        unmapped: dict[str, int] = {}
        for p in report.unmapped:
            unmapped[p.gpu_uuid] = unmapped.get(p.gpu_uuid, 0) + (p.used_bytes or 0)
        for gpu, n in unmapped.items():
            self.unmapped.labels(gpu).set(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def serve_http(metrics: AgentMetrics, host: str, port: int, healthy: Callable[[], bool]) -> ThreadingHTTPServer:
    """`/metrics` and `/healthz` (200 once registered with the kubelet, else 503) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            if self.path == "/metrics":
                body, ctype, code = metrics.exposition(), CONTENT_TYPE_LATEST, 200
            elif self.path == "/healthz":
                ok = healthy()
                body, ctype, code = (b"ok\n" if ok else b"not registered with the kubelet\n"), "text/plain", (
                    200 if ok else 503)
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="agent-http", daemon=True).start()
    return server
