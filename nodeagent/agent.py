"""The node agent's loops, wired together: inventory -> devices + annotation + MPS daemons; reconcile.

    every publish interval: read the hardware -> advertised devices (ListAndWatch resent on change),
                            MPS daemons for the MPS GPUs, node annotations (written on change)
    every reconcile interval: the kubelet's pod-resources view vs the ledger
    every usage period: NVML per process -> per-pod used / booked / peak (metrics, vramfit.io/pod-usage at most
                        every usage_publish_s), over-use Events, evictions with over_use: evict (docs/usage.md)
    all the time: the device plugin socket, re-registered after each kubelet restart
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.allocate import AnswerSettings, Trust, hami_core_settings
from nodeagent.config import AgentConfig
from nodeagent.inventory import InventorySource
from nodeagent.ledger import Ledger
from nodeagent.metrics import AgentMetrics
from nodeagent.mps import MpsSupervisor, mps_gpus
from nodeagent.nvml import NvmlUnavailable
from nodeagent.overuse import REASON, Evictor, OverUse, OverUseWatch, act
from nodeagent.plugin import PluginContext, PluginServer
from nodeagent.pods import PodSource
from nodeagent.publish import Publisher, annotations_for
from nodeagent.reconcile import Divergence, Reconciler
from nodeagent.runtime_config import SELECTIONS, RuntimeVerdict
from nodeagent.usage import UsageSampler
from packing.k8s.pod_usage import ANN_POD_USAGE, NodeUsageReport, usage_annotation

log = logging.getLogger("vramfit.node")


@dataclass
class AgentOptions:
    node_name: str
    plugin_dir: str
    pod_resources_socket: str | None
    mps_control: str = "nvidia-cuda-mps-control"
    state_dir: str | None = None
    trust: Trust = Trust(keys=None)  # whose assignments Allocate believes (no key: nobody's)
    mps_root: str | None = None  # replaces the config's MPS root (a dry run keeps its pipes in its own directory)
    runtime: RuntimeVerdict = RuntimeVerdict("unknown", "the NVIDIA runtime's config was not checked")


class NodeAgent:
    def __init__(self, options: AgentOptions, config: AgentConfig, inventory: InventorySource, pods: PodSource,
                 publisher: Publisher, metrics: AgentMetrics | None = None, *, usage_nvml: Any = None,
                 evictor: Evictor | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.config = config
        self.inventory = inventory
        self.publisher = publisher
        self.metrics = metrics if metrics is not None else AgentMetrics(options.node_name)
        ledger_path = Path(options.state_dir) / "allocations.json" if options.state_dir else None
        if ledger_path is not None:
            ledger_path.parent.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(ledger_path)
        self._lock = threading.Lock()
        self._published: list[dict[str, Any]] = []
        self._unhealthy: list[dict[str, Any]] = []
        self.mps: MpsSupervisor | None = None
        self._mps_key: tuple[tuple[str, int | None], ...] = ()
        self.mps_root = options.mps_root or config.mps.root
        settings = AnswerSettings(strategy=config.device_list_strategy, cdi_kind=config.cdi_kind,
                                  mps_thread_percentage=config.mps.active_thread_percentage,
                                  mps_shm_dir=str(Path(self.mps_root) / "shm"),
                                  hami_core=hami_core_settings(config))
        self.ctx = PluginContext(node_name=options.node_name, published=self.published, pods=pods,
                                 settings=settings, mps_pipe_dirs=self.mps_pipe_dirs, ledger=self.ledger,
                                 metrics=self.metrics, lookup_s=config.allocate_lookup_s, trust=options.trust)
        self.plugin = PluginServer(self.ctx, options.plugin_dir)
        self.reconciler = (Reconciler(options.pod_resources_socket, self.ledger, self._report_divergence,
                                      self._reconciled)
                           if options.pod_resources_socket else None)
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self.pods = pods
        self.usage = UsageSampler(proc_root=config.proc_root, period_s=config.usage_period_s, nvml=usage_nvml)
        self.overuse = OverUseWatch(policy=config.over_use, grace_s=config.over_use_grace_s)
        self.evictor = evictor
        self.clock = clock
        self._usage_text: str | None = None  # the annotation as last published
        self._usage_published_at: float | None = None
        self._usage_off = False  # NVML cannot be used here (said once in the log)

    # -- views the plugin reads -------------------------------------------------------------------
    def published(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._published)

    def mps_pipe_dirs(self) -> dict[str, str]:
        """GPU UUID -> pipe directory, for the MPS GPUs whose control daemon is healthy now."""
        mps = self.mps
        return mps.pipe_dirs() if mps is not None else {}

    def health(self) -> dict[str, Any]:
        mps = self.mps.health() if self.mps is not None else {}
        return {"unhealthy_gpus": self._unhealthy, "mps": mps, "gpu_selection": self.options.runtime.selection}

    # -- the inventory loop -----------------------------------------------------------------------
    def refresh_inventory(self) -> None:
        gpus = self.inventory.read()
        unhealthy = list(getattr(self.inventory, "unhealthy", lambda: [])())
        with self._lock:
            self._published = gpus
            self._unhealthy = unhealthy
        self.metrics.gpus.labels("healthy").set(len(gpus))
        self.metrics.gpus.labels("unhealthy").set(len(unhealthy))
        if self.ctx.devices.update(gpus):
            self.ctx.devices_changed()
        self._sync_mps(gpus)
        self.publish()

    def _sync_mps(self, gpus: list[dict[str, Any]]) -> None:
        wanted = mps_gpus(gpus)
        key = tuple((g.uuid, g.replicas) for g in wanted)
        if key == self._mps_key:
            return
        if self.mps is not None:
            self.mps.stop()
            self.mps = None
        self._mps_key = key
        if wanted:
            self.mps = MpsSupervisor(control_path=self.options.mps_control, root=self.mps_root, gpus=wanted,
                                     thread_percentage=self.config.mps.active_thread_percentage)
            self.mps.start()

    def publish(self) -> None:
        health = self.health()
        self.metrics.set_mps(health["mps"])
        annotations = annotations_for(self.published(), health)
        if self._usage_text is not None:
            annotations[ANN_POD_USAGE] = self._usage_text
        try:
            self.publisher.publish(annotations)
            self.metrics.publishes.labels("ok").inc()
        except Exception as err:  # noqa: BLE001 - the API may be away: the next pass tries again
            self.metrics.publishes.labels("failed").inc()
            log.warning("publishing the node annotations failed: %s", err)

    # -- per-pod usage ----------------------------------------------------------------------------
    def sample_usage(self) -> NodeUsageReport | None:
        """One usage pass: sample, export, act on over-use, publish when due. None when NVML is not usable."""
        if self._usage_off:
            return None
        try:
            report = self.usage.sample(self.published(), self.pods.pods(), self.ledger.answers(), self.options.trust)
        except NvmlUnavailable as err:
            self._usage_off = True
            log.warning("per-pod VRAM usage is off on %s: %s", self.options.node_name, err)
            return None
        for problem in self.usage.problems:
            log.warning("per-pod VRAM usage: %s", problem)
        self.metrics.set_usage(report)
        actions = self.overuse.step(report, self.clock())
        for line in act(actions, self.overuse, self.evictor if self.config.over_use == "evict" else None,
                        self._warn_over, self._count_over):
            log.warning("%s", line)
        self._publish_usage(report)
        return report

    def _warn_over(self, o: OverUse) -> None:
        self.publisher.event(o.namespace, o.pod, o.uid, REASON, o.message(), warning=True)

    def _count_over(self, kind: str) -> None:
        (self.metrics.overuse_events if kind == "event" else self.metrics.overuse_evictions).inc()

    def _publish_usage(self, report: NodeUsageReport) -> None:
        now = self.clock()
        due = self._usage_published_at is None or now - self._usage_published_at >= self.config.usage_publish_s
        text = usage_annotation(report)
        if not due or _without_time(text) == _without_time(self._usage_text):
            return
        self._usage_text = text
        self._usage_published_at = now
        self.publish()

    # -- reconcile --------------------------------------------------------------------------------
    def _report_divergence(self, d: Divergence) -> None:
        uid = next((a.uid for a in self.ledger.answers() if a.pod == f"{d.namespace}/{d.pod}"), "")
        self.publisher.event(d.namespace, d.pod, uid, "VramfitDeviceDivergence", d.message, warning=True)

    def _reconciled(self, result: str, divergences: int) -> None:
        self.metrics.reconciles.labels(result).inc()
        self.metrics.divergences.set(divergences)

    # -- run --------------------------------------------------------------------------------------
    def _every(self, seconds: float, fn: Any, name: str) -> None:
        def loop() -> None:
            while not self.stop_event.wait(seconds):
                try:
                    fn()
                except Exception:  # noqa: BLE001 - one failed pass must not end the loop
                    log.exception("%s failed", name)

        t = threading.Thread(target=loop, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _warn_about_trust(self) -> None:
        trust = self.options.trust
        if trust.keys is not None:
            return
        if trust.allow_unsigned:
            log.warning("INSECURE: Allocate believes unsigned vramfit.io/assignment annotations "
                        "(allow_unsigned): any pod author on %s can name any unit; single tenant or dry run only",
                        self.options.node_name)
        else:
            log.error("no signing key: every Allocate on %s is refused", self.options.node_name)

    def _report_runtime(self) -> None:
        verdict = self.options.runtime
        for state in SELECTIONS:
            self.metrics.gpu_selection.labels(state).set(1 if state == verdict.selection else 0)
        if verdict.selection == "open":
            log.warning("INSECURE: tenants' GPUs are not apart on %s: %s", self.options.node_name, verdict.why)
        elif verdict.selection == "unknown":
            log.warning("%s", verdict.why)
        else:
            log.info("%s", verdict.why)

    def start(self) -> NodeAgent:
        self._warn_about_trust()
        self._report_runtime()
        self.refresh_inventory()
        self.plugin.start()
        self._every(self.config.publish_interval_s, self.refresh_inventory, "inventory")
        # MPS health changes faster than the hardware: publish it on a short period (written on change only).
        self._every(min(5.0, self.config.publish_interval_s), self.publish, "health")
        if self.reconciler is not None:
            self._every(self.config.reconcile_interval_s, self.reconciler.run_once, "reconcile")
        if self.config.usage_period_s > 0:
            self._every(self.config.usage_period_s, self.sample_usage, "usage")
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.plugin.stop()
        if self.mps is not None:
            self.mps.stop()


def _without_time(text: str | None) -> Any:
    """The annotation's content but its sample time: a report that only got older is not a change."""
    if text is None:
        return None
    doc = json.loads(text)
    doc.pop("sampled_at", None)
    return doc
