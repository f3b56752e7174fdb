"""One extender replica in cluster mode, assembled: store, reflectors, binder with its gate and write fence,
leader election, and the app — the same parts `vramfit serve` runs and the HA tests start twice.

A standby keeps its cache warm (its reflectors run), reports not ready (the Service routes to the leader
alone), and answers verbs with 503 should a call reach it anyway: kube-scheduler then retries the pod.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fastapi import FastAPI
from kubernetes import client as kclient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from extender.admission import AdmissionGate
from extender.app import create_app
from extender.binder import KubeBinder
from extender.config import Settings
from extender.dra.allocator import DraAllocator, dra_enabled
from extender.dra.metrics import DraCollector
from extender.dra.writer import ClaimWriter
from extender.kube import KubeSource
from extender.leader import LeaderElector, LeadershipTerm, LeaseConfig
from extender.listeners import send_error
from extender.store import Store, agent_rule
from kubeio.reflector import DRA_KINDS, KINDS, Backoff
from packing.catalog import Catalog
from packing.k8s.trust import SigningKeys
from packing.policies import get_policy
from packing.vendors.nvidia.plugin_names import DevicePluginNames

VERBS = ("filter", "prioritize", "bind", "preempt")


def standby_gate(app: ASGIApp, serving: Callable[[], bool], url_prefixes: tuple[str, ...]) -> ASGIApp:
    """Verb calls to a replica that is not serving (standby, or a leader whose term is not ready) get 503."""
    verb_paths = {f"{prefix}/{v}" for prefix in url_prefixes for v in VERBS}

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in verb_paths and not serving():
            await send_error(send, 503, "standby replica: not the leader, or its leadership term is not ready yet")
            return
        await app(scope, receive, send)

    return gated


class LeaderCollector(Collector):
    """`vramfit_leader` (1 on the serving leader), `vramfit_leader_term`, `vramfit_leader_terms_won_total`."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def collect(self) -> Iterator[Metric]:
        elector = self.replica.elector
        assert elector is not None
        yield GaugeMetricFamily("vramfit_leader", "1 when this replica holds the Lease and its term is ready",
                                value=1.0 if self.replica.serving() else 0.0)
        yield GaugeMetricFamily("vramfit_leader_term", "Leadership terms this replica has begun", value=elector.term)
        yield CounterMetricFamily("vramfit_leader_terms_won", "Times this replica acquired the Lease",
                                  value=elector.transitions)


@dataclass
class Replica:
    store: Store
    source: KubeSource
    binder: KubeBinder
    app: FastAPI
    asgi: ASGIApp
    elector: LeaderElector | None
    term: LeadershipTerm | None
    dra: DraAllocator | None = None
    _dra_stop: threading.Event = field(default_factory=threading.Event)

    def serving(self) -> bool:
        return self.source.ready.is_set() and (self.term is None or self.term.ready())

    def why_not_serving(self) -> str | None:
        """/readyz's words: leader or standby, which kind's list is missing and since when."""
        role = self.term.why_not_ready() if self.term is not None else None
        unlisted = self.source.not_listed()
        return "; ".join(w for w in (role, unlisted) if w) or None

    def start(self) -> Replica:
        if self.elector is not None:
            self.elector.start()
        if self.dra is not None:
            threading.Thread(target=self.dra.run, args=(self._dra_stop,), name="dra-allocator", daemon=True).start()
        return self

    def stop(self, release: bool = True) -> None:
        self._dra_stop.set()
        if self.elector is not None:
            self.elector.stop(release=release)
        self.source.stop()


def cluster_replica(api: kclient.ApiClient, settings: Settings, catalog: Catalog, *,
                    lease: LeaseConfig | None, backoff: Callable[[], Backoff] | None = None,
                    keys: SigningKeys | None = None) -> Replica:
    """Assemble (and start the reflectors of) one replica; `start()` joins the election. `keys` sign each
    Binding's assignment, and only assignments they verify are booked (None: as written, `allow_unsigned`)."""
    store = Store(catalog, relax_tenancy=settings.relax_tenancy, reservation_ttl_s=settings.reservation_ttl_s,
                  device_plugin_names=DevicePluginNames(settings.device_plugin_resources), signing_keys=keys,
                  serves=agent_rule(settings.nodes_without_agent))
    binder = KubeBinder(api, emit_events=settings.emit_events, reporting_component=settings.scheduler_name,
                        keys=keys)
    if settings.emit_events:
        store.on_conflict = lambda c: binder.post_event(c.namespace, c.name, c.uid, reason=c.event_reason,
                                                        message=c.message, event_type="Warning")
    dra_on = dra_enabled(api, settings.dra)
    if dra_on:
        store.enable_dra(settings.dra_device_classes)
    source = KubeSource(api, store, backoff=backoff, kinds=KINDS + DRA_KINDS if dra_on else KINDS).start()
    # Live kubelets admit the pods: one allocating pod per node at a time (snapshot mode has no gate).
    binder.admission = AdmissionGate(store, binder, wait_s=settings.admission_wait_s,
                                     stale_s=settings.admission_stale_s)
    elector = term = None
    if lease is not None:
        elector = LeaderElector(api, lease)
        term = LeadershipTerm(elector, source, relist_deadline_s=settings.term_relist_deadline_s)
        binder.fence = elector.fresh
        binder.timeout_s = min(binder.timeout_s, lease.write_budget_s)
    replica = Replica(store, source, binder, FastAPI(), FastAPI(), elector, term)
    if dra_on:
        writer = ClaimWriter(api, component=settings.scheduler_name, fence=elector.fresh if elector else None)
        replica.dra = DraAllocator(store, writer, get_policy(settings.policy, **settings.policy_params),
                                   serving=replica.serving, window_s=settings.dra_batch_window_s,
                                   max_pods=settings.dra_batch_max_pods)
    replica.app = create_app(settings, store, binder, ready=replica.serving)
    replica.app.state.readiness = replica.why_not_serving
    replica.app.state.liveness = term.unhealthy if term is not None else None
    if elector is not None:
        replica.app.state.services.metrics.registry.register(LeaderCollector(replica))
    if replica.dra is not None:
        replica.app.state.services.metrics.registry.register(DraCollector(replica.dra))
    replica.asgi = standby_gate(replica.app, replica.serving, settings.verb_prefixes) if elector else replica.app
    return replica
