"""MPS with replicas: the device plugin hands each client an equal fixed share, floor(total / replicas)."""

from __future__ import annotations

from packing.model import MPS_MAX_CLIENTS, GpuGrant, Isolation, Mode, PodDemand
from packing.modes.base import ModeRules, Usage
from packing.modes.pooled import MPS_ONE_DAEMON, shared_admission


def share_mib(gu: Usage) -> int:
    replicas = gu.gpu.replicas
    assert replicas  # rules_for hands these rules only to MPS GPUs with replicas
    return gu.gpu.memory_mib // replicas


class MpsShares(ModeRules):
    name = "mps-shares"
    mode = Mode.MPS
    replicas = True
    isolation = Isolation.PROCESS
    replica_use = "optional"
    client_limited = True
    shared = True
    words = "shared by MPS"
    cap_words = "MPS share"
    family = "mps"
    pod_group = "mps"
    group_words = "MPS shares"
    multi_gpu_group = "one"
    multi_gpu_why = MPS_ONE_DAEMON

    def max_pods(self, gu: Usage) -> int:
        replicas = gu.gpu.replicas
        assert replicas
        return min(replicas, MPS_MAX_CLIENTS)

    def unit_max(self, gu: Usage) -> int:
        if gu.pods >= self.max_pods(gu):
            return 0
        return share_mib(gu)

    def unit_cap(self, gu: Usage) -> int:
        return share_mib(gu)

    def pool_free(self, gu: Usage) -> int:
        return (self.max_pods(gu) - gu.pods) * share_mib(gu)

    def pooled(self, gu: Usage) -> bool:
        return share_mib(gu) >= gu.gpu.memory_mib  # one replica: the share is the whole GPU, a pool of one

    def grant_unit(self, gu: Usage) -> int | None:
        return share_mib(gu)

    def stranded_mib(self, gu: Usage) -> int:
        # Each grant strands the rest of its share; a full GPU also strands what the shares leave over.
        share = share_mib(gu)
        total = sum(share - x.vram_mib for x in gu.grants.values())
        full = gu.pods >= self.max_pods(gu)
        return total + (gu.gpu.memory_mib - self.max_pods(gu) * share if full else 0)

    def candidate(self, gu: Usage, pod: PodDemand) -> tuple[GpuGrant | None, int, str | None]:
        return GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib), share_mib(gu), None  # the fixed share

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        problem = shared_admission(self, gu, pod, grant, relax_tenancy)
        if problem is not None:
            return problem
        if pod.vram_mib > share_mib(gu):
            return f"needs {pod.vram_mib} MiB, MPS share is {share_mib(gu)} MiB"
        return None


MPS_SHARES = MpsShares()
