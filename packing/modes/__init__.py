"""One home per sharing mode: `RULES` is the registry, one module per mode behind `ModeRules`.

Every fact about a mode outside this package is read from here: `rules_for(gpu)` for one GPU's rules,
`MODE_CODE` for the state's arrays, `ALLOWED_MODES` per isolation level, `SHARED_MODES`, `mode_rules(mode)`
for the facts of a mode, `SHARED_FAMILIES` for the CP-SAT model's sharing families.
"""

from __future__ import annotations

from packing.model import Gpu, Isolation, Mode
from packing.modes.base import UNLIMITED, ModeRules, Usage
from packing.modes.combine import MULTI_GPU_GROUPS, combination_problem, group_allows
from packing.modes.exclusive import EXCLUSIVE
from packing.modes.mig import MIG
from packing.modes.mig_dynamic import MIG_DYNAMIC
from packing.modes.mps_shares import MPS_SHARES
from packing.modes.pooled import MPS_POOLED, TIMESLICE

__all__ = ["ALLOWED_MODES", "MODE_CODE", "MODES", "POD_GROUPS", "RULES", "SHARED_FAMILIES", "SHARED_MODES",
           "UNLIMITED", "WHOLE_GPU", "ModeRules", "Usage", "combination_problem", "group_allows", "mode_rules",
           "rules_for"]

# The registry: one line per mode module. A mode may have several rules, told apart by whether the GPU
# reports replicas: MPS with replicas hands every client an equal fixed share; without, clients pin their
# own limits out of one pool. The order fixes the modes' array codes and the solvers' family order.
RULES: tuple[ModeRules, ...] = (EXCLUSIVE, MIG, MPS_SHARES, MPS_POOLED, TIMESLICE, MIG_DYNAMIC)

_BY_GPU: dict[tuple[Mode, bool], ModeRules] = {
    (r.mode, replicas): r for r in RULES for replicas in (False, True) if r.replicas in (None, replicas)}

# The modes in registry order; a mode's code is its position (the state's `mode` array, -1: no GPU).
MODES: tuple[Mode, ...] = tuple(dict.fromkeys(r.mode for r in RULES))
MODE_CODE: dict[Mode, int] = {m: i for i, m in enumerate(MODES)}

_MODE_FACTS = ("isolation", "shared", "instanced", "takes_whole", "family", "replica_use", "client_limited",
               "pod_group", "multi_gpu_group")
_BY_MODE: dict[Mode, ModeRules] = {}
for _r in RULES:
    _first = _BY_MODE.setdefault(_r.mode, _r)
    _differ = [f for f in _MODE_FACTS if getattr(_r, f) != getattr(_first, f)]
    if _differ:
        raise TypeError(f"rules {_r.name} and {_first.name} of mode {_r.mode} disagree on {_differ}")


def rules_for(gpu: Gpu) -> ModeRules:
    return _BY_GPU[(gpu.mode, bool(gpu.replicas))]


def mode_rules(mode: Mode) -> ModeRules:
    """Rules of `mode`, for the facts all its rules share (`isolation`, `shared`, `instanced`, ...)."""
    return _BY_MODE[mode]


# The rules of any GPU taken whole (the whole-GPU baseline: one pod takes an idle GPU of any mode).
WHOLE_GPU: ModeRules = EXCLUSIVE

# Which modes each isolation level may use.
ALLOWED_MODES: dict[Isolation, frozenset[Mode]] = {
    iso: frozenset(m for m in MODES if mode_rules(m).admits(iso)) for iso in Isolation}

# Modes where pods of several tenants would share one failure domain: one tenant per GPU.
SHARED_MODES: frozenset[Mode] = frozenset(m for m in MODES if mode_rules(m).shared)

# The CP-SAT model's sharing families other than "hw" (one pod per unit), one rules each, in registry order.
SHARED_FAMILIES: tuple[ModeRules, ...] = tuple({r.family: r for r in RULES if r.family != "hw"}.values())

# The pod groups (`ModeRules.pod_group`) in registry order, each with the first rules that state it: a pod's
# units are all of one group. Rules of one group must agree on how its GPUs combine.
POD_GROUPS: dict[str, ModeRules] = {}
for _r in RULES:
    _g = POD_GROUPS.setdefault(_r.pod_group, _r)
    if _r.multi_gpu_group not in MULTI_GPU_GROUPS:
        raise TypeError(f"rules {_r.name}: multi_gpu_group {_r.multi_gpu_group!r} is not one of {MULTI_GPU_GROUPS}")
    if (_g.multi_gpu_group, _g.group_words) != (_r.multi_gpu_group, _r.group_words):
        raise TypeError(f"rules {_r.name} and {_g.name} of pod group {_r.pod_group} disagree on how it combines")
if WHOLE_GPU.pod_group not in POD_GROUPS:
    POD_GROUPS[WHOLE_GPU.pod_group] = WHOLE_GPU
