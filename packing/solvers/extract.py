"""Between concrete placements and model values: `hint_from` turns assignments into a CP-SAT hint (sorted
to respect the model's symmetry breaking); `extract` turns a solution back into per-pod grants.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from packing.model import (
    Assignment,
    GpuGrant,
    MigInstance,
    PodDemand,
)
from packing.solvers.model import PackingModel
from packing.solvers.slots import GpuSlot, NodeInfo, Unit

# ------------------------------------------------------------------------------------------- hints
GpuCounts = dict[int, dict[tuple[str, int, int], int]]  # gid -> ("x", unit, 0) | ("z", unit, MIG size) -> grants
NodeCounts = dict[str, dict[int, int]]  # node -> unit -> k-GPU pods there


@dataclass
class _Counts:
    """Concrete assignments counted the model's way: grants per GPU, k-GPU pods per node, pods per flow."""

    per_gpu: GpuCounts = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    per_node_mult: NodeCounts = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    flow: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))  # (unit, class) -> pods


def hint_from(pm: PackingModel, assignments: dict[str, Assignment | None], pods: dict[str, PodDemand],
              class_of: dict[str, int]) -> dict[cp_model.IntVar, int]:
    """Translate concrete assignments into model values, then sort them to respect symmetry breaking."""
    counts = _count_assignments(pm, assignments, pods, class_of)
    _respect_symmetry(pm, counts)
    hint = _grant_hints(pm, counts)
    hint.update(_flow_hints(pm, counts.flow))
    return hint


def _count_assignments(pm: PackingModel, assignments: dict[str, Assignment | None], pods: dict[str, PodDemand],
                       class_of: dict[str, int]) -> _Counts:
    """Count the assignments the model can express (on its nodes, on GPUs with a variable for the pod's unit)."""
    gid_of = {(s.node, s.index): s.gid for n in pm.nodes for s in n.slots}
    node_names = {n.name for n in pm.nodes}
    unit_of: dict[tuple[str, int], int] = {}
    for u in pm.units:
        for c in u.members:
            unit_of[u.family, c.cid] = u.cid
    counts = _Counts()
    for key, asg in assignments.items():
        if asg is None or key not in class_of or asg.node not in node_names or not asg.gpus:
            continue
        pod = pods[key]
        cid = _unit_of(pm, asg, pod, class_of[key], gid_of, unit_of)
        if cid is not None:
            _count_one(pm, counts, asg, pod, cid, class_of[key], gid_of)
    return counts


def _unit_of(pm: PackingModel, asg: Assignment, pod: PodDemand, class_id: int,
             gid_of: dict[tuple[str, int], int], unit_of: dict[tuple[str, int], int]) -> int | None:
    """The model unit that carries this assignment, or None when the model has no variable for one of its grants."""
    first = gid_of.get((asg.node, asg.gpus[0].index))
    if first is None:
        return None
    family = "any" if pod.gpu_count > 1 else pm.slot_by_gid[first].family
    cid = unit_of.get((family, class_id))
    if cid is None:
        return None
    for gr in asg.gpus:
        gid = gid_of.get((asg.node, gr.index))
        if gid is None or (cid, gid) not in pm.x or gr.whole != pm.slot_by_gid[gid].whole:
            return None
    return cid


def _count_one(pm: PackingModel, counts: _Counts, asg: Assignment, pod: PodDemand, cid: int, class_id: int,
               gid_of: dict[tuple[str, int], int]) -> None:
    """Add one assignment: a grant per GPU (and its MIG instance size), the node's k-GPU pods, the flow."""
    for gr in asg.gpus:
        gid = gid_of[(asg.node, gr.index)]
        counts.per_gpu[gid]["x", cid, 0] += 1
        if gr.mig is not None:
            inst = pm.slot_by_gid[gid].usage.gpu.instance(gr.mig)
            if inst is not None:
                counts.per_gpu[gid]["z", cid, inst.memory_mib] += 1
    if pod.gpu_count > 1:
        counts.per_node_mult[asg.node][cid] += 1
    counts.flow[cid, class_id] += 1


def _gpu_load(d: dict[tuple[str, int, int], int], vram: dict[int, int]) -> int:
    """VRAM granted on one GPU (the quantity symmetry breaking orders by)."""
    return sum(n * vram[cid] for (kind, cid, _), n in d.items() if kind == "x")


