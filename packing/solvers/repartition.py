"""MIG re-partition plans: new layouts (valid per the catalog) so pending pods fit, weighing drains.

Changing a MIG layout means draining the GPU, so a plan is judged, in order, by (default):
1. pending pods placed (the reason to re-partition at all);
2. running pods that must be drained - a pod keeps running only if every MIG instance it holds keeps its
   profile and start; a drained pod must be placed again by the plan (on the new layouts or elsewhere),
   so a plan never loses running work;
3. GPUs reconfigured;
then, among equals, fewest GPUs opened. `order` may put drains or reconfigurations first. The criteria
before the last are one weighted (exactly lexicographic) objective, solved from the best placement that
changes nothing; a plan that cannot beat "change nothing" in the time given is not proposed.

Only GPUs in MIG mode whose model the catalog knows are re-partitioned; every other GPU keeps its layout
and its holders. Holders that also use a GPU that cannot change are pinned (their instances stay).

Each GPU's layout is one of `catalog.all_layouts(model)` (a table constraint), so every plan passes
`catalog.validate_layout` by construction; it is checked again, and the placements after the plan are
replayed through `ClusterState.allocate` on the re-partitioned cluster.

Output: the plan (only GPUs whose layout changes), the placements after the plan, and one mig-parted
config per changed node (gpu-facts.md §4). mig-parted takes profile counts, not start positions; the plan's
starts are what the model assumed, and vramfit re-reads the real layout from the node afterwards.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import yaml
from ortools.sat.python import cp_model

from packing.catalog import (
    Catalog,
    GpuModel,
    Placement,
    load_catalog,
    profile_key,
    validate_layout,
)
from packing.model import Assignment, Holder, MigInstance, Node, PodDemand
from packing.modes import rules_for
from packing.solvers.extract import extract, hint_from
from packing.solvers.mig_space import (
    choice_space,
    current_vector,
    gpu_catalog_model,
    instance_for,
    layout_space,
)
from packing.solvers.model import Objective, PackingModel, StageResult, Terms, solve_stages
from packing.solvers.optimal import solve_optimal
from packing.solvers.slots import GpuSlot, MigChoice, NodeInfo, PodClass, group_pods, node_infos
from packing.state import ClusterState


@dataclass
class PlanEntry:
    node: str
    gpu: int
    layout: list[Placement]
    drain: list[str]

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "gpu": self.gpu,
                "layout": [{"profile": p.profile, "start": p.start} for p in self.layout], "drain": self.drain}


@dataclass
class RepartitionResult:
    plan: list[PlanEntry]
    placements: dict[str, Assignment | None]  # pending pods and re-placed drained pods
    drained: list[str]
    placed: int  # pending pods placed
    unplaced: int
    reconfigured: int
    mig_parted: dict[str, str]
    optimal: bool
    stages: list[StageResult] = field(default_factory=list)
    wall_s: float = 0.0
    state: ClusterState | None = None  # cluster after the plan and the placements

    def summary(self) -> dict[str, object]:
        return {"placed": self.placed, "unplaced": self.unplaced, "drained": len(self.drained),
                "gpus_reconfigured": self.reconfigured, "optimal": self.optimal, "wall_s": round(self.wall_s, 3),
                "solver": [{"objective": s.name, "status": s.status} for s in self.stages]}


# ------------------------------------------------------------------------------------------- the model
STAGE_FNS: dict[str, Objective] = {
    "placed": ("placed", PackingModel.placed_terms, True),
    "drained": ("drained", PackingModel.drained_terms, False),
    "reconfigured": ("reconfigured", PackingModel.reconf_terms, False),
    "gpus_opened": ("gpus_opened", PackingModel.opened_terms, False),
}


def plan_repartition(state: ClusterState, pending: Sequence[PodDemand], catalog: Catalog | None = None,
                     time_limit: float = 10.0, workers: int = 2,
                     order: Sequence[str] = ("placed", "drained", "reconfigured", "gpus_opened"),
                     config_prefix: str = "vramfit") -> RepartitionResult:
    """Choose MIG layouts (and drains) so `pending` fits best. `state` is not modified."""
    unknown = [o for o in order if o not in STAGE_FNS]
    if unknown:
        raise ValueError(f"unknown repartition objective(s) {unknown}; known: {sorted(STAGE_FNS)}")
    t0 = time.monotonic()
    catalog = catalog or load_catalog()
    relax = bool(getattr(state, "relax_tenancy", False))
    nodes = node_infos(state)
    choices, models = _mig_choices(catalog, nodes)
    positions, pinned = _holder_positions(state, nodes, choices)
    holders = {key: state.holder(key) for key in positions}
    drainable = [h for key, h in holders.items() if h is not None and key not in pinned]
    classes = _classes(pending, drainable)
    # The best placement without re-partitioning seeds the search: a plan never starts below it.
    baseline = solve_optimal(state, pending, time_limit=0.25 * time_limit, workers=workers)
    pm = PackingModel(nodes, classes, relax, mig_choices=choices, holder_positions=dict(positions),
                      pinned=frozenset(pinned))
    stages = _weighted_stages(pm, list(order))
    hint = _hint(pm, choices, baseline.placements, list(pending))
    values, results = solve_stages(pm, stages, max(0.5, time_limit - (time.monotonic() - t0)), workers, hint)
    if values is None:
        raise RuntimeError("repartition model found no solution (not even the current layout)")
    res = _result(state, catalog, pm, choices, models, values, results, list(pending), holders,
                  config_prefix, time.monotonic() - t0)
    if res.placed < baseline.placed or (res.placed == baseline.placed and res.plan):
        # Out of time before the plan beat "change nothing": say so rather than drain for nothing.
        return RepartitionResult(plan=[], placements=dict(baseline.placements), drained=[], placed=baseline.placed,
                                 unplaced=baseline.unplaced, reconfigured=0, mig_parted={},
                                 optimal=res.optimal and baseline.optimal, stages=results,
                                 wall_s=time.monotonic() - t0, state=baseline.state)
    return res


def _mig_choices(catalog: Catalog, nodes: list[NodeInfo]) -> tuple[dict[int, MigChoice], dict[int, GpuModel]]:
    """The layouts each re-partitionable GPU may take (gid -> choice), and its catalog model."""
    choices: dict[int, MigChoice] = {}
    models: dict[int, GpuModel] = {}
    for n in nodes:
        for s in n.slots:
            got = _mig_choice(catalog, s)
            if got is not None:
                choices[s.gid], models[s.gid] = got
    return choices, models


def _mig_choice(catalog: Catalog, s: GpuSlot) -> tuple[MigChoice, GpuModel] | None:
    """A MIG GPU held by no whole-GPU pod, of a model and layout the catalog knows: its placements, the layouts
    allowed, the current one and where its holders sit. None for any other GPU (it keeps its layout)."""
    gu = s.usage
    if not gu.rules.instanced or gu.whole_holder is not None:
        return None
    model = gpu_catalog_model(catalog, gu.gpu)
    if model is None or model.mig is None:
        return None
    cur = current_vector(model, gu.gpu)
    if cur is None:
        return None  # a layout the catalog does not know: leave it alone
    placements, vectors = layout_space(model)
    insts = [instance_for(catalog, model, gu.gpu, p) for p in placements]
    pos = {(profile_key(p.profile), p.start): i for i, p in enumerate(placements)}
    holder_at = {}
    for ref, key in gu.mig_holder.items():
        inst = gu.gpu.instance(ref)
        assert inst is not None
        holder_at[pos[profile_key(inst.profile), inst.start]] = key
    allowed = choice_space(model, frozenset(i for i, on in enumerate(cur) if on))
    return MigChoice(insts, list(allowed), cur, holder_at, model.mig.max_instances), model


def _holder_positions(state: ClusterState, nodes: list[NodeInfo], choices: dict[int, MigChoice]
                      ) -> tuple[dict[str, list[tuple[int, int]]], set[str]]:
    """Holders on re-partitionable GPUs: where they sit (key -> (gid, position)), and those pinned because
    they also hold a grant that cannot move (a GPU that cannot change, or no MIG instance)."""
    slot_of = {(s.node, s.index): s for n in nodes for s in n.slots}
    positions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    pinned: set[str] = set()
    for gid, ch in choices.items():
        for q, key in ch.holder_at.items():
            positions[key].append((gid, q))
    for key in list(positions):
        h = state.holder(key)
        assert h is not None
        for g in h.assignment.gpus:
            s = slot_of[h.assignment.node, g.index]
            if s.gid not in choices or g.mig is None:
                pinned.add(key)
    return positions, pinned


def _classes(pending: Sequence[PodDemand], drainable: list[Holder]) -> list[PodClass]:
    """Pod classes: pending pods plus the holders that could be drained (they may need a new place)."""
    classes = group_pods(pending)
    by_shape = {c.rep.shape: c for c in classes}
    for h in drainable:
        c = by_shape.get(h.pod.shape)
        if c is None:
            c = PodClass(cid=len(classes), pods=[], drainable=[])
            classes.append(c)
            by_shape[h.pod.shape] = c
        c.drainable.append(h.pod)
    return classes


def _weighted_stages(pm: PackingModel, order: list[str]) -> list[Objective]:
    """All plan criteria but a trailing gpus_opened in one weighted objective (exactly lexicographic).

    One solve instead of one per criterion: among plans that place equally many pods the solver then
    keeps the "change nothing" start (no drains, no reconfiguration) instead of wandering off in stage 1
    and running out of time in stage 2.
    """
    tail = [STAGE_FNS["gpus_opened"]] if order and order[-1] == "gpus_opened" else []
    names = order[:-1] if tail else order
    ranges = {"placed": sum(len(c.pods) for c in pm.classes), "drained": len(pm.kept), "reconfigured": len(pm.reconf),
              "gpus_opened": len(pm.opened)}
    weights: dict[str, int] = {}
    w = 1
    for name in reversed(names):
        weights[name] = w
        w *= ranges[name] + 1

    def combined(model: PackingModel) -> Terms:
        pairs: list[tuple[cp_model.IntVar, int]] = []
        offset = 0
        for name in names:
            _, fn, maximise = STAGE_FNS[name]
            sign = weights[name] if maximise else -weights[name]
            terms, off = fn(model)
            pairs += [(v, c * sign) for v, c in terms]
            offset += off * sign
        return pairs, offset

    return [("+".join(names), combined, True), *tail]


def _hint(pm: PackingModel, choices: dict[int, MigChoice], placements: dict[str, Assignment | None],
          pending: list[PodDemand]) -> dict[cp_model.IntVar, int]:
    """Start from 'change nothing': current layouts, everybody kept, pending pods where `placements` says."""
    hint: dict[cp_model.IntVar, int] = {}
    for d in (pm.x, pm.z, pm.a, pm.mult, pm.uplaced, pm.flow, pm.placed):
        for v in d.values():
            hint[v] = 0
    for ov in pm.opened.values():
        hint[ov] = 0
    pods = {p.key: p for p in pending}
    class_of = {p.key: c.cid for c in pm.classes for p in c.pods}
    hint.update(hint_from(pm, placements, pods, class_of))
    unit_of = {(u.family, c.cid): u.cid for u in pm.units for c in u.members}
    gid_of = {(s.node, s.index): s.gid for n in pm.nodes for s in n.slots}
    for key, asg in placements.items():
        if asg is None or key not in class_of:
            continue
        family = "any" if pods[key].gpu_count > 1 else "hw"
        for gr in asg.gpus:
            gid = gid_of.get((asg.node, gr.index))
            if gid is None or gid not in choices or gr.mig is None:
                continue
            uid = unit_of.get((family, class_of[key]))
            q = next((i for i, inst in enumerate(choices[gid].placements) if inst.ref == gr.mig), None)
            if uid is not None and q is not None and (uid, gid, q) in pm.a:
                hint[pm.a[uid, gid, q]] = 1
    for (gid, q), bv in pm.b.items():
        hint[bv] = choices[gid].current[q]
    for kv in pm.kept.values():
        hint[kv] = 1
    for rv in pm.reconf.values():
        hint[rv] = 0
    return hint


def _result(state: ClusterState, catalog: Catalog, pm: PackingModel, choices: dict[int, MigChoice],
            models: dict[int, GpuModel], values: dict[cp_model.IntVar, int], results: list[StageResult],
            pending: list[PodDemand], holders: dict[str, Holder | None], prefix: str, wall: float
            ) -> RepartitionResult:
    """The plan the solution makes, replayed on the cluster: drains, new layouts, then the placements."""
    drained = sorted(k for k, kv in pm.kept.items() if values.get(kv, 1) == 0)
    plan, new_layout = _plan_entries(pm, choices, models, values, drained)
    # The cluster after the plan: drained pods released, GPUs re-partitioned, then the placements.
    after = state.copy()
    for key in drained:
        after.release(key)
    changed_nodes = sorted({e.node for e in plan})
    infos: dict[str, NodeInfo] = {n.name: n for n in pm.nodes}
    for name in changed_nodes:
        displaced = after.upsert_node(_repartitioned(after.node(name), infos[name], choices, plan, new_layout))
        if displaced:
            raise RuntimeError(f"plan displaces holders it did not drain: {[h.pod.key for h in displaced]}")
    placements = _placements_after(after, pm, choices, values, pending, holders, drained)
    placed = sum(1 for p in pending if placements[p.key] is not None)
    mig_parted = {name: mig_parted_config(after.node(name), f"{prefix}-{name}") for name in changed_nodes}
    return RepartitionResult(
        plan=plan, placements=placements, drained=drained, placed=placed, unplaced=len(pending) - placed,
        reconfigured=len(plan), mig_parted=mig_parted, optimal=all(r.proven for r in results), stages=results,
        wall_s=wall, state=after)


def _plan_entries(pm: PackingModel, choices: dict[int, MigChoice], models: dict[int, GpuModel],
                  values: dict[cp_model.IntVar, int], drained: list[str]
                  ) -> tuple[list[PlanEntry], dict[int, list[int]]]:
    """Each GPU's chosen layout (gid -> positions) and a plan entry for every GPU whose layout changes."""
    new_layout: dict[int, list[int]] = {}
    plan: list[PlanEntry] = []
    for gid, ch in choices.items():
        vec = [values.get(pm.b[gid, q], ch.current[q]) for q in range(len(ch.placements))]
        new_layout[gid] = [q for q, on in enumerate(vec) if on]
        if tuple(vec) != tuple(ch.current):
            s = pm.slot_by_gid[gid]
            layout = [Placement(ch.placements[q].profile, ch.placements[q].start) for q in new_layout[gid]]
            problems = validate_layout(models[gid], layout)
            if problems:
                raise RuntimeError(f"plan layout for {s.node} GPU {s.index} is invalid: {problems}")
            drain = sorted({ch.holder_at[q] for q in ch.holder_at if ch.holder_at[q] in drained})
            plan.append(PlanEntry(s.node, s.index, layout, drain))
    return plan, new_layout


