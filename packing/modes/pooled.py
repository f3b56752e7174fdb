"""Pooled sharing: MPS without replicas (pinned per-pod limits) and time-slicing. Pods of one tenant share
the GPU's VRAM as one pool, up to a number of clients; one failure domain, so one tenant per GPU."""

from __future__ import annotations

from packing.model import MPS_MAX_CLIENTS, GpuGrant, Isolation, Mode, PodDemand
from packing.modes.base import UNLIMITED, ModeRules, Usage

MPS_ONE_DAEMON = ("one MPS control daemon serves one GPU and a process reaches one daemon, so a pod's MPS shares "
                  "are one GPU's")


class Pooled(ModeRules):
    shared = True

    def __init__(self, name: str, mode: Mode, replicas: bool | None, isolation: Isolation, family: str, words: str,
                 cap_words: str) -> None:
        self.name = name
        self.mode = mode
        self.replicas = replicas
        self.isolation = isolation
        self.replica_use = "optional" if mode is Mode.MPS else "required"
        self.client_limited = mode is Mode.MPS
        self.family = family
        self.words = words
        self.cap_words = cap_words
        # The node agent runs one MPS control daemon per GPU (nodeagent/mps.py) and a process reaches one daemon
        # (one CUDA_MPS_PIPE_DIRECTORY): a pod's MPS shares are one GPU's. Time-slice replicas combine freely.
        if mode is Mode.MPS:
            self.pod_group, self.group_words = "mps", "MPS shares"
            self.multi_gpu_group, self.multi_gpu_why = "one", MPS_ONE_DAEMON
        else:
            self.pod_group, self.group_words = "timeslice", "time-slice replicas"

    def max_pods(self, gu: Usage) -> int:
        if self.name == "mps":
            return MPS_MAX_CLIENTS  # the MPS daemon's client limit
        return gu.gpu.replicas if gu.gpu.replicas else UNLIMITED

    def unit_max(self, gu: Usage) -> int:
        if gu.pods >= self.max_pods(gu):
            return 0
        return gu.gpu.memory_mib - gu.used_mib

    def pool_free(self, gu: Usage) -> int:
        return gu.gpu.memory_mib - gu.used_mib

    def pooled(self, gu: Usage) -> bool:
        return True

    def pool(self, gu: Usage) -> int | None:
        return gu.gpu.memory_mib - gu.used_mib

    def stranded_mib(self, gu: Usage) -> int:
        # Free VRAM is stranded only once no pod may join any more.
        return gu.gpu.memory_mib - gu.used_mib if gu.pods >= self.max_pods(gu) else 0

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        problem = shared_admission(self, gu, pod, grant, relax_tenancy)
        if problem is not None:
            return problem
        if gu.used_mib + pod.vram_mib > gu.gpu.memory_mib:
            return f"needs {pod.vram_mib} MiB, {gu.gpu.memory_mib - gu.used_mib} MiB free"
        return None


def shared_admission(rules: ModeRules, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
    """Who may join a shared GPU: no MIG instance named, the owning tenant only (unless relaxed), a free replica."""
    if grant.mig is not None:
        return f"GPU is not in MIG mode (grant names {grant.mig})"
    owner = next(iter(gu.tenants)) if gu.tenants else None
    if rules.tenant_conflict(owner, pod.tenant, relax_tenancy):
        return f"{gu.gpu.mode.value} GPU belongs to tenant {owner}"
    if gu.pods >= rules.max_pods(gu):
        return f"all {rules.max_pods(gu)} {gu.gpu.mode.value} replicas are taken"
    return None


MPS_POOLED = Pooled("mps", Mode.MPS, False, Isolation.PROCESS, "mps", "shared by MPS", "MPS share")
TIMESLICE = Pooled("timeslice", Mode.TIMESLICE, None, Isolation.NONE, "ts", "time-sliced", "GPU memory")