def _respect_symmetry(pm: PackingModel, counts: _Counts) -> None:
    """Within a group of interchangeable GPUs the loads must be non-increasing; nodes likewise."""
    vram = {c.cid: c.vram for c in pm.units}
    _sort_gpu_groups(pm, counts.per_gpu, vram)
    for ngroup in getattr(pm, "sym_node_groups", []):
        _sort_node_group(pm, ngroup, counts, vram)
        # Re-sort inside each node after the node permutation.
        _sort_gpu_groups(pm, counts.per_gpu, vram)


def _sort_gpu_groups(pm: PackingModel, per_gpu: GpuCounts, vram: dict[int, int]) -> None:
    """Permute the counts of each group of interchangeable GPUs into non-increasing load."""
    for group in getattr(pm, "sym_gpu_groups", []):
        vals = sorted((per_gpu.get(g, {}) for g in group), key=lambda d: _gpu_load(d, vram), reverse=True)
        for g, v in zip(group, vals, strict=True):
            per_gpu[g] = v


def _sort_node_group(pm: PackingModel, ngroup: list[str], counts: _Counts, vram: dict[int, int]) -> None:
    """Interchangeable nodes: permute whole nodes into non-increasing load, GPU by GPU in signature order."""
    orders = {name: _gids_in_signature_order(pm, name) for name in ngroup}
    bundles = [([dict(counts.per_gpu.get(g, {})) for g in orders[name]], dict(counts.per_node_mult.get(name, {})))
               for name in ngroup]
    bundles.sort(key=lambda b: sum(_gpu_load(d, vram) for d in b[0]), reverse=True)
    for name, (gpus, mult) in zip(ngroup, bundles, strict=True):
        for g, d in zip(orders[name], gpus, strict=True):
            counts.per_gpu[g] = d
        counts.per_node_mult[name] = mult


def _gids_in_signature_order(pm: PackingModel, name: str) -> list[int]:
    n = next(n for n in pm.nodes if n.name == name)
    return [s.gid for s in sorted(n.slots, key=lambda s: (repr(s.signature()), s.index))]


def _grant_hints(pm: PackingModel, counts: _Counts) -> dict[cp_model.IntVar, int]:
    """Values of the per-GPU grant variables (x, z), the k-GPU pods per node and the GPUs opened."""
    hint: dict[cp_model.IntVar, int] = {}
    per_gpu = counts.per_gpu
    for (cid, gid), xv in pm.x.items():
        hint[xv] = per_gpu.get(gid, {}).get(("x", cid, 0), 0)
    for (cid, gid, size), zv in pm.z.items():
        hint[zv] = per_gpu.get(gid, {}).get(("z", cid, size), 0)
    for (cid, name), mv in pm.mult.items():
        hint[mv] = counts.per_node_mult.get(name, {}).get(cid, 0)
    for gid, ov in pm.opened.items():
        hint[ov] = 1 if any(k[0] == "x" and n > 0 for k, n in per_gpu.get(gid, {}).items()) else 0
    return hint


def _flow_hints(pm: PackingModel, flow: dict[tuple[int, int], int]) -> dict[cp_model.IntVar, int]:
    """Values of the flow variables and the pods placed per unit and per class that follow from them."""
    hint: dict[cp_model.IntVar, int] = {}
    per_class: dict[int, int] = defaultdict(int)
    for (uid, cid), fv in pm.flow.items():
        hint[fv] = flow.get((uid, cid), 0)
        per_class[cid] += hint[fv]
    for uid, uv in pm.uplaced.items():
        hint[uv] = sum(n for (u, _c), n in flow.items() if u == uid)
    for c in pm.classes:
        hint[pm.placed[c.cid]] = per_class[c.cid]
    return hint


# ------------------------------------------------------------------------------------------- extraction
UnitRefs = dict[int, list[str | None]]  # gid -> the units (MIG refs or None) one class gets on that GPU
Placed = tuple[str, list[GpuGrant]]  # (node, grants) of one pod


