"""Core value types of the placement core.

Everything here is plain data: parsed once at the edge (Kubernetes JSON, snapshot files, trace CSVs)
and then used by `state`, `fit` and `policies` without further validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    """How one physical GPU is shared. Each mode's facts and rules live in `packing.modes` (its registry,
    `packing.modes.RULES`); nothing else branches on a member."""

    EXCLUSIVE = "exclusive"  # one pod owns the whole GPU
    MIG = "mig"  # hardware partitions; one pod per instance
    MIG_DYNAMIC = "mig-dynamic"  # MIG instances created on demand: any placement the GPU's geometry allows, chosen at allocation
    MPS = "mps"  # CUDA MPS; per-client memory limits
    TIMESLICE = "timeslice"  # time-slicing; no memory or fault isolation


class Isolation(StrEnum):
    """The weakest isolation a pod accepts from its neighbours."""

    HARDWARE = "hardware"  # MIG instance or whole GPU only
    PROCESS = "process"  # also MPS
    NONE = "none"  # also time-slicing


# CUDA MPS client limit per device on Volta and newer (gpu-facts.md §5, docs.nvidia.com/deploy/mps).
MPS_MAX_CLIENTS = 48


class InputError(ValueError):
    """Bad input, named precisely: which object and which field."""

    def __init__(self, obj: str, field_name: str, problem: str) -> None:
        self.obj = obj
        self.field_name = field_name
        self.problem = problem
        super().__init__(f"{obj}: field {field_name}: {problem}")


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance on a physical GPU."""

    profile: str  # e.g. "3g.40gb"
    start: int  # first memory slice
    memory_slices: int
    compute_slices: int
    memory_mib: int
    uuid: str | None = None

    @property
    def ref(self) -> str:
        """The stable name used in assignments: `<profile>@<start>`."""
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the node reports it."""

    index: int
    memory_mib: int
    mode: Mode
    product: str = ""
    model: str | None = None  # catalog model name, None when unknown
    uuid: str | None = None
    replicas: int | None = None  # MPS / time-slicing replicas; None = MPS with per-pod pinned limits
    mig: tuple[MigInstance, ...] = ()

    def instance(self, ref: str) -> MigInstance | None:
        for inst in self.mig:
            if inst.ref == ref:
                return inst
        return None


@dataclass(frozen=True)
class Node:
    """A node and its GPUs. cpu_milli / memory_mib are allocatable; None means 'not tracked'."""

    name: str
    gpus: tuple[Gpu, ...]
    cpu_milli: int | None = None
    memory_mib: int | None = None
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    warnings: tuple[str, ...] = ()  # e.g. "unknown product X: treated as non-MIG with 15360 MiB"


@dataclass(frozen=True)
class PodDemand:
    """What a pod asks of the GPU side. vram_mib is per GPU."""

    key: str  # "namespace/name"
    vram_mib: int
    gpu_count: int = 1
    tenant: str = "default"
    isolation: Isolation = Isolation.NONE
    models: frozenset[str] | None = None  # allowed products/models (normalised lower-case); None = any
    uid: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    # Each of the pod's processes picks its own GPU (`vramfit.io/gpu-per-process`): only then may a multi-GPU
    # pod take several MIG instances, since a CUDA process enumerates one MIG device at most.
    gpu_per_process: bool = False

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything that decides fit and score except the pod's identity (cache key)."""
        return (self.vram_mib, self.gpu_count, self.tenant, self.isolation, self.models, self.cpu_milli,
                self.memory_mib, self.gpu_per_process)


@dataclass(frozen=True)
class GpuGrant:
    """The part of one GPU a pod holds."""

    index: int
    vram_mib: int
    mig: str | None = None  # "<profile>@<start>" when the unit is a MIG instance
    whole: bool = False  # the pod holds the entire physical GPU (whole-GPU allocation)

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "mig": self.mig, "vram_mib": self.vram_mib}


@dataclass(frozen=True)
class Assignment:
    """Where a pod is placed: one node, one grant per GPU it uses."""

    node: str
    gpus: tuple[GpuGrant, ...]

    def to_annotation(self) -> dict[str, object]:
        """The `vramfit.io/assignment` annotation value (as a dict; json.dumps it)."""
        return {"gpus": [g.to_json() for g in self.gpus]}


@dataclass(frozen=True)
class Holder:
    """A pod holding capacity on a node (bound, or reserved and not yet bound)."""

    pod: PodDemand
    assignment: Assignment
    reserved: bool = False  # chosen by vramfit, Binding not yet confirmed