def _repartitioned(node: Node, info: NodeInfo, choices: dict[int, MigChoice], plan: list[PlanEntry],
                   new_layout: dict[int, list[int]]) -> Node:
    """The node with the plan's new MIG layouts on the GPUs the plan changes."""
    gpus = []
    for g in node.gpus:
        s = next(sl for sl in info.slots if sl.index == g.index)
        if s.gid in choices and any(e.node == node.name and e.gpu == g.index for e in plan):
            ch = choices[s.gid]
            gpus.append(replace(g, mig=tuple(ch.placements[q] for q in new_layout[s.gid])))
        else:
            gpus.append(g)
    return replace(node, gpus=tuple(gpus))


def _placements_after(after: ClusterState, pm: PackingModel, choices: dict[int, MigChoice],
                      values: dict[cp_model.IntVar, int], pending: list[PodDemand],
                      holders: dict[str, Holder | None], drained: list[str]) -> dict[str, Assignment | None]:
    """Pending and drained pods placed on the re-partitioned cluster (every rule re-checked); every drained pod
    must get a new place."""

    def instances(slot: GpuSlot) -> dict[int, MigInstance]:
        return dict(enumerate(choices[slot.gid].placements))

    pods = {p.key: p for p in pending}
    for key in drained:
        h = holders[key]
        assert h is not None
        pods[key] = h.pod
    placements: dict[str, Assignment | None] = {p.key: None for p in pending}
    for key in drained:
        placements[key] = None
    for key, (node_name, grants) in extract(pm, values, instances).items():
        asg = Assignment(node_name, tuple(grants))
        after.allocate(pods[key], asg)  # re-checks every rule on the re-partitioned cluster
        placements[key] = asg
    lost = [k for k in drained if placements[k] is None]
    if lost:
        raise RuntimeError(f"drained pods without a new place: {lost}")
    return placements


def mig_parted_config(node: Node, config_name: str) -> str:
    """A mig-parted v1 config for every MIG GPU of the node (gpu-facts.md §4), GPUs with equal counts grouped."""
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for g in node.gpus:
        if not rules_for(g).instanced:
            continue
        counts: dict[str, int] = defaultdict(int)
        for inst in g.mig:
            counts[inst.profile] += 1
        groups.setdefault(tuple(sorted(counts.items())), []).append(g.index)
    entries = []
    for counts_t, devices in groups.items():
        entries.append({"devices": devices, "mig-enabled": True, "mig-devices": dict(counts_t)})
    doc = {"version": "v1", "mig-configs": {config_name: entries}}
    header = (f"# vramfit re-partition plan for node {node.name}: apply with\n"
              f"#   kubectl label node {node.name} nvidia.com/mig.config={config_name} --overwrite\n"
              "# after draining the pods the plan lists. mig-parted creates instances by count; the plan's\n"
              "# start positions are what vramfit assumed and are re-read from the node afterwards.\n")
    return header + yaml.safe_dump(doc, sort_keys=False)