def extract(pm: PackingModel, values: dict[cp_model.IntVar, int],
            instances: Callable[[GpuSlot], dict[int, MigInstance]] | None = None
            ) -> dict[str, tuple[str, list[GpuGrant]]]:
    """Concrete placements from a solution: pod key -> (node, grants).

    `instances(slot)` gives, for repartitioned GPUs, placement position -> the new MIG instance.
    """
    per_unit: dict[int, list[Placed]] = defaultdict(list)
    for node in pm.nodes:
        free_by_size: dict[int, dict[int, list[MigInstance]]] = {
            s.gid: {size: list(v) for size, v in s.buckets.items()} for s in node.slots}
        for c in pm.units:
            units = _unit_refs(pm, values, node, c, free_by_size, instances)
            if units:
                per_unit[c.cid].extend(_node_grants(pm, values, node, c, units))
    return _hand_to_pods(pm, values, per_unit)


def _unit_refs(pm: PackingModel, values: dict[cp_model.IntVar, int], node: NodeInfo, c: Unit,
               free_by_size: dict[int, dict[int, list[MigInstance]]],
               instances: Callable[[GpuSlot], dict[int, MigInstance]] | None) -> UnitRefs:
    """Per GPU of the node, the units (MIG refs or None) unit class `c` gets there."""
    units: UnitRefs = {}
    for s in node.slots:
        xv = pm.x.get((c.cid, s.gid))
        if xv is None or values.get(xv, 0) == 0:
            continue
        n = values[xv]
        if s.gid in pm.choices:
            assert instances is not None
            refs = _placement_refs(pm, values, c, s, instances(s))
        elif s.rules.instanced:
            refs = _instance_refs(pm, values, c, s, free_by_size[s.gid])
        else:
            refs = [None] * n
        assert len(refs) == n, (c.cid, s.gid, refs, n)
        units[s.gid] = refs
    return units


def _placement_refs(pm: PackingModel, values: dict[cp_model.IntVar, int], c: Unit, s: GpuSlot,
                    placed_inst: dict[int, MigInstance]) -> list[str | None]:
    """A repartitioned GPU: the new instances at the positions the solution grants to `c`."""
    refs: list[str | None] = []
    for q in range(len(pm.choices[s.gid].placements)):
        av = pm.a.get((c.cid, s.gid, q))
        if av is not None and values.get(av, 0):
            refs.append(placed_inst[q].ref)
    return refs


def _instance_refs(pm: PackingModel, values: dict[cp_model.IntVar, int], c: Unit, s: GpuSlot,
                   free: dict[int, list[MigInstance]]) -> list[str | None]:
    """A MIG GPU as it is: free instances of each size the solution uses, taken from `free`."""
    refs: list[str | None] = []
    for size in sorted(s.buckets):
        zv = pm.z.get((c.cid, s.gid, size))
        cnt = values.get(zv, 0) if zv is not None else 0
        for _ in range(cnt):
            refs.append(free[size].pop().ref)
    return refs


def _node_grants(pm: PackingModel, values: dict[cp_model.IntVar, int], node: NodeInfo, c: Unit,
                 units: UnitRefs) -> list[Placed]:
    """The unit's pods on this node: one grant each, or k grants on distinct GPUs for a k-GPU class."""
    gids = sorted(units, key=lambda g: -len(units[g]))
    index_of = {s.gid: s.index for s in node.slots}
    whole = {s.gid: s.whole for s in node.slots}
    if c.k == 1:
        return [(node.name, [GpuGrant(index=index_of[g], vram_mib=c.vram, mig=ref, whole=whole[g])])
                for g in gids for ref in units[g]]
    npods = values.get(pm.mult[c.cid, node.name], 0)
    seq = [(g, ref) for g in gids for ref in units[g]]
    # Round-robin over GPUs sorted by use: every GPU appears at most npods times, so pod j's
    # k units (j, j+npods, ...) land on distinct GPUs.
    out: list[Placed] = []
    for j in range(npods):
        pick = [seq[j + t * npods] for t in range(c.k)]
        grants = [GpuGrant(index=index_of[g], vram_mib=c.vram, mig=ref, whole=whole[g]) for g, ref in pick]
        out.append((node.name, sorted(grants, key=lambda gr: gr.index)))
    return out


def _hand_to_pods(pm: PackingModel, values: dict[cp_model.IntVar, int], per_unit: dict[int, list[Placed]]
                  ) -> dict[str, Placed]:
    """Hand each unit's places to pods of its member classes as the flow says, in each class's pod order."""
    out: dict[str, Placed] = {}
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
