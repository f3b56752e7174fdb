"""The node agent's configuration file (a ConfigMap mounted into the DaemonSet).

Example (every key optional)::

    default:                      # sharing mode of GPUs not in MIG mode
      mode: exclusive             # exclusive | mps | timeslice
      replicas: null              # mps: equal split into N shares (null = per-pod pinned limits);
                                  # timeslice: N replicas (required, >= 2)
    gpus:                         # per-GPU overrides, matched by index or UUID
      - match: "1"
        mode: mps
        replicas: 4
    nodes:                        # per-node sections (one ConfigMap for a whole cluster)
      gpu-node-7:
        default: {mode: timeslice, replicas: 4}
    mps:
      root: /run/nvidia/mps       # one pipe and one log directory per GPU under it
      active_thread_percentage: null   # int 1..100, "auto" (= 100 / replicas) or null (no limit)
    device_list_strategy: envvar  # envvar | volume-mounts | cdi (README "Trust model": which one a node needs)
    cdi_kind: nvidia.com/gpu      # CDI kind for the cdi strategy (NVIDIA's own plugin uses k8s.device-plugin.nvidia.com/gpu)
    nvidia_runtime_config: null   # the NVIDIA Container Toolkit's config.toml as mounted in the agent: checked at
                                  # start (nodeagent/runtime_config.py); null = not checked
    open_runtime: warn            # warn | refuse: a runtime that lets any container name GPUs by env (or one not
                                  # checked): start with a warning, or refuse to start
    allocate_lookup_s: 3.0        # Allocate: how long to re-read the API for the pod being admitted
    publish_interval_s: 30        # hardware re-read / annotation re-publish period
    reconcile_interval_s: 30      # pod-resources comparison period
    signing_key_file: /etc/vramfit/signing/key   # the key vramfit serve signs assignments with (--signing-key)
    allow_unsigned: false         # INSECURE: without a key, believe unsigned assignments (single tenant or dry run)
    timeslice_enforcement: none   # none | hami-core: cap each time-slice container at its booked VRAM (docs/hami-core.md)
    hami_core_library: null       # host path of HAMi-core's libvgpu.so (required with hami-core)
    hami_core_cache_dir: /tmp/vramfit/hami   # host directory for HAMi-core's per-pod shared usage cache
    usage_period_s: 5             # per-pod VRAM sampling period (NVML per process; docs/usage.md); 0 = off
    usage_publish_s: 15           # vramfit.io/pod-usage is written at most this often, and only on change
    proc_root: /proc              # where the host's processes are read (the DaemonSet runs with hostPID)
    over_use: report              # report | evict: evict a time-slice pod still above its booking after the grace
    over_use_grace_s: 60          # how long a time-slice pod may stay above its booking before eviction

The agent answers Allocate only for assignments signed with the signing key: without one it refuses to start
unless `allow_unsigned: true` (or `--allow-unsigned-assignments`) says so, since then any pod author who can
set `spec.nodeName` and annotations could name another tenant's GPU. Likewise the NVIDIA runtime must not take
a container's own `NVIDIA_VISIBLE_DEVICES` (`nvidia_runtime_config`, `open_runtime`; README "Trust model").

A GPU in MIG mode is always `mig`: the hardware decides, the config cannot override it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kubeio.config_file import load_yaml_model

SharingMode = Literal["exclusive", "mps", "timeslice"]


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the file and the key."""


class ModeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: SharingMode = "exclusive"
    replicas: int | None = Field(default=None, ge=1, le=48)

    @model_validator(mode="after")
    def _check(self) -> ModeSpec:
        if self.mode == "timeslice" and (self.replicas is None or self.replicas < 2):
            raise ValueError("timeslice needs replicas >= 2 (as NVIDIA's device plugin requires)")
        if self.mode == "exclusive" and self.replicas not in (None, 1):
            raise ValueError("exclusive takes no replicas")
        return self


class GpuOverride(ModeSpec):
    match: str  # GPU index ("0") or UUID ("GPU-...")


class NodeSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: ModeSpec | None = None
    gpus: tuple[GpuOverride, ...] = ()


class MpsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    root: str = "/run/nvidia/mps"
    active_thread_percentage: int | Literal["auto"] | None = None

    @model_validator(mode="after")
    def _check(self) -> MpsSettings:
        pct = self.active_thread_percentage
        if isinstance(pct, int) and not 1 <= pct <= 100:
            raise ValueError("active_thread_percentage must be 1..100, 'auto' or null")
        return self


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: ModeSpec = ModeSpec()
    gpus: tuple[GpuOverride, ...] = ()
    nodes: dict[str, NodeSection] = Field(default_factory=dict)
    mps: MpsSettings = MpsSettings()
    device_list_strategy: Literal["envvar", "volume-mounts", "cdi"] = "envvar"
    cdi_kind: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    nvidia_runtime_config: str | None = Field(default=None, pattern=r"^/")
    open_runtime: Literal["warn", "refuse"] = "warn"
    allocate_lookup_s: float = Field(default=3.0, ge=0, le=30)
    publish_interval_s: float = Field(default=30.0, gt=0)
    reconcile_interval_s: float = Field(default=30.0, gt=0)
    signing_key_file: str | None = None
    allow_unsigned: bool = False
    # Time-slice enforcement (docs/hami-core.md): with "hami-core", Allocate preloads HAMi-core into each
    # time-slice container and sets its limit to the booked VRAM.
    timeslice_enforcement: Literal["none", "hami-core"] = "none"
    hami_core_library: str | None = Field(default=None, pattern=r"^/.*\.so(\.[0-9]+)*$")
    hami_core_cache_dir: str = Field(default="/tmp/vramfit/hami", pattern=r"^/")
    # Per-pod usage and over-use (docs/usage.md).
    usage_period_s: float = Field(default=5.0, ge=0)
    usage_publish_s: float = Field(default=15.0, gt=0)
    proc_root: str = Field(default="/proc", pattern=r"^/")
    over_use: Literal["report", "evict"] = "report"
    over_use_grace_s: float = Field(default=60.0, ge=0)

    @model_validator(mode="after")
    def _check_enforcement(self) -> AgentConfig:
        if self.timeslice_enforcement == "hami-core" and self.hami_core_library is None:
            raise ValueError("timeslice_enforcement: hami-core needs hami_core_library (the host path of "
                             "HAMi-core's libvgpu.so)")
        return self

    def mode_for(self, node: str, index: int, uuid: str | None) -> ModeSpec:
        """The sharing mode of one non-MIG GPU: per-node GPU override, node default, GPU override, default."""
        section = self.nodes.get(node)
        for overrides in ((section.gpus if section else ()), self.gpus):
            for o in overrides:
                if o.match == str(index) or (uuid is not None and o.match == uuid):
                    return ModeSpec(mode=o.mode, replicas=o.replicas)
        if section is not None and section.default is not None:
            return section.default
        return self.default


def load_config(path: str | Path | None) -> AgentConfig:
    """Read the YAML config (None = defaults)."""
    return AgentConfig() if path is None else load_yaml_model(path, AgentConfig, ConfigError)
