"""MIG GPUs: hardware instances, one pod per instance; a grant names its instance."""

from __future__ import annotations

from packing.model import GpuGrant, MigInstance, Mode, PodDemand
from packing.modes.base import ModeRules, Usage

# Why one pod may hold several MIG instances only when each of its processes picks its own (CUDA docs, MIG
# user guide: "a CUDA process can only enumerate a single MIG instance").
MIG_ONE_PER_PROCESS = ("a CUDA process enumerates one MIG device, so a pod gets several MIG instances only with "
                       "vramfit.io/gpu-per-process: \"true\" (each process picks its own)")


class Mig(ModeRules):
    name = "mig"
    mode = Mode.MIG
    instanced = True
    words = "MIG-partitioned"
    cap_words = "largest MIG instance"
    pod_group = "mig"
    group_words = "MIG instances"
    multi_gpu_group = "per-process"
    multi_gpu_why = MIG_ONE_PER_PROCESS

    def max_pods(self, gu: Usage) -> int:
        return len(gu.gpu.mig)

    def unit_max(self, gu: Usage) -> int:
        return max((i.memory_mib for i in gu.free_instances()), default=0)

    def unit_cap(self, gu: Usage) -> int:
        return max((i.memory_mib for i in gu.gpu.mig), default=0)

    def pool_free(self, gu: Usage) -> int:
        return sum(i.memory_mib for i in gu.free_instances())

    def free_instance_sizes(self, gu: Usage) -> list[int]:
        return [inst.memory_mib for inst in gu.free_instances()]

    def slots_free(self, gu: Usage) -> int:
        return len(gu.gpu.mig) - len(gu.mig_holder)

    def free_units(self, gu: Usage) -> list[MigInstance]:
        return gu.free_instances()

    def pool(self, gu: Usage) -> int | None:
        # Held whole (the whole-GPU baseline): one block, nothing to share; the solvers' slot records it so.
        return gu.gpu.memory_mib - gu.used_mib if gu.whole_holder is not None else None

    def stranded_mib(self, gu: Usage) -> int:
        return sum(inst.memory_mib - gu.grants[holder].vram_mib for inst in gu.gpu.mig
                   if (holder := gu.mig_holder.get(inst.ref)) is not None)

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        inst, problem = named_place(gu, grant, "MIG GPU", "instance")
        if inst is None:
            return problem
        if pod.vram_mib > inst.memory_mib:
            return f"needs {pod.vram_mib} MiB, instance {grant.mig} has {inst.memory_mib} MiB"
        return None

    def candidate(self, gu: Usage, pod: PodDemand) -> tuple[GpuGrant | None, int, str | None]:
        v = pod.vram_mib
        free = sorted(gu.free_instances(), key=lambda i: (i.memory_mib, i.start))
        fitting = [i for i in free if i.memory_mib >= v]
        if not fitting:
            listed = ", ".join(i.ref for i in free) or "none"
            return None, 0, f"no free MIG instance >= {v} MiB (free: {listed})"
        inst = fitting[0]  # smallest that fits: keeps big instances for big pods
        return GpuGrant(index=gu.gpu.index, vram_mib=v, mig=inst.ref), inst.memory_mib, None

    def booking_problem(self, gu: Usage, grant: GpuGrant) -> str | None:
        if grant.mig is not None:
            if gu.gpu.instance(grant.mig) is None:
                return f"no MIG instance {grant.mig}"
            if grant.mig in gu.mig_holder:
                return f"MIG instance {grant.mig} is held by {gu.mig_holder[grant.mig]}"
        elif not grant.whole:
            return "MIG GPU needs a MIG instance in the grant"
        return None


MIG = Mig()


def named_place(gu: Usage, grant: GpuGrant, gpu_words: str, place: str) -> tuple[MigInstance | None, str | None]:
    """(the MIG place a grant names on the GPU, None) when it exists and no pod holds it, else (None, why not):
    a MIG grant's first rule, in the words of the mode (`place`: what the mode calls a MIG place)."""
    if grant.mig is None:
        return None, f"{gpu_words} needs a MIG {place} in the grant"
    inst = gu.gpu.instance(grant.mig)
    if inst is None:
        return None, f"no MIG {place} {grant.mig}"
    if grant.mig in gu.mig_holder:
        return None, f"MIG {place} {grant.mig} is held by {gu.mig_holder[grant.mig]}"
    return inst, None
