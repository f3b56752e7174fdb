"""The books of one GPU and one node: who holds what. What the books mean is the GPU's sharing mode's
to say (`packing.modes`); `ClusterState` (`packing.state`) keeps one `NodeUsage` per node."""

from __future__ import annotations

from dataclasses import dataclass, field

from packing.model import (
    Gpu,
    GpuGrant,
    MigInstance,
    Node,
)
from packing.modes import ModeRules, rules_for
from packing.vendors import gpu_names


@dataclass
class GpuUsage:
    """Mutable occupancy of one physical GPU: the books. What they mean (how many may join, the largest
    grant, the free pool, stranded VRAM) is the GPU's sharing mode's to say: `rules` (`packing.modes`)."""

    gpu: Gpu
    grants: dict[str, GpuGrant] = field(default_factory=dict)  # pod key -> grant on this GPU
    tenants: dict[str, int] = field(default_factory=dict)  # tenant -> pods (shared modes)
    mig_holder: dict[str, str] = field(default_factory=dict)  # instance ref -> pod key
    used_mib: int = 0
    whole_holder: str | None = None
    rules: ModeRules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rules = rules_for(self.gpu)

    @property
    def pods(self) -> int:
        return len(self.grants)

    def share_mib(self) -> int:
        """MPS with replicas: the device plugin's equal per-client limit, floor(total / replicas)."""
        assert self.gpu.replicas
        return self.gpu.memory_mib // self.gpu.replicas

    def max_pods(self) -> int:
        return self.rules.max_pods(self)

    def free_instances(self) -> list[MigInstance]:
        return [i for i in self.gpu.mig if i.ref not in self.mig_holder]

    def unit_max(self) -> int:
        """Largest VRAM a new pod could get on this GPU now (tenancy aside)."""
        return 0 if self.whole_holder is not None else self.rules.unit_max(self)

    def unit_cap(self) -> int:
        """Largest VRAM one pod could ever get on this GPU (it empty)."""
        return self.rules.unit_cap(self)

    def pool_free(self) -> int:
        return 0 if self.whole_holder is not None else self.rules.pool_free(self)

    def slots_free(self) -> int:
        return 0 if self.whole_holder is not None else self.rules.slots_free(self)

    def tenant(self) -> str | None:
        """The tenant that owns the failure domain of a shared GPU (None when free or not shared)."""
        if self.rules.shared and self.tenants:
            return next(iter(self.tenants))
        return None

    def stranded_mib(self) -> int:
        """VRAM on this GPU, if in use, that no pod holds and no new pod can get."""
        if not self.grants:
            return 0
        if self.whole_holder is not None:  # a whole-GPU grant on a shared or MIG GPU: the rest is its
            return self.gpu.memory_mib - sum(x.vram_mib for x in self.grants.values())
        return self.rules.stranded_mib(self)


@dataclass
class NodeUsage:
    node: Node
    gpus: list[GpuUsage]
    cpu_used: int = 0
    mem_used: int = 0

    def stranded_mib(self) -> int:
        return sum(gu.stranded_mib() for gu in self.gpus)


def gpu_model_allowed(gpu: Gpu, models: frozenset[str] | None) -> bool:
    """A pod's `vramfit.io/gpu-models` list (lower case) matches the GPU's catalog model name or a name its
    product string answers to (`packing.vendors.gpu_names`)."""
    return not models or not models.isdisjoint(gpu_names(gpu.model, gpu.product))
