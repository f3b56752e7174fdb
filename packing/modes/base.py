"""`ModeRules`: everything one sharing mode decides about one GPU, behind one small interface.

A GPU's occupancy (`packing.state.GpuUsage`) keeps the books (grants, tenants, MIG holders, VRAM used);
its mode's rules say what those books mean: how many pods may join, the largest grant now and ever, the
free pool, the free slots, the stranded VRAM, and why a grant is refused. The rules also carry the mode's
facts (the `Mode` it serves, the isolation it gives, whether its pods share a failure domain, its CP-SAT
family, whether grants name hardware instances); everything outside this package asks them and never
branches on a `Mode` member, so a new sharing mode is one module here and one line in `packing.modes.RULES`.

The rules read the books through `Usage`, a protocol, so this package imports nothing from `state`.
"""

from __future__ import annotations

from typing import Protocol

from packing.catalog.types import GpuModel
from packing.model import Gpu, GpuGrant, Isolation, MigInstance, Mode, PodDemand

UNLIMITED = 1 << 40  # stands for "not tracked" (time-slicing without replicas)

# Strongest isolation first: a pod that accepts level L may use a mode whose isolation is L or stronger.
_ISOLATION_RANK: dict[Isolation, int] = {Isolation.HARDWARE: 0, Isolation.PROCESS: 1, Isolation.NONE: 2}


class Usage(Protocol):
    """What the rules read of one GPU's books (`packing.state.GpuUsage` provides it)."""

    gpu: Gpu
    grants: dict[str, GpuGrant]
    tenants: dict[str, int]
    mig_holder: dict[str, str]
    used_mib: int
    whole_holder: str | None

    @property
    def pods(self) -> int: ...

    def free_instances(self) -> list[MigInstance]: ...


