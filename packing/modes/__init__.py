"""One home per sharing mode: `rules_for(gpu)` is the registry, one module per mode behind `ModeRules`."""

from __future__ import annotations

from packing.model import Gpu, Mode
from packing.modes.base import UNLIMITED, ModeRules, Usage
from packing.modes.exclusive import EXCLUSIVE
from packing.modes.mig import MIG
from packing.modes.mps_shares import MPS_SHARES
from packing.modes.pooled import MPS_POOLED, TIMESLICE

__all__ = ["UNLIMITED", "ModeRules", "Usage", "rules_for"]

# (mode, the device plugin hands fixed shares) -> rules. MPS is two modes of accounting: with replicas
# every client gets an equal fixed share; without, clients pin their own limits out of one pool.
_RULES: dict[tuple[Mode, bool], ModeRules] = {
    (Mode.EXCLUSIVE, False): EXCLUSIVE,
    (Mode.EXCLUSIVE, True): EXCLUSIVE,
    (Mode.MIG, False): MIG,
    (Mode.MIG, True): MIG,
    (Mode.MPS, True): MPS_SHARES,
    (Mode.MPS, False): MPS_POOLED,
    (Mode.TIMESLICE, False): TIMESLICE,
    (Mode.TIMESLICE, True): TIMESLICE,
}


def rules_for(gpu: Gpu) -> ModeRules:
    return _RULES[(gpu.mode, bool(gpu.replicas))]
