"""The workload mix vramfit's measure weighs: pod shapes and their weights, learned or given, as arrays.

The mix is learned online from `observe` and/or given as a parameter (the trace benchmark passes FGD's
target workload).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from packing.arrays import F64, I64, B
from packing.model import (
    Isolation,
    PodDemand,
)
from packing.state import ClusterState
from packing.views import ALLOWED_CODE

# mode code -> allowed, per isolation; the extra last entry (mode -1) is "no GPU here".
MODE_OK: dict[Isolation, B] = ALLOWED_CODE
I64_MAX = int(np.iinfo(np.int64).max)
ROUND = 1e6  # losses are rounded to 1e-6 so that float noise never breaks a genuine tie


@dataclass(frozen=True)
class PodShape:
    """One pod shape of the workload mix (what decides where a pod can go, minus its identity)."""

    vram_mib: int
    gpu_count: int = 1
    isolation: Isolation = Isolation.NONE
    tenant: str | None = "default"  # None: whichever tenant asks (a single-tenant mix, e.g. a trace)
    models: frozenset[str] | None = None
    cpu_milli: int = 0

    @staticmethod
    def of(pod: PodDemand) -> PodShape:
        return PodShape(pod.vram_mib, pod.gpu_count, pod.isolation, pod.tenant, pod.models, pod.cpu_milli)


def shape_weight(shape: PodShape, weighting: str) -> float:
    """Weight of one pod of this shape: 'count' (FGD's popularity) or 'mass' (the VRAM it asks for)."""
    if weighting == "count":
        return 1.0
    if weighting == "mass":
        return float(shape.vram_mib * shape.gpu_count)
    raise ValueError(f"unknown weighting {weighting!r}; use 'count' or 'mass'")


def top_mix(counts: Counter[PodShape], weighting: str = "count", coverage: float = 0.95,
            max_types: int = 64, dropped: float = 0.0) -> list[tuple[PodShape, float]]:
    """The most popular GPU shapes covering `coverage` of the weight (FGD keeps 95 %), weights summing to 1.

    CPU-only shapes are left out: they can use no GPU, so they never change a loss. `dropped`: the weight of
    GPU shapes no longer counted (`FragAware.max_shapes`), still part of the total the coverage is of.
    """
    weighted = [(s, c * shape_weight(s, weighting)) for s, c in counts.items() if s.gpu_count > 0]
    weighted = [(s, w) for s, w in weighted if w > 0]
    if not weighted:
        return []
    weighted.sort(key=mix_order)
    total = sum(w for _, w in weighted) + dropped
    kept: list[tuple[PodShape, float]] = []
    cum = 0.0
    for s, w in weighted:
        if cum >= coverage * total or len(kept) >= max_types:
            break
        kept.append((s, w))
        cum += w
    return [(s, w / cum) for s, w in kept]


def mix_order(sw: tuple[PodShape, float]) -> tuple[object, ...]:
    """Most weight first; equal weights in a fixed order of the shape (then the order they were first seen)."""
    return (-sw[1], sw[0].vram_mib, sw[0].gpu_count, sw[0].cpu_milli, sw[0].tenant or "")


# Largest per-pod VRAM, CPU or GPU count a learnt shape may have: the state's arrays are int64 (and CPU
# untracked is 2^40), the mix's GPU counts int8. A pod beyond these fits nowhere; learning it could only
# overflow the arithmetic of every later score.
LEARN_MAX = 1 << 40
LEARN_MAX_GPUS = 64


SCARCITY = ("nodes", "models", "none")


def scarcity_weights(weight: F64, shapes: Sequence[PodShape], kinds: Sequence[B], state: ClusterState,
                     by: str = "nodes") -> F64:
    """Each shape's weight times (GPUs in the cluster / GPUs it could ever use), renormalised.

    A shape can only ever use GPUs of the models it allows, on nodes with at least as many GPUs as it asks and
    at least as much CPU. Why: the measure counts the usable VRAM each shape loses, so a unit that only a few
    GPUs can offer a shape is worth more to it than one that any GPU offers. Without the model part, pods that
    could go anywhere fill the scarce models' nodes and the constrained pods later find no room (a trace with a
    third of GPU tasks constrained: 10.6 % unallocated against FGD's 9.4 %, POLICY_NOTES.md); without the node part, an 8-GPU
    pod that needs 120 CPUs counts every 8-GPU node as its own, the 8-GPU 128-CPU nodes it alone fits fill with
    small pods, and such pods fail from half the trace's arrivals on (a trace with half its tasks multi-GPU). The
    factor is 1 for a shape every GPU can serve, so such a mix is left as it was; it is taken from the state
    the arrays are built for. `by`: "nodes" (the default: models, GPU count and CPU), "models" (the GPU-model
    part alone) or "none" (the weights as given; ablations)."""
    if by not in SCARCITY:
        raise ValueError(f"unknown scarcity {by!r}; use one of {', '.join(SCARCITY)}")
    if not shapes or by == "none":
        return weight
    present = state.present
    total = float(present.sum())
    if total <= 0:
        return weight
    # Nodes grouped by (GPU count, CPU): a cluster has few such classes, and each shape's test is per class.
    # Why not per node: 128 shapes x 5,000 nodes cost ~12 ms a rebuild.
    per_node = present.sum(axis=1)
    classes, of_node = _node_classes(per_node, state.cpu_cap)
    width = len(kinds[0])  # kind ids, then "no GPU" (never allowed)
    rows = np.repeat(of_node, per_node)  # each present GPU's class, in the row-major order of [present]
    per_class = np.bincount(rows * width + state.kind[present], minlength=len(classes) * width)
    per_class = per_class.reshape(len(classes), width).astype(np.float64)
    usable = np.empty(len(shapes), dtype=np.float64)
    for j, (shape, ok) in enumerate(zip(shapes, kinds, strict=True)):
        fits = ((classes[:, 0] >= shape.gpu_count) & (classes[:, 1] >= shape.cpu_milli) if by == "nodes"
                else classes[:, 0] > 0)
        usable[j] = float(per_class[fits].sum(axis=0) @ ok)
    factor = np.where(usable > 0, total / np.maximum(usable, 1.0), 1.0)
    if np.all(factor == 1.0):
        return weight
    scaled = weight * factor
    return scaled * (weight.sum() / scaled.sum())


def _node_classes(gpus: I64, cpu: I64) -> tuple[I64, npt.NDArray[np.intp]]:
    """(distinct (GPU count, CPU) rows [C, 2], each node's class): one int64 key per node, as a row-wise
    np.unique sorts void records (~4 ms at 5,000 nodes against ~0.2). The class order differs from the row-wise
    one; the sums over classes it feeds are of whole numbers, so exact in any order."""
    gpus = np.asarray(gpus, dtype=np.int64)
    cpu = np.asarray(cpu, dtype=np.int64)
    if gpus.size and (gpus.min() < 0 or gpus.max() >= _GPU_KEY or cpu.min() < 0 or cpu.max() >= _CPU_KEY_MAX):
        classes, of_node = np.unique(np.stack([gpus, cpu], axis=1), axis=0, return_inverse=True)
        return classes, of_node.reshape(-1)
    keys, of_node = np.unique(cpu * _GPU_KEY + gpus, return_inverse=True)
    return np.stack([keys % _GPU_KEY, keys // _GPU_KEY], axis=1), of_node.reshape(-1)


_GPU_KEY = 1 << 8  # GPU counts per node below this fit the key's low bits
_CPU_KEY_MAX = 1 << 54  # CPU (milli) below this leaves the key within int64


# The FGD measure's share of the weight under measure 'both', by the workload's CPU pressure (cpu_pressure):
# FGD_SHARE_HI up to PRESSURE_LO, falling linearly to FGD_SHARE_LO at PRESSURE_HI and beyond. Why: FGD's measure
# keeps whole GPUs whole for the multi-GPU and large shapes, the 'units' measure also counts the CPU a node has
# left for each shape; where CPU is plentiful the first matters more, where CPU binds the second (tuned
# on the tuning set's default and CPU-heavy rows only; POLICY_NOTES.md, "Workload variants").
FGD_SHARE_HI, FGD_SHARE_LO = 0.9, 0.5
PRESSURE_LO, PRESSURE_HI = 0.85, 1.0
CPU_UNTRACKED = 1 << 40  # cpu_cap of a node that reports no CPU (packing.usage): it tells nothing of pressure


def cpu_pressure(counts: Mapping[PodShape, float], state: ClusterState) -> float:
    """The CPU the workload asks per GPU it asks, over the CPU the cluster has per GPU (0: unknown).

    counts: every shape seen with its count, CPU-only pods included (they take CPU a GPU pod may need). A pod's
    GPUs count as gpu_count x its share of a GPU (VRAM over the cluster's mean largest unit, at most 1)."""
    present = state.present
    tracked = state.cpu_cap < CPU_UNTRACKED
    gpus = float(present[tracked].sum())
    if gpus <= 0 or not counts:
        return 0.0
    supply = float(state.cpu_cap[tracked].sum()) / gpus
    gpu_size = float(state.unit_cap[present].mean())
    if gpu_size <= 0:  # every GPU offers no unit (MIG GPUs with no instance created): no share can be told
        return 0.0
    cpu = sum(c * s.cpu_milli for s, c in counts.items())
    asked = sum(c * s.gpu_count * min(1.0, s.vram_mib / gpu_size) for s, c in counts.items() if s.gpu_count)
    if asked <= 0 or supply <= 0:
        return 0.0
    return (cpu / asked) / supply


def fgd_share_at(pressure: float) -> float:
    """The FGD measure's share of each shape's weight under 'both' at this CPU pressure (see FGD_SHARE_HI)."""
    t = min(max((pressure - PRESSURE_LO) / (PRESSURE_HI - PRESSURE_LO), 0.0), 1.0)
    return FGD_SHARE_HI - t * (FGD_SHARE_HI - FGD_SHARE_LO)


@dataclass(frozen=True)
class MixConsts:
    """Per-column constants of `node_value` (see `MixArrays.consts`)."""

    gpu_shape: B
    all_gpu: bool
    any_units: bool
    k: I64
    single: B
    cpu_pos: B
    cpu_den: I64


@dataclass
class MixArrays:
    """The mix as arrays, resolved against one state's tenant and GPU-kind ids."""

    shapes: tuple[PodShape, ...]
    vram: I64  # [M]
    count: I64  # [M]
    cpu: I64  # [M]
    weight: F64  # [M], sums to 1
    mode_ok: B  # [5, M] mode code (+ -1) -> shape may use it
    tenant_id: I64  # [M] state tenant ids (-2: tenant unknown to the state, -3: any tenant)
    kind_ok: B  # [K + 1, M] GPU kind id (+ -1) -> shape may use it
    units: B  # [M] this entry is valued by the 'units' measure (else by FGD's usable VRAM)
    _tenants: dict[str | None, int] | None = field(default=None, init=False, repr=False, compare=False)
    _consts: MixConsts | None = field(default=None, init=False, repr=False, compare=False)

    def consts(self) -> MixConsts:
        """Per-column constants of `node_value`, computed once per mix (it runs on every score)."""
        if self._consts is None:
            gpu_shape = self.count > 0
            self._consts = MixConsts(gpu_shape=gpu_shape, all_gpu=bool(gpu_shape.all()),
                                     any_units=bool(self.units.any()), k=np.maximum(self.count, 1),
                                     single=self.count == 1, cpu_pos=self.cpu > 0, cpu_den=np.maximum(self.cpu, 1))
        return self._consts

    @property
    def size(self) -> int:
        return len(self.shapes)

    @staticmethod
    def build(mix: Sequence[tuple[PodShape, float]], state: ClusterState, measure: str = "fgd",
              share: float = 0.5, scarcity: str = "nodes") -> MixArrays:
        """share: under 'both', the part of each shape's weight valued by FGD's measure (the rest by 'units');
        scarcity: how each shape's weight is scaled by the GPUs it could use (`scarcity_weights`)."""
        if measure not in ("fgd", "units", "both"):
            raise ValueError(f"unknown measure {measure!r}; use 'fgd', 'units' or 'both'")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share of the FGD measure must be within [0, 1], got {share!r}")
        flags = [measure == "units"] * len(mix)
        if measure == "both":  # each shape twice: `share` of its weight under FGD's measure, the rest under units
            mix = [(s, w * share) for s, w in mix] + [(s, w * (1.0 - share)) for s, w in mix]
            flags = [False] * (len(mix) // 2) + [True] * (len(mix) // 2)
        shapes = tuple(s for s, _ in mix)
        kinds = [state.allowed_kinds(s.models) for s in shapes]
        k = len(state.allowed_kinds(None))
        return MixArrays(
            shapes=shapes,
            vram=np.array([s.vram_mib for s in shapes], dtype=np.int64),
            count=np.array([s.gpu_count for s in shapes], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
            weight=scarcity_weights(np.array([w for _, w in mix], dtype=np.float64), shapes, kinds, state,
                                    scarcity),
            mode_ok=np.stack([MODE_OK[s.isolation] for s in shapes], axis=1) if shapes
            else np.zeros((5, 0), dtype=bool),
            tenant_id=np.array([tenant_id_of(state, s.tenant) for s in shapes], dtype=np.int64),
            kind_ok=np.stack(kinds, axis=1) if shapes else np.zeros((k, 0), dtype=bool),
            units=np.array(flags, dtype=bool),
        )

    def take(self, cols: npt.NDArray[np.intp]) -> MixArrays:
        """The mix restricted to some columns (weights as they are: per-column terms only)."""
        return MixArrays(shapes=tuple(self.shapes[int(j)] for j in cols), vram=self.vram[cols], count=self.count[cols],
                         cpu=self.cpu[cols], weight=self.weight[cols], mode_ok=self.mode_ok[:, cols],
                         tenant_id=self.tenant_id[cols], kind_ok=self.kind_ok[:, cols], units=self.units[cols])

    def stale(self, state: ClusterState) -> bool:
        """Tenant ids or GPU kinds the arrays were resolved against have changed."""
        if self.kind_ok.shape[0] != len(state.allowed_kinds(None)):
            return True
        # One look-up per distinct tenant, not per shape: this runs on every score.
        if self._tenants is None:
            self._tenants = {s.tenant: int(t) for s, t in zip(self.shapes, self.tenant_id, strict=True)}
        return any(tenant_id_of(state, name) != t for name, t in self._tenants.items())


ANY_TENANT = -3


def tenant_id_of(state: ClusterState, tenant: str | None) -> int:
    return ANY_TENANT if tenant is None else state.known_tenant_id(tenant)


def cpu_per_vram(mix: Sequence[tuple[PodShape, float]]) -> float:
    """CPU (milli) per VRAM unit the GPU pods of a mix ask for, count-weighted; 0 if none ask."""
    cpu = vram = 0.0
    for sh, w in mix:
        if sh.gpu_count > 0 and sh.vram_mib > 0:
            cpu += w * sh.cpu_milli
            vram += w * sh.vram_mib * sh.gpu_count
    return cpu / vram if vram > 0 else 0.0
