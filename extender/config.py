"""The extender's YAML configuration file.

Example (every key optional)::

    policy: vramfit            # any name from packing.policies.policy_names()
    policy_params: {}          # keyword arguments for that policy's factory
    relax_tenancy: false       # true lets tenants share MPS/time-sliced GPUs (trust rule off)
    reservation_ttl_s: 120     # a bind reservation the API never confirms is dropped after this
    max_body_bytes: 33554432   # requests above this get HTTP 413
    webhook_max_body_bytes: 6291456  # POST /mutate bodies above this get HTTP 413: the API server sends at
                               # most an UPDATE review, two objects each under its 3 MiB request limit
    url_prefix: /vramfit       # verbs are served at {url_prefix}/filter etc. (the chart's and manifests/40-scheduler.yaml's
                               # urlPrefix); left unset, at both /vramfit/filter and /filter
    catalog_path: null         # GPU catalog override file (packing.catalog.load_catalog)
    emit_events: true          # post a "Scheduled"-style Event on each bind
    scheduler_name: vramfit-scheduler  # reportingComponent of those Events
    webhook_scheduler_name: vramfit-scheduler  # schedulerName the admission webhook gives vramfit pods
    admission_wait_s: 5        # a bind to a node waits at most this long for the node's previous pod to be
                               # admitted by its kubelet (keep well under the scheduler's extender
                               # httpTimeout, 10s in manifests/40-scheduler.yaml); then it fails and
                               # kube-scheduler retries the pod later
    scheduler_http_timeout_s: 10  # the scheduler config's extender httpTimeout (manifests/40-scheduler.yaml; the chart
                               # sets it from scheduler.httpTimeout): admission_wait_s must leave 2 s of it for the
                               # Binding, or kube-scheduler gives up on binds that would have succeeded
    admission_stale_s: 60      # a pod still allocating this long after its bind (vramfit.io/bound-at) no
                               # longer holds its node: a Warning Event on it, and binds there resume
    bind_filter_window_s: 300  # bind only a pod (UID) that a filter call named within this many seconds
    nodes_without_agent: []    # nodes counted as vramfit capacity although no vramfit node agent advertises
                               # vramfit.io/gpu there (another device plugin hands out their GPUs, and their pods
                               # carry no vramfit.io/gpu limit); every other node without it is listed as not
                               # capacity (/state, the page, metrics, filter reasons): kube-scheduler never offers it
    device_plugin_resources: {}  # renamed NVIDIA device plugin resources -> what they replicate, so pods
                               # holding them are counted, e.g. {"example.com/t4-shared": "nvidia.com/gpu"}
                               # (nvidia.com/gpu, nvidia.com/mig-<p> and their .shared forms always count)
    planning: true             # plan the whole pending queue with CP-SAT in a worker process and follow the
                               # plan in prioritize and bind (extender/planning/planner.py, packing/planning/follow.py)
    plan_budget_s: 0.5         # time limit of one queue plan (packing.planning.queue_plan.plan_queue)
    plan_min_interval_s: 1.0   # at most one plan per this many seconds (the queue or the cluster changed)
    plan_repack: false         # also re-solve parts the online placement places whole, for fewer GPUs opened
                               # (false: the plan wins pods the online policy leaves out, and leaves the other
                               # pods to the online policy at their turn; queue.md measures both)
    plan_max_pods: 1000        # the planner plans at most this many pending pods a round (the most urgent,
                               # then the oldest); the rest go by the online policy
    term_relist_deadline_s: 20 # a new leader whose fresh list of nodes and pods has not succeeded by then (retried
                               # meanwhile) releases the Lease and fails /healthz until its lists work: a failing
                               # term recovers or hands over to the standby within 30 s (extender/leader.py)
    signing_key_file: null     # the shared HMAC key file (one key per line, >= 32 bytes; the first signs, any
                               # verifies): each Binding's assignment is signed with it, and a bound pod's
                               # assignment is booked only when its signature verifies (--signing-key overrides)
    allow_unsigned: false      # INSECURE: let cluster mode run without a signing key; then any pod author's
                               # hand-written assignment is booked as written (tests and dev clusters only)
    plan_cpus: 0               # how many CPUs the planner's worker gets to itself: the highest-numbered it may use;
                               # the server's threads move to the others (extender/planning/cpus.py). For CPUs the container
                               # has to itself (integer CPU request, static CPU manager); 0 pins nothing
    dra: auto                  # allocate DRA ResourceClaims (resource.k8s.io/v1): auto = when the API server serves
                               # it (Kubernetes >= 1.34; said once in the log when it does not), true, false
    dra_device_classes: [gpu.nvidia.com, mig.nvidia.com]  # DeviceClasses whose claims vramfit allocates: the
                               # webhook gates pods asking for them (vramfit.io/allocate) and the leader allocates
    dra_batch_window_s: 0.05   # gated pods arriving within this window are allocated as one batch (planned together)
    dra_batch_max_pods: 200    # at most this many gated pods per batch (the oldest first)
    shortlist_k: 128           # filter passes a pod only the best this many of the nodes it fits, by the policy's
                               # score (the others are left out of the answer, which kube-scheduler reads as
                               # filtered; no reasons are sent: the pod fits), so prioritize and
                               # kube-scheduler score K nodes, not thousands; the node prioritize would rank first
                               # is always kept (the plan's node too), and a pod fitting at most 2 K nodes gets
                               # them all. 0 = off (benchmarks/results/shortlist.md measures the choice)

The mutating admission webhook (`POST /mutate`, extender/webhook.py) sets `spec.schedulerName` to
`webhook_scheduler_name` on pods that ask for vramfit.io/vram and name no scheduler (or default-scheduler);
it must be a profile of the kube-scheduler that calls this extender (manifests/40-scheduler.yaml).

The admission keys apply to a live cluster (--kubeconfig / --in-cluster) only: one vramfit pod per node may be
allocating and not yet admitted at a time, so the node agent can tell which pod an Allocate call is for
(extender/admission.py). Snapshot mode has no kubelet and never waits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from kubeio.config_file import load_yaml_model
from packing.dra.nodes import DEFAULT_CLASSES
from packing.vendors.nvidia.plugin_names import DevicePluginNames

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


BINDING_S = 2.0  # what a bind needs after its wait: the Binding write and its answer


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the key."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = "vramfit"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    relax_tenancy: bool = False
    reservation_ttl_s: float = Field(default=120.0, gt=0)
    # 500 full Node objects are ~2-3 MB; leave ample room but stop a runaway body early.
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    url_prefix: str = "/vramfit"
    catalog_path: str | None = None
    emit_events: bool = True
    scheduler_name: str = "vramfit-scheduler"
    scheduler_http_timeout_s: float = Field(default=10.0, gt=0)  # before admission_wait_s: its check reads it
    admission_wait_s: float = Field(default=5.0, ge=0, validate_default=True)
    admission_stale_s: float = Field(default=60.0, gt=0)
    bind_filter_window_s: float = Field(default=300.0, gt=0)
    device_plugin_resources: dict[str, str] = Field(default_factory=dict)
    nodes_without_agent: list[str] = Field(default_factory=list)
    webhook_scheduler_name: str = "vramfit-scheduler"
    planning: bool = True
    plan_budget_s: float = Field(default=0.5, gt=0, le=60)
    plan_min_interval_s: float = Field(default=1.0, ge=0)
    plan_repack: bool = False
    plan_cpus: int = Field(default=0, ge=0)
    signing_key_file: str | None = None
    allow_unsigned: bool = False
    term_relist_deadline_s: float = Field(default=20.0, gt=0)
    # The largest AdmissionReview: object and oldObject, each within the API server's 3 MiB request body
    # limit (etcd holds objects under ~1.5 MiB); anything larger is not from the API server.
    webhook_max_body_bytes: int = Field(default=6 * 1024 * 1024, ge=1024)
    # The planner plans at most this many pending pods a round (the most urgent, then the oldest): its
    # round stays within plan_budget_s whatever the queue's size; the rest go by the online policy.
    plan_max_pods: int = Field(default=1000, ge=1)
    dra: Literal["auto", True, False] = "auto"
    dra_device_classes: list[str] = Field(default_factory=lambda: list(DEFAULT_CLASSES))
    dra_batch_window_s: float = Field(default=0.05, ge=0.0, le=5.0)
    dra_batch_max_pods: int = Field(default=200, ge=1)
    # Filter's shortlist (extender/verbs/shortlist.py); the default is measured in benchmarks/results/shortlist.md.
    shortlist_k: int = Field(default=128, ge=0)

    @field_validator("admission_wait_s")
    @classmethod
    def _wait_within_bind_timeout(cls, value: float, info: ValidationInfo) -> float:
        timeout = info.data.get("scheduler_http_timeout_s")
        if timeout is not None and value + BINDING_S > timeout:
            raise ValueError(
                f"{value:g} s is more than scheduler_http_timeout_s ({timeout:g} s, kube-scheduler's extender "
                f"httpTimeout) minus {BINDING_S:g} s: kube-scheduler gives up on a bind after httpTimeout, and a bind "
                "may wait admission_wait_s for the node's previous pod before it writes the Binding")
        return value

    @field_validator("device_plugin_resources")
    @classmethod
    def _known_meanings(cls, value: dict[str, str]) -> dict[str, str]:
        DevicePluginNames(value)  # raises InputError (a ValueError) naming the bad entry
        return value

    @field_validator("nodes_without_agent")
    @classmethod
    def _node_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
                raise ValueError(f"not a node name (a DNS subdomain): {name!r}")
        return value

    @field_validator("webhook_scheduler_name")
    @classmethod
    def _scheduler_name(cls, value: str) -> str:
        # The API server rejects a pod whose schedulerName is not a DNS subdomain; better to fail at startup.
        if not _DNS_SUBDOMAIN.match(value) or len(value) > 253:
            raise ValueError(f"not a valid scheduler name (a DNS subdomain): {value!r}")
        return value

    @property
    def verb_prefixes(self) -> tuple[str, ...]:
        """The prefixes the verbs are served under: the configured one; left unset, also none at all (a
        scheduler config written for `vramfit serve` without a config file, whose urlPrefix has no path)."""
        if "url_prefix" in self.model_fields_set:
            return (self.url_prefix,)
        return (self.url_prefix, "")

    @field_validator("url_prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        # kube-scheduler strips trailing slashes from urlPrefix and appends "/verb"; mirror that.
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            value = "/" + value
        if any(c.isspace() for c in value) or "?" in value or "#" in value:
            raise ValueError(f"not a URL path: {value!r}")
        return value


def load_settings(path: str | Path | None) -> Settings:
    """Read a YAML config file (None = defaults)."""
    return Settings() if path is None else load_yaml_model(path, Settings, ConfigError)
