"""What the CP-SAT solvers see of a cluster and a queue: GPU slots (what a new pod could still get on one
GPU, and whether a grant there is allowed), pod classes (identical pods counted together), units (classes
merged per GPU family), nodes, and the decomposition into independent node groups.

Shared by `packing.solvers.model` (the model), `packing.solvers.capacity`, `packing.solvers.bound`, `packing.solvers.optimal` and
`packing.solvers.repartition`; it imports none of them, so none of them has to import another lazily.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from packing.model import (
    MigInstance,
    PodDemand,
)
from packing.modes import SHARED_FAMILIES, WHOLE_GPU, ModeRules
from packing.state import ClusterState
from packing.usage import GpuUsage, gpu_model_allowed


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
    def rules(self) -> ModeRules:
        """The GPU's mode rules; a GPU taken whole is exclusive."""
        return WHOLE_GPU if self.whole else self.usage.rules

    @property
    def family(self) -> str:
        """The CP-SAT sharing family (`ModeRules.family`); a GPU taken whole is one hardware unit."""
        return self.rules.family

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
    if gu.whole_holder is None:
        for inst in gu.rules.free_units(gu):
            buckets[inst.memory_mib].append(inst)
    stranded_unit = gu.rules.grant_unit(gu)
    pool = gu.rules.pool(gu)
    return GpuSlot(gid=gid, node=node, index=g.index, usage=gu, idle=not gu.grants, slots=gu.slots_free(),
                   per_pod_max=gu.unit_max(), pool=pool, owner=gu.tenant(), buckets=dict(buckets),
                   stranded_unit=stranded_unit)


def grant_ok(slot: GpuSlot, pod: PodDemand, relax_tenancy: bool) -> bool:
    """Could one grant of `pod` go onto this GPU now (ignoring other pending pods)? The mode's grant rule
    (`ModeRules.joinable`, which `allocate` enforces as `grant_problem`) on the slot's summary."""
    if slot.usage.whole_holder is not None or slot.slots <= 0:
        return False
    if not gpu_model_allowed(slot.usage.gpu, pod.models):
        return False
    return slot.rules.joinable(pod, slot.per_pod_max, slot.owner, relax_tenancy)


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




@dataclass
class Unit:
    """Pod classes that are interchangeable on one family of GPUs (the model's counting unit).

    On whole GPUs and MIG instances ("hw") neither tenant nor isolation matters, so every class of one
    size shares a unit; on MPS ("mps") and time-slicing ("ts") the tenant matters and only isolation levels
    that allow the mode join. A multi-GPU class is its own unit ("any", whatever the family): its pods' GPUs are
    all of one pod group (`packing.modes.combine`; on each node the model offers it one allowed group,
    `model.one_group`). Which pod class fills a unit is decided by flow variables (exact: a transportation problem).
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
        for rules in SHARED_FAMILIES:
            by_tenant: dict[str | None, list[PodClass]] = defaultdict(list)
            for c in members:
                if rules.admits(c.rep.isolation):
                    by_tenant[None if relax_tenancy else c.rep.tenant].append(c)
            for group in by_tenant.values():
                rep = replace(group[0].rep, isolation=rules.isolation)
                units.append(Unit(len(units), rules.family, rep, group))
    return units



@dataclass
class MigChoice:
    """Repartition: a MIG GPU whose layout the model chooses (built by packing.solvers.repartition)."""

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