class ModeRules:
    """The rules of one sharing mode. Every method assumes the GPU is not held whole (`whole_holder is None`)
    where the caller says so; state checks that once for all modes."""

    name = "abstract"
    mode: Mode  # the GPU mode these rules serve
    replicas: bool | None = None  # served when the GPU reports replicas (True), none (False), either (None)
    isolation = Isolation.HARDWARE  # what the mode gives its pods: the weakest level that may use it
    instanced = False  # grants name a hardware instance (`GpuGrant.mig`); the layout is the GPU's instances
    takes_whole = False  # a grant takes the whole GPU: what stays free after one is nothing
    replica_use = "refused"  # a replica count in a GPU's description: "refused", "optional" or "required"
    client_limited = False  # one daemon serves the GPU's pods, up to the vendor's client limit (MPS)
    shared = False  # one failure domain shared by its pods: one tenant per GPU (MPS, time-slicing)
    words = "exclusive"  # the mode in an operator's words: "GPU 1 is <words> for tenant b"
    cap_words = "GPU memory"  # what bounds the largest grant: "<cap_words> is 16384 MiB < 20000 MiB"
    # The CP-SAT model's sharing family: pods of one family may share a GPU under the family's constraint
    # ("hw": one pod per unit; "mps": clients of one MPS daemon; "ts": time-slice replicas).
    family = "hw"
    # How the mode's units combine in one pod (a CUDA process must be able to use all of them at once).
    # The units of one pod are all of one `pod_group` (whole GPUs, MIG instances, MPS shares, time-slice
    # replicas: never two kinds), and `multi_gpu_group` says how many GPUs of the group one pod may hold:
    # "any"; "one" (one daemon per GPU, and a process reaches one daemon); "per-process" (several only when
    # the pod says each process picks its own, `PodDemand.gpu_per_process`). `multi_gpu_why` says why not.
    pod_group = "whole"
    group_words = "whole GPUs"
    multi_gpu_group = "any"
    multi_gpu_why = ""

    def __deepcopy__(self, memo: dict[int, object]) -> ModeRules:
        return self  # rules are stateless singletons: a copied state shares them

    def admits(self, isolation: Isolation) -> bool:
        """A pod accepting `isolation` may use this mode."""
        return _ISOLATION_RANK[self.isolation] <= _ISOLATION_RANK[isolation]

    def tenant_conflict(self, owner: str | None, tenant: str, relax_tenancy: bool) -> bool:
        """`tenant` may not join a GPU whose failure domain `owner` holds (shared modes only)."""
        return self.shared and not relax_tenancy and owner not in (None, tenant)

    def joinable(self, pod: PodDemand, room_mib: int, owner: str | None, relax_tenancy: bool) -> bool:
        """The grant rule on a GPU's summary (the solvers' slot: the largest grant now, the owning tenant):
        the isolation allows the mode, the pod fits, its tenant may join. `grant_problem` is the same rule on
        the books, with the reason."""
        return (self.admits(pod.isolation) and pod.vram_mib <= room_mib
                and not self.tenant_conflict(owner, pod.tenant, relax_tenancy))

    def layout_for(self, model: GpuModel) -> tuple[MigInstance, ...] | None:
        """The instances a GPU of `model` lists when the mode itself decides them (dynamic MIG: every placement
        the geometry allows); None: the GPU's layout is fixed by what it reports (a static MIG layout, or no
        instances), so only the node can say it."""
        return None

    def max_pods(self, gu: Usage) -> int:
        """Pods that may hold a grant on this GPU at once."""
        raise NotImplementedError

    def unit_max(self, gu: Usage) -> int:
        """Largest VRAM one new pod could get now (tenancy aside; the GPU not held whole)."""
        raise NotImplementedError

    def unit_cap(self, gu: Usage) -> int:
        """Largest VRAM one pod could ever get (the GPU empty)."""
        return gu.gpu.memory_mib

    def pool_free(self, gu: Usage) -> int:
        """Free VRAM new pods could share out (the GPU not held whole)."""
        raise NotImplementedError

    def slots_free(self, gu: Usage) -> int:
        """Pods that could still join (the GPU not held whole)."""
        return max(0, min(self.max_pods(gu) - gu.pods, 1 << 30))

    def free_instance_sizes(self, gu: Usage) -> list[int]:
        """VRAM of each free hardware instance, for the state's `mig_free` view (none outside MIG)."""
        return []

    def pooled(self, gu: Usage) -> bool:
        """Pods draw their VRAM from one pool of the GPU (the state's `pooled` view; the measure's take)."""
        return False

    def free_units(self, gu: Usage) -> list[MigInstance]:
        """The free hardware instances a pod could get whole (the solvers' buckets; none outside MIG)."""
        return []

    def grant_unit(self, gu: Usage) -> int | None:
        """VRAM of the fixed unit each grant takes, for the solvers' stranded objective; None: no fixed unit."""
        return None

    def pool(self, gu: Usage) -> int | None:
        """Free VRAM of the pool grants draw from, for the solvers' slot (None: the GPU hands out units)."""
        return None

    def stranded_mib(self, gu: Usage) -> int:
        """VRAM, on a GPU in use and not held whole, that no pod holds and no new pod can get."""
        raise NotImplementedError

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        """Why this mode refuses a (not whole-GPU, isolation-allowed) grant; None when it takes it."""
        raise NotImplementedError

    def candidate(self, gu: Usage, pod: PodDemand) -> tuple[GpuGrant | None, int, str | None]:
        """The best unit on this GPU for one of the pod's GPUs -> (grant, unit size, why none fits now).
        The grant is not checked yet (`ClusterState.grant_problem` does that)."""
        unit = 0 if gu.whole_holder is not None else self.unit_max(gu)
        return GpuGrant(index=gu.gpu.index, vram_mib=pod.vram_mib), unit, None

    def booking_problem(self, gu: Usage, grant: GpuGrant) -> str | None:
        """Why the grant would book a unit twice (the only check a forced record makes); None when it would not."""
        return None
