"""Exclusive GPUs: one pod holds the whole GPU."""

from __future__ import annotations

from packing.model import GpuGrant, Mode, PodDemand
from packing.modes.base import ModeRules, Usage


class Exclusive(ModeRules):
    name = "exclusive"
    mode = Mode.EXCLUSIVE
    takes_whole = True

    def max_pods(self, gu: Usage) -> int:
        return 1

    def unit_max(self, gu: Usage) -> int:
        return gu.gpu.memory_mib if not gu.grants else 0

    def pool_free(self, gu: Usage) -> int:
        return gu.gpu.memory_mib if not gu.grants else 0

    def grant_unit(self, gu: Usage) -> int | None:
        return gu.gpu.memory_mib

    def stranded_mib(self, gu: Usage) -> int:
        return gu.gpu.memory_mib - sum(x.vram_mib for x in gu.grants.values())

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        if grant.mig is not None:
            return f"GPU is not in MIG mode (grant names {grant.mig})"
        if gu.grants:
            return f"exclusive GPU held by {next(iter(gu.grants))}"
        if pod.vram_mib > gu.gpu.memory_mib:
            return f"needs {pod.vram_mib} MiB, GPU has {gu.gpu.memory_mib} MiB"
        return None

    def booking_problem(self, gu: Usage, grant: GpuGrant) -> str | None:
        if gu.grants:
            return f"exclusive GPU held by {next(iter(gu.grants))}"
        return None


EXCLUSIVE = Exclusive()
