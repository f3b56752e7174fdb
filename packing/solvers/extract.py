"""Between concrete placements and model values: `hint_from` turns assignments into a CP-SAT hint (sorted
to respect the model's symmetry breaking); `extract` turns a solution back into per-pod grants.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ortools.sat.python import cp_model

from packing.model import (
    Assignment,
    GpuGrant,
    MigInstance,
    PodDemand,
)
from packing.solvers.model import PackingModel
from packing.solvers.slots import GpuSlot


# ------------------------------------------------------------------------------------------- hints
def hint_from(pm: PackingModel, assignments: dict[str, Assignment | None], pods: dict[str, PodDemand],
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
        family = "any" if pod.gpu_count > 1 else pm.slot_by_gid[first].family
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
                elif s.rules.instanced:
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
