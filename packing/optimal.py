"""Proven-optimal placement of a batch of pending pods with OR-Tools CP-SAT.

The model encodes exactly the rules `ClusterState.allocate` enforces (see `state._grant_problem`):
units per mode, MIG instances, tenancy of shared GPUs, isolation, GPU models, multi-GPU pods on
distinct GPUs of one node, node CPU/memory; existing holders stay where they are. Every solution is
replayed through `ClusterState.allocate` before it is returned, so a modelling slip can never leak out
as an invalid placement.

Formulation (chosen so that 1,000 pods x 2,000 GPUs stays small):
- identical pods are grouped into classes (same `PodDemand.shape`); variables count pods, not pods x GPUs;
- classes are merged into units per GPU family (`Unit`): on whole GPUs and MIG neither tenant nor
  isolation matters; flow variables hand each unit's places to its member classes (exact);
- per (unit, GPU) an integer `x` = grants on that GPU; MIG GPUs split `x` by the size of the free
  instance used (`z`), which is an exact matching because "fits" is monotone in instance size; pooled
  GPUs (MPS without replicas, time-slicing) get size-threshold cuts so the LP is not fooled;
- a k-GPU class gets `m` pods per node with sum_g x = k*m and x <= m, which always decomposes into pods
  on k distinct GPUs (fill round-robin);
- identical GPUs of a node and identical nodes are ordered by the VRAM they receive (symmetry breaking);
- independent node groups (no pod class can use both) are solved separately (decomposition);
- the online policy's own placement seeds the search (`add_hint`);
- a node group too big for one model (`LARGE_MODEL`) is solved by a portfolio: insertion where capacity
  says there is room, large-neighbourhood search that re-solves random groups of nodes exactly, the unit-
  counting bound of `packing.bound` as the proof, and the whole model when it is small enough.

Objective, lexicographic, one CP-SAT solve per stage (each fixes the previous stage's value):
1. most pending pods placed; 2. fewest GPUs opened (idle before, used after); 3. least stranded VRAM,
counted per grant as the unit's memory minus the pod's VRAM (whole GPU, MIG instance, MPS share).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from packing.model import (
    ALLOWED_MODES,
    SHARED_FAILURE_MODES,
    Assignment,
    GpuGrant,
    Isolation,
    MigInstance,
    Mode,
    PodDemand,
)
from packing.state import ClusterState, GpuUsage, PlacementError, gpu_model_allowed

LinExpr = cp_model.LinearExprT
Terms = tuple[list[tuple[cp_model.IntVar, int]], int]  # sum(coef * var) + offset

LARGE_MODEL = 40_000  # GPUs x pod classes in one node group beyond which one model is not attempted
LNS_GROUP = 12  # nodes re-optimised together in one large-neighbourhood step
MODEL_VARS_LIMIT = 30_000  # a large group's whole model is solved only below this many count variables


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class StageResult:
    """One lexicographic stage: what it optimised, the value found, the proven bound, the status."""

    name: str
    value: int
    bound: int
    status: str
    wall_s: float

    @property
    def proven(self) -> bool:
        return self.status == "OPTIMAL"


@dataclass
class OptimalResult:
    """Placements of the pending pods (pod key -> Assignment, None = unplaced) and the proof status."""

    placements: dict[str, Assignment | None]
    placed: int
    unplaced: int
    gpus_opened: int
    stranded_vram_mib: int  # the core's ClusterState.stranded_mib() after placing
    optimal: bool  # every stage proven optimal
    bound: int  # upper bound on pods placed (== placed when proven)
    gap: float  # (bound - placed) / bound on pods placed
    wall_s: float
    stages: list[StageResult] = field(default_factory=list)
    components: int = 1
    state: ClusterState | None = None  # the state after placing (a copy; the input is not touched)

    def summary(self) -> dict[str, object]:
        return {
            "placed": self.placed,
            "unplaced": self.unplaced,
            "gpus_opened": self.gpus_opened,
            "stranded_vram_mib": self.stranded_vram_mib,
            "optimal": self.optimal,
            "bound": self.bound,
            "gap": round(self.gap, 6),
            "wall_s": round(self.wall_s, 3),
            "components": self.components,
        }


# ------------------------------------------------------------------------------------------- the GPUs
@dataclass
class GpuSlot:
    """One physical GPU as the model sees it: what a new pod could still get there."""

    gid: int  # global id inside one model
    node: str
    index: int
    usage: GpuUsage
    idle: bool
    slots: int  # pods that can still join
    per_pod_max: int  # largest VRAM one new pod could get (MIG: largest free instance)
    pool: int | None  # remaining sum-of-VRAM budget (MPS without replicas, time-slicing)
    owner: str | None  # tenant owning a shared GPU's failure domain
    buckets: dict[int, list[MigInstance]]  # MIG: free instances by memory size
    stranded_unit: int | None  # per-grant unit size for the stranded objective (None: not counted)
    whole: bool = False  # whole-GPU semantics (the plain-Kubernetes baseline): one pod takes the GPU

    @property
    def mode(self) -> Mode:
        return Mode.EXCLUSIVE if self.whole else self.usage.gpu.mode

    def signature(self) -> tuple[object, ...]:
        """Equal signatures = interchangeable GPUs (for symmetry breaking)."""
        g = self.usage.gpu
        return (self.whole, g.mode, g.memory_mib, g.replicas, g.model, g.product, self.idle, self.slots, self.per_pod_max,
                self.pool, self.owner, tuple(sorted((s, len(v)) for s, v in self.buckets.items())),
                tuple(sorted(i.ref for i in g.mig)), tuple(sorted(self.usage.mig_holder)),
                tuple(sorted(self.usage.tenants.items())))


def gpu_slot(gid: int, node: str, gu: GpuUsage, whole_gpu: bool = False) -> GpuSlot:
    """Describe the residual capacity of one GPU, mirroring state.GpuUsage.

    whole_gpu: the baseline's semantics (fit.feasible(whole_gpu=True)): an idle GPU of any mode goes whole
    to one pod, whatever its isolation or tenant.
    """
    g = gu.gpu
    if whole_gpu:
        free = not gu.grants and gu.whole_holder is None
        return GpuSlot(gid=gid, node=node, index=g.index, usage=gu, idle=not gu.grants, slots=int(free),
                       per_pod_max=g.memory_mib if free else 0, pool=None, owner=None, buckets={},
                       stranded_unit=g.memory_mib, whole=True)
    buckets: dict[int, list[MigInstance]] = defaultdict(list)
    pool: int | None = None
    stranded_unit: int | None = None
    if g.mode is Mode.MIG and gu.whole_holder is None:
        for inst in gu.free_instances():
            buckets[inst.memory_mib].append(inst)
    elif g.mode is Mode.EXCLUSIVE:
        stranded_unit = g.memory_mib
    elif g.mode is Mode.MPS and g.replicas:
        stranded_unit = gu.share_mib()
    else:
        pool = g.memory_mib - gu.used_mib
    return GpuSlot(gid=gid, node=node, index=g.index, usage=gu, idle=not gu.grants, slots=gu.slots_free(),
                   per_pod_max=gu.unit_max(), pool=pool, owner=gu.tenant(), buckets=dict(buckets),
                   stranded_unit=stranded_unit)


def grant_ok(slot: GpuSlot, pod: PodDemand, relax_tenancy: bool) -> bool:
    """Could one grant of `pod` go onto this GPU now (ignoring other pending pods)? Same rules as allocate."""
    g = slot.usage.gpu
    if slot.usage.whole_holder is not None or slot.slots <= 0:
        return False
    if not gpu_model_allowed(g, pod.models):
        return False
    if slot.whole:
        return pod.vram_mib <= slot.per_pod_max
    if g.mode not in ALLOWED_MODES[pod.isolation]:
        return False
    if pod.vram_mib > slot.per_pod_max:
        return False
    if g.mode in SHARED_FAILURE_MODES and not relax_tenancy and slot.owner not in (None, pod.tenant):
        return False
    return True


# ------------------------------------------------------------------------------------------- pod classes
@dataclass
class PodClass:
    """Pending pods with one shape; `pods` in placement priority order (priority desc, then queue order)."""

    cid: int
    pods: list[PodDemand]
    drainable: list[PodDemand] = field(default_factory=list)  # repartition: holders that may be drained

    @property
    def extra(self) -> int:
        return len(self.drainable)

    @property
    def rep(self) -> PodDemand:
        return self.pods[0] if self.pods else self.drainable[0]

    @property
    def vram(self) -> int:
        return self.rep.vram_mib

    @property
    def k(self) -> int:
        return self.rep.gpu_count


def group_pods(pending: Sequence[PodDemand]) -> list[PodClass]:
    by_shape: dict[tuple[object, ...], list[tuple[int, PodDemand]]] = {}
    for i, p in enumerate(pending):
        by_shape.setdefault(p.shape, []).append((i, p))
    out: list[PodClass] = []
    for items in by_shape.values():
        items.sort(key=lambda t: (-t[1].priority, t[0]))
        out.append(PodClass(cid=len(out), pods=[p for _, p in items]))
    return out


FAMILY: dict[Mode, str] = {Mode.EXCLUSIVE: "hw", Mode.MIG: "hw", Mode.MPS: "mps", Mode.TIMESLICE: "ts"}


@dataclass
class Unit:
    """Pod classes that are interchangeable on one family of GPUs (the model's counting unit).

    On whole GPUs and MIG instances ("hw") neither tenant nor isolation matters, so every class of one
    size shares a unit; on MPS ("mps") and time-slicing ("ts") the tenant matters and only isolation levels
    that allow the mode join. Multi-GPU classes may mix families on one node, so each is its own unit
    ("any"). Which pod class fills a unit is decided by flow variables (exact: a transportation problem).
    """

    cid: int
    family: str  # "hw" | "mps" | "ts" | "any"
    rep: PodDemand  # stands for every member on this family (eligibility)
    members: list[PodClass]

    @property
    def vram(self) -> int:
        return self.rep.vram_mib

    @property
    def k(self) -> int:
        return self.rep.gpu_count

    @property
    def total(self) -> int:
        return sum(len(c.pods) + c.extra for c in self.members)


def build_units(classes: Sequence[PodClass], relax_tenancy: bool) -> list[Unit]:
    units: list[Unit] = []
    by_size: dict[tuple[object, ...], list[PodClass]] = defaultdict(list)
    for c in classes:
        if c.k > 1:
            units.append(Unit(len(units), "any", c.rep, [c]))
        else:
            r = c.rep
            by_size[r.vram_mib, r.cpu_milli, r.memory_mib, r.models].append(c)
    for members in by_size.values():
        units.append(Unit(len(units), "hw", members[0].rep, list(members)))
        for family, mode, iso in (("mps", Mode.MPS, Isolation.PROCESS), ("ts", Mode.TIMESLICE, Isolation.NONE)):
            by_tenant: dict[str | None, list[PodClass]] = defaultdict(list)
            for c in members:
                if mode in ALLOWED_MODES[c.rep.isolation]:
                    by_tenant[None if relax_tenancy else c.rep.tenant].append(c)
            for group in by_tenant.values():
                rep = replace(group[0].rep, isolation=iso)
                units.append(Unit(len(units), family, rep, group))
    return units


# ------------------------------------------------------------------------------------------- the model
@dataclass
class MigChoice:
    """Repartition: a MIG GPU whose layout the model chooses (built by packing.repartition)."""

    placements: list[MigInstance]  # every allowed (profile, start) with its memory
    layouts: list[tuple[int, ...]]  # valid layouts as 0/1 vectors over `placements`
    current: tuple[int, ...]  # current layout as a 0/1 vector
    holder_at: dict[int, str]  # placement position -> pod key holding that instance now
    max_instances: int = 7


@dataclass
class NodeInfo:
    name: str
    slots: list[GpuSlot]
    cpu_free: int | None
    mem_free: int | None

    def signature(self) -> tuple[object, ...]:
        return (self.cpu_free, self.mem_free, tuple(sorted((s.signature() for s in self.slots), key=repr)))


class PackingModel:
    """The CP-SAT model for one group of nodes and the pod classes that can use them."""

    def __init__(self, nodes: list[NodeInfo], classes: list[PodClass], relax_tenancy: bool,
                 mig_choices: dict[int, MigChoice] | None = None, symmetry: bool = True,
                 holder_positions: dict[str, list[tuple[int, int]]] | None = None,
                 pinned: frozenset[str] = frozenset()) -> None:
        self.nodes = nodes
        self.classes = classes
        self.relax = relax_tenancy
        self.units = build_units(classes, relax_tenancy)
        self.flow: dict[tuple[int, int], cp_model.IntVar] = {}  # (unit id, class id) -> pods
        self.choices = mig_choices or {}
        self.m = cp_model.CpModel()
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}  # (unit, gid) -> grants
        self.z: dict[tuple[int, int, int], cp_model.IntVar] = {}  # (unit, gid, size) -> grants on MIG size
        self.a: dict[tuple[int, int, int], cp_model.IntVar] = {}  # (unit, gid, pos) -> grant on placement
        self.b: dict[tuple[int, int], cp_model.IntVar] = {}  # (gid, pos) -> placement chosen
        self.kept: dict[str, cp_model.IntVar] = {}  # holder key -> keeps running (repartition)
        self.reconf: dict[int, cp_model.IntVar] = {}  # gid -> layout changes
        self.mult: dict[tuple[int, str], cp_model.IntVar] = {}  # (unit, node) -> k-GPU pods on node
        self.opened: dict[int, cp_model.IntVar] = {}
        self.uplaced: dict[int, cp_model.IntVar] = {}  # unit -> pods placed
        self.placed: dict[int, cp_model.IntVar] = {}  # pod class -> pods placed
        self.slot_by_gid: dict[int, GpuSlot] = {s.gid: s for n in nodes for s in n.slots}
        self._stranded_terms: list[tuple[cp_model.IntVar, int]] = []
        # Repartition: a holder on MIG placements keeps running iff every one of its instances survives.
        for key in holder_positions or {}:
            kv = self.m.new_bool_var(f"kept_{key}")
            self.kept[key] = kv
            if key in pinned:
                self.m.add(kv == 1)
        self._holder_positions = holder_positions or {}
        self._build(symmetry)
        for key, pos in self._holder_positions.items():
            self.m.add_min_equality(self.kept[key], [self.b[gp] for gp in pos])

    # ---------------------------------------------------------------- build
    def _eligible(self, c: Unit, s: GpuSlot) -> bool:
        if c.family != "any" and FAMILY[s.mode] != c.family:
            return False
        if s.gid in self.choices:
            ch = self.choices[s.gid]
            g = s.usage.gpu
            pod = c.rep
            return (gpu_model_allowed(g, pod.models) and Mode.MIG in ALLOWED_MODES[pod.isolation]
                    and any(inst.memory_mib >= pod.vram_mib for inst in ch.placements))
        return grant_ok(s, c.rep, self.relax)

    def _build(self, symmetry: bool) -> None:
        m = self.m
        pods_on_node: dict[tuple[int, str], list[LinExpr]] = defaultdict(list)
        for node in self.nodes:
            for c in self.units:
                total = c.total
                elig = [s for s in node.slots if self._eligible(c, s)]
                if len(elig) < c.k or total == 0:
                    continue
                if c.k > 1:
                    mv = m.new_int_var(0, min(total, self._max_pods_per_gpu(elig)), f"m{c.cid}_{node.name}")
                    self.mult[c.cid, node.name] = mv
                for s in elig:
                    ub = min(total, self._cap(c, s))
                    if ub <= 0:
                        continue
                    self.x[c.cid, s.gid] = m.new_int_var(0, ub, f"x{c.cid}_{s.gid}")
                if c.k > 1:
                    xs = [self.x[c.cid, s.gid] for s in elig if (c.cid, s.gid) in self.x]
                    mv = self.mult[c.cid, node.name]
                    m.add(sum(xs) == c.k * mv)
                    for xv in xs:
                        m.add(xv <= mv)
                    pods_on_node[c.cid, node.name].append(mv)
                else:
                    pods_on_node[c.cid, node.name].extend(
                        self.x[c.cid, s.gid] for s in elig if (c.cid, s.gid) in self.x)
            self._node_resources(node, pods_on_node)
        flows: dict[int, list[cp_model.IntVar]] = defaultdict(list)
        for u in self.units:
            terms = [e for node in self.nodes for e in pods_on_node.get((u.cid, node.name), [])]
            if not terms:
                continue
            uv = m.new_int_var(0, u.total, f"uplaced{u.cid}")
            m.add(uv == sum(terms))
            self.uplaced[u.cid] = uv
            fs = []
            for pc in u.members:
                fv = m.new_int_var(0, len(pc.pods) + pc.extra, f"f{u.cid}_{pc.cid}")
                self.flow[u.cid, pc.cid] = fv
                flows[pc.cid].append(fv)
                fs.append(fv)
            m.add(uv == sum(fs))
        for pc in self.classes:
            pv = m.new_int_var(0, len(pc.pods) + pc.extra, f"placed{pc.cid}")
            m.add(pv == sum(flows[pc.cid]))
            self.placed[pc.cid] = pv
            if pc.drainable:
                # Every drained holder must be placed again; pending pods fill the rest.
                drained = pc.extra - sum(self.kept[h.key] for h in pc.drainable)
                m.add(pv >= drained)
                m.add(pv - drained <= len(pc.pods))
        for node in self.nodes:
            for s in node.slots:
                self._gpu_rules(s)
        if symmetry:
            self._symmetry()

    def _cap(self, c: Unit, s: GpuSlot) -> int:
        """Most grants of class c the GPU could take on its own."""
        if s.gid in self.choices:
            ch = self.choices[s.gid]
            return min(ch.max_instances, sum(1 for inst in ch.placements if inst.memory_mib >= c.vram))
        if s.mode is Mode.MIG:
            return sum(len(v) for size, v in s.buckets.items() if size >= c.vram)
        n = s.slots
        if s.pool is not None:
            n = min(n, s.pool // max(1, c.vram))
        return n

    def _max_pods_per_gpu(self, elig: list[GpuSlot]) -> int:
        return sum(min(s.slots, 1 << 20) if s.gid not in self.choices else self.choices[s.gid].max_instances
                   for s in elig)

    def _node_resources(self, node: NodeInfo, pods_on_node: dict[tuple[int, str], list[LinExpr]]) -> None:
        for free, attr in ((node.cpu_free, "cpu_milli"), (node.mem_free, "memory_mib")):
            if free is None:
                continue
            terms = [getattr(c.rep, attr) * e for c in self.units if getattr(c.rep, attr) > 0
                     for e in pods_on_node.get((c.cid, node.name), [])]
            if terms:
                self.m.add(sum(terms) <= free)

    def _gpu_rules(self, s: GpuSlot) -> None:
        m = self.m
        cls = [c for c in self.units if (c.cid, s.gid) in self.x]
        if s.gid in self.choices:
            self._layout_rules(s, cls)
        if not cls:
            return
        xs = [self.x[c.cid, s.gid] for c in cls]
        if s.gid in self.choices:
            pass  # capacity is per placement, set in _layout_rules
        elif s.mode is Mode.MIG:
            sizes = sorted(s.buckets)
            for c in cls:
                parts = []
                for size in sizes:
                    if size >= c.vram:
                        zv = m.new_int_var(0, min(len(s.buckets[size]), c.total),
                                           f"z{c.cid}_{s.gid}_{size}")
                        self.z[c.cid, s.gid, size] = zv
                        parts.append(zv)
                        self._stranded_terms.append((zv, size - c.vram))
                m.add(self.x[c.cid, s.gid] == sum(parts))
            for size in sizes:
                zs = [zv for (cid, gid, sz), zv in self.z.items() if gid == s.gid and sz == size]
                if zs:
                    m.add(sum(zs) <= len(s.buckets[size]))
        else:
            m.add(sum(xs) <= s.slots)
            if s.pool is not None:
                m.add(sum(c.vram * self.x[c.cid, s.gid] for c in cls) <= s.pool)
                # Size-threshold cuts (valid for integers, strong for the LP): at most pool // v pods of
                # v MiB or more fit. Without them the LP bound counts 1.1 pods of 72 GB on an 80 GB GPU.
                for v in sorted({max(1, c.vram) for c in cls}):
                    big = [self.x[c.cid, s.gid] for c in cls if c.vram >= v]
                    limit = min(s.slots, s.pool // v)
                    if limit < sum(self._cap(c, s) for c in cls if c.vram >= v):
                        m.add(sum(big) <= limit)
            if s.stranded_unit is not None:
                for c in cls:
                    self._stranded_terms.append((self.x[c.cid, s.gid], s.stranded_unit - c.vram))
            if s.mode in SHARED_FAILURE_MODES and not self.relax and s.owner is None:
                tenants = sorted({c.rep.tenant for c in cls})
                if len(tenants) > 1:
                    tv = {t: m.new_bool_var(f"t{s.gid}_{t}") for t in tenants}
                    m.add_at_most_one(tv.values())
                    for t in tenants:
                        xt = [self.x[c.cid, s.gid] for c in cls if c.rep.tenant == t]
                        m.add(sum(xt) <= min(s.slots, sum(self._cap(c, s) for c in cls)) * tv[t])
        if s.idle:
            ov = m.new_bool_var(f"open{s.gid}")
            cap = max(1, sum(self._cap(c, s) for c in cls))
            m.add(sum(xs) <= cap * ov)
            m.add(sum(xs) >= ov)
            self.opened[s.gid] = ov

    def _layout_rules(self, s: GpuSlot, cls: list[Unit]) -> None:
        """Repartition: choose one valid layout; holders keep running only where their instance survives."""
        m = self.m
        ch = self.choices[s.gid]
        bs = [m.new_bool_var(f"b{s.gid}_{q}") for q in range(len(ch.placements))]
        for q, bv in enumerate(bs):
            self.b[s.gid, q] = bv
        m.add_allowed_assignments(bs, ch.layouts)
        diffs = []
        for q, bv in enumerate(bs):
            diffs.append(bv.Not() if ch.current[q] else bv)
        rv = m.new_bool_var(f"reconf{s.gid}")
        m.add_bool_or(diffs).only_enforce_if(rv)
        for d in diffs:
            m.add_implication(d, rv)
        self.reconf[s.gid] = rv
        for q, inst in enumerate(ch.placements):
            grants = []
            for c in cls:
                if inst.memory_mib >= c.vram:
                    av = m.new_bool_var(f"a{c.cid}_{s.gid}_{q}")
                    self.a[c.cid, s.gid, q] = av
                    grants.append(av)
                    self._stranded_terms.append((av, inst.memory_mib - c.vram))
            occupied: list[LinExpr] = list(grants)
            key = ch.holder_at.get(q)
            if key is not None:
                occupied.append(self.kept[key])
            if occupied:
                m.add(sum(occupied) <= bs[q])
        for c in cls:
            parts = [av for (cid, gid, _q), av in self.a.items() if cid == c.cid and gid == s.gid]
            m.add(self.x[c.cid, s.gid] == sum(parts))

    def _symmetry(self) -> None:
        """Order interchangeable GPUs of a node, and interchangeable nodes, by the VRAM they receive."""
        m = self.m
        self.load: dict[int, LinExpr] = {}
        for node in self.nodes:
            for s in node.slots:
                terms = [c.vram * self.x[c.cid, s.gid] for c in self.units if (c.cid, s.gid) in self.x]
                self.load[s.gid] = sum(terms) if terms else 0
        self.sym_gpu_groups: list[list[int]] = []
        for node in self.nodes:
            groups: dict[tuple[object, ...], list[GpuSlot]] = defaultdict(list)
            for s in node.slots:
                if s.gid in self.choices and self.choices[s.gid].holder_at:
                    continue  # holders pin positions; not interchangeable
                groups[s.signature()].append(s)
            for members in groups.values():
                if len(members) < 2:
                    continue
                self.sym_gpu_groups.append([s.gid for s in members])
                for a, b in zip(members, members[1:], strict=False):
                    _add_ge(m, self.load[a.gid], self.load[b.gid])
        self.sym_node_groups: list[list[str]] = []
        ngroups: dict[tuple[object, ...], list[NodeInfo]] = defaultdict(list)
        for node in self.nodes:
            if any(s.gid in self.choices and self.choices[s.gid].holder_at for s in node.slots):
                continue
            ngroups[node.signature()].append(node)
        for nmembers in ngroups.values():
            if len(nmembers) < 2:
                continue
            self.sym_node_groups.append([n.name for n in nmembers])
            loads = [sum(self.load[s.gid] for s in n.slots) for n in nmembers]
            for la, lb in zip(loads, loads[1:], strict=False):
                _add_ge(m, la, lb)

    # ---------------------------------------------------------------- objectives
    def placed_terms(self) -> Terms:
        """Pending pods placed (drained holders that must be re-placed are not counted)."""
        kept = [(self.kept[h.key], 1) for c in self.classes for h in c.drainable]
        return [(v, 1) for v in self.placed.values()] + kept, -sum(c.extra for c in self.classes)

    def opened_terms(self) -> Terms:
        return [(v, 1) for v in self.opened.values()], 0

    def stranded_terms(self) -> Terms:
        return [(v, w) for v, w in self._stranded_terms if w > 0], 0

    def drained_terms(self) -> Terms:
        return [(v, -1) for v in self.kept.values()], len(self.kept)

    def reconf_terms(self) -> Terms:
        return [(v, 1) for v in self.reconf.values()], 0

    def all_vars(self) -> list[cp_model.IntVar]:
        out: list[cp_model.IntVar] = []
        for d in (self.x, self.z, self.a, self.b, self.kept, self.reconf, self.mult, self.opened, self.uplaced,
                  self.flow, self.placed):
            out.extend(d.values())  # type: ignore[arg-type]
        return out


# ------------------------------------------------------------------------------------------- solving
Objective = tuple[str, Callable[[PackingModel], Terms], bool]  # (name, terms, maximise)

STAGES: list[Objective] = [
    ("placed", PackingModel.placed_terms, True),
    ("gpus_opened", PackingModel.opened_terms, False),
    ("stranded_vram_mib", PackingModel.stranded_terms, False),
]


def _expr(terms: Terms) -> LinExpr:
    pairs, offset = terms
    if not pairs:
        return offset
    return cp_model.LinearExpr.weighted_sum([v for v, _ in pairs], [c for _, c in pairs]) + offset


def _trivial_bound(pm: PackingModel, maximise: bool, value: int) -> int:
    """A bound that needs no search: every pending pod placed, or nothing saved for minimisations."""
    return sum(len(c.pods) for c in pm.classes) if maximise else 0


def _eval(terms: Terms, values: dict[cp_model.IntVar, int]) -> int:
    pairs, offset = terms
    return sum(c * values.get(v, 0) for v, c in pairs) + offset


def _solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    solver.parameters.num_workers = workers
    return solver


def solve_stages(pm: PackingModel, stages: Sequence[Objective], time_limit: float, workers: int = 2,
                 hint: dict[cp_model.IntVar, int] | None = None, shares: Sequence[float] | None = None
                 ) -> tuple[dict[cp_model.IntVar, int] | None, list[StageResult]]:
    """Lexicographic optimisation: each stage optimises one expression and fixes it for the next.

    Returns the last feasible solution (variable -> value) and each stage's outcome. A stage that runs out
    of time keeps the best solution found; its bound says how far from proven it is.
    """
    m = pm.m
    deadline = time.monotonic() + time_limit
    shares = list(shares) if shares is not None else [0.6, 0.5, 1.0]
    variables = pm.all_vars()
    current = dict(hint) if hint else None
    results: list[StageResult] = []
    for i, (name, expr_fn, maximise) in enumerate(stages):
        left = deadline - time.monotonic()
        if left <= 0.02 and current is not None:
            # Out of time: report the stage unproven at the incumbent's value.
            value = _eval(expr_fn(pm), current)
            results.append(StageResult(name, value, _trivial_bound(pm, maximise, value), "NOT_RUN", 0.0))
            continue
        budget = left * (shares[i] if i < len(shares) else 1.0)
        if i == len(stages) - 1:
            budget = left
        terms = expr_fn(pm)
        expr = _expr(terms)
        m.clear_hints()
        if current is not None:
            for v in variables:
                if v in current:
                    m.add_hint(v, current[v])
        if maximise:
            m.maximize(expr)
        else:
            m.minimize(expr)
        solver = _solver(budget, workers)
        t0 = time.monotonic()
        status = solver.solve(m)
        wall = time.monotonic() - t0
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if current is None:
                results.append(StageResult(name, 0, 0, solver.status_name(status), wall))
                return None, results
            value = _eval(terms, current)
            results.append(StageResult(name, value, _trivial_bound(pm, maximise, value), solver.status_name(status),
                                       wall))
        else:
            current = {v: int(solver.value(v)) for v in variables}
            value = _eval(terms, current)
            bound = solver.best_objective_bound
            ibound = math.floor(bound + 1e-6) if maximise else math.ceil(bound - 1e-6)
            if maximise and name == "placed":
                ibound = min(ibound, _trivial_bound(pm, True, value))
            results.append(StageResult(name, value, int(ibound), solver.status_name(status), wall))
        # Fix this stage's achievement for the next ones.
        if maximise:
            m.add(expr >= results[-1].value)
        else:
            m.add(expr <= results[-1].value)
    return current, results


# ------------------------------------------------------------------------------------------- decomposition
def node_infos(state: ClusterState, names: Iterable[str] | None = None, whole_gpu: bool = False) -> list[NodeInfo]:
    out: list[NodeInfo] = []
    gid = 0
    for name in (names if names is not None else state.node_names):
        nu = state.usage(name)
        slots = []
        for gu in nu.gpus:
            slots.append(gpu_slot(gid, name, gu, whole_gpu))
            gid += 1
        cpu = None if nu.node.cpu_milli is None else nu.node.cpu_milli - nu.cpu_used
        mem = None if nu.node.memory_mib is None else nu.node.memory_mib - nu.mem_used
        out.append(NodeInfo(name, slots, cpu, mem))
    return out


def components(nodes: list[NodeInfo], classes: list[PodClass], relax: bool,
               eligible: Callable[[PodClass, GpuSlot], bool] | None = None
               ) -> list[tuple[list[NodeInfo], list[PodClass]]]:
    """Split into independent groups: a class and a node are linked when the class could use the node."""
    ok = eligible or (lambda c, s: grant_ok(s, c.rep, relax))
    parent: dict[object, object] = {}

    def find(a: object) -> object:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]  # type: ignore[index]
            a = parent[a]
        return a

    def union(a: object, b: object) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    for node in nodes:
        for c in classes:
            if sum(1 for s in node.slots if ok(c, s)) >= c.k:
                union(("c", c.cid), ("n", node.name))
    groups: dict[object, tuple[list[NodeInfo], list[PodClass]]] = {}
    for node in nodes:
        if ("n", node.name) in parent:
            groups.setdefault(find(("n", node.name)), ([], []))[0].append(node)
    for c in classes:
        if ("c", c.cid) in parent:
            groups.setdefault(find(("c", c.cid)), ([], []))[1].append(c)
    return [g for g in groups.values() if g[0] and g[1]]


# ------------------------------------------------------------------------------------------- hints
def greedy_assignments(state: ClusterState, pending: Sequence[PodDemand], policy: str = "vramfit"
                       ) -> dict[str, Assignment | None]:
    """The online policy's placement of `pending`, in order, on a copy of the state."""
    from packing.place import schedule_one  # local: optimal must import before place exists
    from packing.policies import get_policy

    sim = state.copy()
    pol = get_policy(policy)
    out: dict[str, Assignment | None] = {}
    for pod in pending:
        d = schedule_one(sim, pod, pol, explain_failures=False)
        out[pod.key] = d.assignment if d.node is not None else None
    return out


def _hint_from(pm: PackingModel, assignments: dict[str, Assignment | None], pods: dict[str, PodDemand],
               class_of: dict[str, int]) -> dict[cp_model.IntVar, int]:
    """Translate concrete assignments into model values, then sort them to respect symmetry breaking."""
    gid_of = {(s.node, s.index): s.gid for n in pm.nodes for s in n.slots}
    node_gids = {n.name: [s.gid for s in n.slots] for n in pm.nodes}
    per_gpu: dict[int, dict[tuple[str, int, int], int]] = defaultdict(lambda: defaultdict(int))
    per_node_mult: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    unit_of: dict[tuple[str, int], int] = {}
    for u in pm.units:
        for c in u.members:
            unit_of[u.family, c.cid] = u.cid
    flow_hint: dict[tuple[int, int], int] = defaultdict(int)
    for key, asg in assignments.items():
        if asg is None or key not in class_of or asg.node not in node_gids or not asg.gpus:
            continue
        pod = pods[key]
        first = gid_of.get((asg.node, asg.gpus[0].index))
        if first is None:
            continue
        family = "any" if pod.gpu_count > 1 else FAMILY[pm.slot_by_gid[first].mode]
        if (family, class_of[key]) not in unit_of:
            continue
        cid = unit_of[family, class_of[key]]
        ok = True
        for gr in asg.gpus:
            gid = gid_of.get((asg.node, gr.index))
            if gid is None or (cid, gid) not in pm.x or gr.whole != pm.slot_by_gid[gid].whole:
                ok = False
        if not ok:
            continue
        for gr in asg.gpus:
            gid = gid_of[(asg.node, gr.index)]
            per_gpu[gid]["x", cid, 0] += 1
            if gr.mig is not None:
                inst = pm.slot_by_gid[gid].usage.gpu.instance(gr.mig)
                if inst is not None:
                    per_gpu[gid]["z", cid, inst.memory_mib] += 1
        if pod.gpu_count > 1:
            per_node_mult[asg.node][cid] += 1
        flow_hint[cid, class_of[key]] += 1
    # Symmetry: within a group of interchangeable GPUs the loads must be non-increasing; nodes likewise.
    vram = {c.cid: c.vram for c in pm.units}

    def load(d: dict[tuple[str, int, int], int]) -> int:
        return sum(n * vram[cid] for (kind, cid, _), n in d.items() if kind == "x")

    for group in getattr(pm, "sym_gpu_groups", []):
        vals = sorted((per_gpu.get(g, {}) for g in group), key=load, reverse=True)
        for g, v in zip(group, vals, strict=True):
            per_gpu[g] = v  # type: ignore[assignment]
    for ngroup in getattr(pm, "sym_node_groups", []):
        # Interchangeable nodes: permute whole nodes, GPU by GPU in signature order.
        def ordered(name: str) -> list[int]:
            n = next(n for n in pm.nodes if n.name == name)
            return [s.gid for s in sorted(n.slots, key=lambda s: (repr(s.signature()), s.index))]

        orders = {name: ordered(name) for name in ngroup}
        bundles = [([dict(per_gpu.get(g, {})) for g in orders[name]], dict(per_node_mult.get(name, {})))
                   for name in ngroup]
        bundles.sort(key=lambda b: sum(load(d) for d in b[0]), reverse=True)
        for name, (gpus, mult) in zip(ngroup, bundles, strict=True):
            for g, d in zip(orders[name], gpus, strict=True):
                per_gpu[g] = d  # type: ignore[assignment]
            per_node_mult[name] = mult  # type: ignore[assignment]
        # Re-sort inside each node after the node permutation.
        for group in getattr(pm, "sym_gpu_groups", []):
            vals = sorted((per_gpu.get(g, {}) for g in group), key=load, reverse=True)
            for g, v in zip(group, vals, strict=True):
                per_gpu[g] = v  # type: ignore[assignment]
    hint: dict[cp_model.IntVar, int] = {}
    for (cid, gid), xv in pm.x.items():
        hint[xv] = per_gpu.get(gid, {}).get(("x", cid, 0), 0)
    for (cid, gid, size), zv in pm.z.items():
        hint[zv] = per_gpu.get(gid, {}).get(("z", cid, size), 0)
    for (cid, name), mv in pm.mult.items():
        hint[mv] = per_node_mult.get(name, {}).get(cid, 0)
    for gid, ov in pm.opened.items():
        hint[ov] = 1 if any(k[0] == "x" and n > 0 for k, n in per_gpu.get(gid, {}).items()) else 0
    per_class: dict[int, int] = defaultdict(int)
    for (uid, cid), fv in pm.flow.items():
        hint[fv] = flow_hint.get((uid, cid), 0)
        per_class[cid] += hint[fv]
    for uid, uv in pm.uplaced.items():
        hint[uv] = sum(n for (u, _c), n in flow_hint.items() if u == uid)
    for c in pm.classes:
        hint[pm.placed[c.cid]] = per_class[c.cid]
    return hint


# ------------------------------------------------------------------------------------------- extraction
def extract(pm: PackingModel, values: dict[cp_model.IntVar, int],
            instances: Callable[[GpuSlot], dict[int, MigInstance]] | None = None
            ) -> dict[str, tuple[str, list[GpuGrant]]]:
    """Concrete placements from a solution: pod key -> (node, grants).

    `instances(slot)` gives, for repartitioned GPUs, placement position -> the new MIG instance.
    """
    per_unit: dict[int, list[tuple[str, list[GpuGrant]]]] = defaultdict(list)
    for node in pm.nodes:
        free_by_size: dict[int, dict[int, list[MigInstance]]] = {
            s.gid: {size: list(v) for size, v in s.buckets.items()} for s in node.slots}
        for c in pm.units:
            # Per GPU, the units (MIG refs or None) this class gets there.
            units: dict[int, list[str | None]] = {}
            for s in node.slots:
                xv = pm.x.get((c.cid, s.gid))
                if xv is None or values.get(xv, 0) == 0:
                    continue
                n = values[xv]
                refs: list[str | None] = []
                if s.gid in pm.choices:
                    assert instances is not None
                    placed_inst = instances(s)
                    for q in range(len(pm.choices[s.gid].placements)):
                        av = pm.a.get((c.cid, s.gid, q))
                        if av is not None and values.get(av, 0):
                            refs.append(placed_inst[q].ref)
                elif s.mode is Mode.MIG:
                    for size in sorted(s.buckets):
                        zv = pm.z.get((c.cid, s.gid, size))
                        cnt = values.get(zv, 0) if zv is not None else 0
                        for _ in range(cnt):
                            refs.append(free_by_size[s.gid][size].pop().ref)
                else:
                    refs = [None] * n
                assert len(refs) == n, (c.cid, s.gid, refs, n)
                units[s.gid] = refs
            if not units:
                continue
            gids = sorted(units, key=lambda g: -len(units[g]))
            index_of = {s.gid: s.index for s in node.slots}
            whole = {s.gid: s.whole for s in node.slots}
            if c.k == 1:
                for g in gids:
                    for ref in units[g]:
                        per_unit[c.cid].append(
                            (node.name, [GpuGrant(index=index_of[g], vram_mib=c.vram, mig=ref, whole=whole[g])]))
                continue
            npods = values.get(pm.mult[c.cid, node.name], 0)
            seq = [(g, ref) for g in gids for ref in units[g]]
            # Round-robin over GPUs sorted by use: every GPU appears at most npods times, so pod j's
            # k units (j, j+npods, ...) land on distinct GPUs.
            for j in range(npods):
                pick = [seq[j + t * npods] for t in range(c.k)]
                grants = [GpuGrant(index=index_of[g], vram_mib=c.vram, mig=ref, whole=whole[g]) for g, ref in pick]
                per_unit[c.cid].append((node.name, sorted(grants, key=lambda gr: gr.index)))
    # Hand each unit's slots to pods of its member classes as the flow says, in each class's pod order.
    out: dict[str, tuple[str, list[GpuGrant]]] = {}
    next_pod: dict[int, int] = defaultdict(int)
    # Drained holders go first: the model guarantees each of them a place.
    order = {pc.cid: [h for h in pc.drainable if values.get(pm.kept[h.key], 1) == 0] + pc.pods
             for pc in pm.classes}
    for u in pm.units:
        slots = per_unit.get(u.cid, [])
        it = iter(slots)
        for pc in u.members:
            fv = pm.flow.get((u.cid, pc.cid))
            n = values.get(fv, 0) if fv is not None else 0
            for _ in range(n):
                node_name, grants = next(it)
                pod = order[pc.cid][next_pod[pc.cid]]
                next_pod[pc.cid] += 1
                out[pod.key] = (node_name, grants)
    return out


# ------------------------------------------------------------------------------------------- entry point
def solve_optimal(state: ClusterState, pending: Sequence[PodDemand], time_limit: float = 10.0,
                  workers: int = 2, hint: dict[str, Assignment | None] | None = None,
                  hint_policy: str | None = "vramfit", symmetry: bool = True, decompose: bool = True,
                  stages: Sequence[Objective] = STAGES, whole_gpu: bool = False,
                  large_threshold: int | None = LARGE_MODEL, seed: int = 0) -> OptimalResult:
    """Place `pending` optimally on top of what `state` already holds. `state` is not modified.

    `hint`: a known placement (e.g. the online policy's) to start from; when None and `hint_policy` is
    set, the online policy is run on a copy of the state to produce one.
    `whole_gpu`: solve under the whole-GPU baseline's rules instead (each idle GPU goes whole to one pod).
    `large_threshold`: a node group whose GPUs x pod classes exceeds it is improved by large-neighbourhood
    search over groups of nodes (each group solved exactly) and bounded by the whole model's relaxation,
    instead of one model that could not even be presolved in time. None = always one model.
    """
    t_start = time.monotonic()
    pending = list(pending)
    if len({p.key for p in pending}) != len(pending):
        raise ValueError("pending pods must have distinct keys")
    relax = bool(getattr(state, "relax_tenancy", False))
    classes = group_pods(pending)
    class_of = {p.key: c.cid for c in classes for p in c.pods}
    pods = {p.key: p for p in pending}
    nodes = node_infos(state, whole_gpu=whole_gpu)
    if whole_gpu and hint_policy is not None:
        hint_policy = "whole-gpu"
    if hint is None and hint_policy is not None and pending:
        try:
            hint = greedy_assignments(state, pending, hint_policy)
        except ImportError:
            hint = None
    groups = components(nodes, classes, relax) if decompose else [(nodes, classes)]
    sizes = [sum(len(n.slots) for n in ns) * max(1, len(cs)) for ns, cs in groups]
    total_size = sum(sizes) or 1
    placements: dict[str, Assignment | None] = {p.key: None for p in pending}
    all_stages: list[list[StageResult]] = []
    bound = 0
    result_state = state.copy()
    for (gnodes, gclasses), size in zip(groups, sizes, strict=True):
        elapsed = time.monotonic() - t_start
        budget = max(0.1, (time_limit - elapsed) * size / max(1, total_size))
        total_size -= size
        if decompose and large_threshold is not None and size > large_threshold and len(gnodes) > 2 * LNS_GROUP:
            # Too big to prove in one model: improve by node groups, bound with the whole model.
            comp_pods = [p for c in gclasses for p in c.pods]
            comp_hint = {p.key: (hint or {}).get(p.key) for p in comp_pods}
            got, stage_results = _solve_large(state, gnodes, gclasses, comp_pods, comp_hint, budget, workers,
                                              relax, symmetry, seed)
            all_stages.append(stage_results)
            bound += stage_results[0].bound
            for key, asg in got.items():
                if asg is not None:
                    result_state.allocate(pods[key], asg)
                    placements[key] = asg
            continue
        pm = PackingModel(gnodes, gclasses, relax, symmetry=symmetry)
        h = _hint_from(pm, hint, pods, class_of) if hint else None
        values, stage_results = solve_stages(pm, stages, budget, workers, h)
        all_stages.append(stage_results)
        first = stage_results[0] if stage_results else None
        bound += first.bound if first is not None else sum(len(c.pods) for c in gclasses)
        if values is None:
            continue
        for key, (node, grants) in extract(pm, values).items():
            asg = Assignment(node, tuple(grants))
            result_state.allocate(pods[key], asg)  # re-checks every rule
            placements[key] = asg
    placed = sum(1 for a in placements.values() if a is not None)
    optimal = all(s.proven for st in all_stages for s in st)
    opened = _opened(state, result_state)
    bound = max(bound, placed)
    merged = _merge_stages(all_stages)
    return OptimalResult(
        placements=placements, placed=placed, unplaced=len(pending) - placed, gpus_opened=opened,
        stranded_vram_mib=result_state.stranded_mib(), optimal=optimal, bound=bound,
        gap=(bound - placed) / bound if bound else 0.0, wall_s=time.monotonic() - t_start,
        stages=merged, components=len(groups), state=result_state)


def _sub_state(state: ClusterState, names: Sequence[str]) -> ClusterState:
    sub = ClusterState([state.node(n) for n in names], relax_tenancy=bool(getattr(state, "relax_tenancy", False)))
    for n in names:
        for h in state.holders_on(n):
            sub.allocate(h.pod, h.assignment, reserved=h.reserved)
    return sub


def _could_ever(slot: GpuSlot, pod: PodDemand) -> bool:
    """Could the GPU hold one grant of `pod` if everything placed by this batch left it (holders stay)?"""
    gu = slot.usage
    g = gu.gpu
    if gu.whole_holder is not None or not gpu_model_allowed(g, pod.models):
        return False
    if slot.whole:
        return pod.vram_mib <= g.memory_mib
    return g.mode in ALLOWED_MODES[pod.isolation] and gu.unit_cap() >= pod.vram_mib


def _quality(before: ClusterState, after: ClusterState, placed: int) -> tuple[int, int, int]:
    return placed, -_opened(before, after), -after.stranded_mib()


def _solve_large(state: ClusterState, nodes: list[NodeInfo], classes: list[PodClass], pods: list[PodDemand],
                 start: dict[str, Assignment | None], time_limit: float, workers: int, relax: bool,
                 symmetry: bool, seed: int) -> tuple[dict[str, Assignment | None], list[StageResult]]:
    """Large-neighbourhood search by node group, then an upper bound.

    Each step frees a group of nodes - half of them nodes where some unplaced pod has room now, half at
    random: the pods placed there and the unplaced pods are placed again by the exact model restricted to
    those nodes, seeded with the current placement (so a step never makes things worse). The bound is
    the tighter of unit counting (packing.bound.threshold_bound) and the whole model's proven bound.
    """
    import random

    from packing.capacity import capacity, choose_on_node  # capacity builds on this module

    t0 = time.monotonic()
    rng = random.Random(seed)
    by_key = {p.key: p for p in pods}
    current = dict(start)
    names = [n.name for n in nodes]
    name_set = set(names)
    now = state.copy()
    for key, asg in current.items():
        if asg is not None:
            now.allocate(by_key[key], asg)
    counters = {"steps": 0, "improved": 0}

    def lns(lns_end: float) -> None:
        room: list[str] = []
        steps = 0
        while time.monotonic() < lns_end - 0.3:
            unplaced = [p for p in pods if current.get(p.key) is None]
            if steps % 4 == 0:
                # Insert unplaced pods where there is room now (largest shapes first), then note nodes with room.
                by_shape: dict[tuple[object, ...], list[PodDemand]] = defaultdict(list)
                for p in unplaced:
                    by_shape[p.shape].append(p)
                for group_pods_ in sorted(by_shape.values(), key=lambda g: -g[0].vram_mib * g[0].gpu_count):
                    if time.monotonic() > lns_end:
                        break
                    room_left = {n: c for n, c in capacity(now, group_pods_[0]).nodes.items() if c > 0 and n in name_set}
                    for p in group_pods_:
                        while room_left:
                            n = next(iter(room_left))
                            asg = choose_on_node(now, n, p)
                            if asg is None:
                                del room_left[n]
                                continue
                            now.allocate(p, asg)
                            current[p.key] = asg
                            room_left[n] -= 1
                            if room_left[n] <= 0:
                                del room_left[n]
                            break
                        if not room_left:
                            break
                # Nodes that could ever hold an unplaced shape: where moving pods away may make room.
                unplaced = [p for p in pods if current.get(p.key) is None]
                room_set: set[str] = set()
                for p in {q.shape: q for q in unplaced}.values():
                    for info in nodes:
                        ok = sum(1 for sl in info.slots if _could_ever(sl, p))
                        if ok >= p.gpu_count:
                            room_set.add(info.name)
                room = sorted(room_set)
            k = min(LNS_GROUP, len(names))
            group = rng.sample(room, min(len(room), k // 2)) if room else []
            rest = [n for n in names if n not in set(group)]
            group += rng.sample(rest, min(len(rest), k - len(group)))
            gset = set(group)
            n_gpus = sum(len(state.node(n).gpus) for n in group)
            per_shape: dict[tuple[object, ...], int] = defaultdict(int)
            sub_pods = []
            for p in pods:
                asg = current.get(p.key)
                if asg is not None:
                    if asg.node in gset:
                        sub_pods.append(p)
                elif per_shape[p.shape] < min(n_gpus, 3) and len(sub_pods) < 60:
                    # A few unplaced pods per shape are enough to fill whatever room the step makes.
                    per_shape[p.shape] += 1
                    sub_pods.append(p)
            if not sub_pods:
                continue
            sub = _sub_state(state, group)
            old_hint = {p.key: current.get(p.key) for p in sub_pods}
            old_state = sub.copy()
            for key, asg in old_hint.items():
                if asg is not None:
                    old_state.allocate(by_key[key], asg)
            old_q = _quality(sub, old_state, sum(1 for a in old_hint.values() if a is not None))
            step_limit = min(1.5, max(0.3, lns_end - time.monotonic()))
            res = solve_optimal(sub, sub_pods, time_limit=step_limit, workers=workers, hint=old_hint,
                                hint_policy=None, symmetry=symmetry, large_threshold=None)
            assert res.state is not None
            steps += 1
            counters["steps"] += 1
            if _quality(sub, res.state, res.placed) > old_q:
                counters["improved"] += 1
                for key, asg in old_hint.items():
                    if asg is not None:
                        now.release(key)
                for key, asg in res.placements.items():
                    current[key] = asg
                    if asg is not None:
                        now.allocate(by_key[key], asg)

    from packing.bound import threshold_bound  # bound builds on this module

    # Portfolio: insert and improve by node group first (fast on loose clusters). If unit counting does
    # not prove that optimal, solve the whole model seeded with that result when it is small enough
    # (crowded clusters leave few (pod, GPU) pairs), else keep improving by node group.
    lns(t0 + 0.1 * time_limit)
    sub_all = state if len(names) == len(state.node_names) else _sub_state(state, names)
    bound = min(len(pods), threshold_bound(sub_all, pods))
    placed = sum(1 for a in current.values() if a is not None)
    proof_s = time.monotonic() - t0 if placed >= bound else None  # when pods placed was proven optimal
    model_stages: list[StageResult] | None = None
    if placed < bound:
        pm = PackingModel(nodes, classes, relax, symmetry=symmetry)
        if len(pm.x) + len(pm.z) <= MODEL_VARS_LIMIT:
            class_of = {p.key: c.cid for c in classes for p in c.pods}
            values, st = solve_stages(pm, STAGES, max(1.0, t0 + 0.93 * time_limit - time.monotonic()), workers,
                                      _hint_from(pm, current, by_key, class_of))
            if st and st[0].status in ("OPTIMAL", "FEASIBLE"):
                bound = min(bound, st[0].bound)
            if values is not None and st and st[0].value >= placed:
                current = {p.key: None for p in pods}
                for key, (node_name, grants) in extract(pm, values).items():
                    current[key] = Assignment(node_name, tuple(grants))
                model_stages = st
    if model_stages is None:
        lns(t0 + 0.93 * time_limit)
    placed = sum(1 for a in current.values() if a is not None)
    bound = max(placed, bound)
    wall = time.monotonic() - t0
    status = "OPTIMAL" if bound == placed else "FEASIBLE"
    if proof_s is not None:
        wall = proof_s  # stage 1 was settled then; the rest of the time went to GPUs and stranded VRAM
    final = state.copy()
    for key, asg in current.items():
        if asg is not None:
            final.allocate(by_key[key], asg)
    note = f"LNS({counters['steps']} steps, {counters['improved']} improved)"
    if model_stages is not None:
        later = [replace(st_, status=f"{note}+model:{st_.status}") for st_ in model_stages[1:]]
        return current, [StageResult("placed", placed, bound, status, wall), *later]
    return current, [StageResult("placed", placed, bound, status, wall),
                     StageResult("gpus_opened", _opened(state, final), 0, note, 0.0),
                     StageResult("stranded_vram_mib", final.stranded_mib(), 0, note, 0.0)]


def _opened(before: ClusterState, after: ClusterState) -> int:
    """GPUs idle before and in use after."""
    n = 0
    for name in before.node_names:
        for gu_before, gu_after in zip(before.usage(name).gpus, after.usage(name).gpus, strict=True):
            n += int(not gu_before.grants and bool(gu_after.grants))
    return n


def _add_ge(m: cp_model.CpModel, a: LinExpr, b: LinExpr) -> None:
    if isinstance(a, int) and isinstance(b, int):
        return
    m.add(a >= b)


def _merge_stages(per_group: list[list[StageResult]]) -> list[StageResult]:
    if not per_group:
        return []
    out = []
    for i in range(max(len(s) for s in per_group)):
        rows = [s[i] for s in per_group if i < len(s)]
        status = "OPTIMAL" if all(r.proven for r in rows) else ",".join(sorted({r.status for r in rows}))
        out.append(StageResult(rows[0].name, sum(r.value for r in rows), sum(r.bound for r in rows), status,
                               sum(r.wall_s for r in rows)))
    return out


def verify(state: ClusterState, pending: Sequence[PodDemand], placements: dict[str, Assignment | None]
           ) -> ClusterState:
    """Replay placements through ClusterState.allocate on a copy; raises PlacementError on any breach."""
    sim = state.copy()
    by_key = {p.key: p for p in pending}
    for key, asg in placements.items():
        if asg is not None:
            try:
                sim.allocate(by_key[key], asg)
            except PlacementError as e:
                raise PlacementError(f"optimal placement of {key} rejected by the core: {e}") from e
    return sim
