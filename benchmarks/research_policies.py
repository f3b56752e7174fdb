"""The research variants of vramfit's policy, which the benchmark registers beside the core's (`register()`).

They measure what the default is made of (POLICY_NOTES.md, RESULTS.md): the measure alone, the measure against
FGD's target workload, and other ways of meeting the LP's dual cost with the measure's loss. The extender and
what-if never need them; the core ships only the default (`packing.policies.frag_dual`).

- `frag-aware`: `FragAware` scoring against the target workload the trace benchmark offers (FGD's M).
- `vramfit-measure`: the default's measure without its LP gap values, learning its mix from the pods it sees.
- `frag-dual`: the measure plus the dual cost, met as `combine` says, the LP over the scored mix's shapes.
- `vramfit-dual`: the default under its name in issue 14's reports and commands, so those still run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.peers.workload_frag import TargetWorkload
from packing.arrays import F64, B
from packing.model import PodDemand
from packing.policies import policy_names
from packing.policies import register as register_policy
from packing.policies.frag_aware import FragAware
from packing.policies.frag_dual import VRAMFIT, FragDual
from packing.policies.mix import PodShape
from packing.state import ClusterState

COMBINES = ("dual", "lex-dual", "lex-frag", "weighted", "gpu")


def shapes_of_workload(wl: TargetWorkload) -> list[tuple[PodShape, float]]:
    """(shape, count) pairs of a target workload (single tenant: tenant None)."""
    return [(PodShape(vram_mib=int(d), gpu_count=int(k), tenant=None, models=frozenset(t) or None, cpu_milli=int(c)),
             float(w)) for c, d, k, t, w in zip(wl.cpu, wl.milli, wl.count, wl.models, wl.weight, strict=True)]


def _fold_workload(policy: FragAware, workload: TargetWorkload | None, use: bool) -> None:
    """The target workload's shapes join the given mix (after it), before the measure reads the mix."""
    if workload is not None and use:
        policy.mix = [*(policy.mix or ()), *shapes_of_workload(workload)]


@dataclass
class FragAwareLab(FragAware):
    """Fragmentation-aware: smallest loss of VRAM the workload mix can still use, FGD's target workload as its mix."""

    name: str = "frag-aware"
    workload: TargetWorkload | None = None  # the trace benchmark's target workload M, used as the mix
    use_workload: bool = True

    def __post_init__(self) -> None:
        _fold_workload(self, self.workload, self.use_workload)
        super().__post_init__()


@dataclass
class FragDualLab(FragDual):
    """vramfit's measure plus dual-price gap values from the packing LP of the expected workload."""

    name: str = "frag-dual"
    combine: str = "weighted"  # how the dual gap cost meets the measure's loss (`_keys`)
    lam: float = 1.0  # weight of the dual cost in 'weighted' (both are in VRAM units)
    lp_mix: str = "workload"  # 'workload': the scored mix's shapes; 'observed': sizes of the pods seen
    workload: TargetWorkload | None = None
    use_workload: bool = True

    def __post_init__(self) -> None:
        _fold_workload(self, self.workload, self.use_workload)
        super().__post_init__()
        if self.combine not in COMBINES:
            raise ValueError(f"unknown combine {self.combine!r}; use one of {', '.join(COMBINES)}")
        if self.lp_mix not in ("workload", "observed"):
            raise ValueError(f"unknown lp_mix {self.lp_mix!r}; use 'workload' or 'observed'")

    def size_mix(self) -> dict[tuple[int, int], float]:
        if self.lp_mix == "observed":
            return super().size_mix()
        mix: dict[tuple[int, int], float] = {}
        for s, w in self.current_mix():
            if s.gpu_count > 0 and s.vram_mib > 0:
                mix[(s.vram_mib, s.gpu_count)] = mix.get((s.vram_mib, s.gpu_count), 0.0) + w
        total = float(sum(mix.values()))
        return {k: float(v) / total for k, v in mix.items()} if total > 0 else {}

    def _keys(self, loss_g: F64, cost: F64) -> F64:
        """dual: the dual cost alone (the loss only breaks exact ties); lex-dual: the default's key; lex-frag: loss
        (to 1e-3) first, dual cost second; weighted: loss + lam x dual cost; gpu: see `_rank`."""
        big = 1e7
        if self.combine == "lex-dual":
            return super()._keys(loss_g, cost)
        if self.combine == "dual":
            return cost * big + np.minimum(loss_g, big / 10)
        if self.combine == "lex-frag":
            return np.round(np.minimum(loss_g, big) * 1e3) * 1e4 + cost
        return loss_g + self.lam * cost

    def _rank(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray, loss_g: F64, cand: B, ref: B,
              cost: F64) -> F64:
        if self.combine != "gpu":
            return super()._rank(state, pod, feasible_now, loss_g, cand, ref, cost)
        # Node by the measure's loss; inside it the GPU of least dual cost (then least loss).
        key = np.where(cand, np.round(cost * 1e3) * 1e7 + np.minimum(loss_g, 1e6), np.inf)
        self._pick = (pod.shape, state.version.copy(), np.argmin(key, axis=1))
        return FragAware.score(self, state, pod, feasible_now)


def make_frag_aware(**params: Any) -> FragAwareLab:
    """Fragmentation-aware: smallest loss of VRAM the workload mix can still use; node and units together."""
    return FragAwareLab(name="frag-aware", **params)


def make_vramfit_measure(**params: Any) -> FragAwareLab:
    """vramfit's measure alone: it learns its mix from the pods it sees, even where the benchmark offers FGD's
    target workload (that measured better, POLICY_NOTES.md "Learning the mix")."""
    return FragAwareLab(name="vramfit-measure", **{"use_workload": False, **params})


def make_frag_dual(**params: Any) -> FragDualLab:
    """vramfit's measure plus dual-price gap values from the packing LP of the expected workload."""
    return FragDualLab(name="frag-dual", **params)


def make_vramfit_dual(**params: Any) -> FragDualLab:
    """The default vramfit under its name in issue 14's reports (the same settings; params override them)."""
    return FragDualLab(name="vramfit", **{"combine": "lex-dual", "lp_mix": "observed", "use_workload": False,
                                          **VRAMFIT, **params})


VARIANTS: dict[str, tuple[Any, str, type]] = {
    "frag-aware": (make_frag_aware, "frag-aware measure against FGD's target workload (research variant)",
                   FragAwareLab),
    "vramfit-measure": (make_vramfit_measure, "vramfit's measure alone, the mix learnt from the pods it sees "
                        "(the default until issue 14; research variant)", FragAwareLab),
    "frag-dual": (make_frag_dual, "the measure plus the packing LP's dual gap values, combined as `combine` says "
                  "(research variant)", FragDualLab),
    "vramfit-dual": (make_vramfit_dual, "the default vramfit under its name in issue 14's reports", FragDualLab),
}


def register() -> None:
    """Add the research variants to the core's registry (once: a second call finds them there)."""
    known = set(policy_names())
    for name, (factory, description, params) in VARIANTS.items():
        if name not in known:
            register_policy(name, factory, description, params)
