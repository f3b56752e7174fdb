"""The CP-SAT packing model (`PackingModel`) and its lexicographic stages (`STAGES`, `solve_stages`).

The formulation is described in `packing.solvers.optimal`, which builds and solves it; `packing.solvers.bound` and
`packing.solvers.repartition` build it too. This module knows nothing of those callers.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from packing.modes import group_allows
from packing.solvers.slots import GpuSlot, MigChoice, NodeInfo, PodClass, Unit, build_units, grant_ok
from packing.usage import gpu_model_allowed

LinExpr = cp_model.LinearExprT
Terms = tuple[list[tuple[cp_model.IntVar, int]], int]  # sum(coef * var) + offset


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



# ------------------------------------------------------------------------------------------- the model
def one_group(slots: list[GpuSlot], k: int, per_process: bool) -> list[GpuSlot]:
    """The eligible GPUs of one node a k-GPU class may use: one pod group's (`packing.modes.combine`: a pod's
    units are all of one kind), the allowed group with the most GPUs (ties: the first in slot order). One group
    per class and node keeps the round-robin extraction inside it; a node offering two allowed groups of k
    GPUs each gives the class only one of them, which can only under-count."""
    groups: dict[str, list[GpuSlot]] = {}
    for s in slots:
        if group_allows(s.rules, k, per_process):
            groups.setdefault(s.rules.pod_group, []).append(s)
    return max(groups.values(), key=len, default=[])


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
        if c.family != "any" and s.family != c.family:
            return False
        if s.gid in self.choices:
            ch = self.choices[s.gid]
            g = s.usage.gpu
            pod = c.rep
            return (gpu_model_allowed(g, pod.models) and s.rules.admits(pod.isolation)
                    and any(inst.memory_mib >= pod.vram_mib for inst in ch.placements))
        return grant_ok(s, c.rep, self.relax)

    def _build(self, symmetry: bool) -> None:
        """Variables and rules in a fixed order: grants per node, node resources, flows, GPU rules, symmetry."""
        pods_on_node: dict[tuple[int, str], list[LinExpr]] = defaultdict(list)
        for node in self.nodes:
            for c in self.units:
                self._unit_on_node(node, c, pods_on_node)
            self._node_resources(node, pods_on_node)
        flows = self._unit_flows(pods_on_node)
        self._class_placed(flows)
        for node in self.nodes:
            for s in node.slots:
                self._gpu_rules(s)
        if symmetry:
            self._symmetry()

    def _unit_on_node(self, node: NodeInfo, c: Unit, pods_on_node: dict[tuple[int, str], list[LinExpr]]) -> None:
        """Grant counts of unit `c` on the node's eligible GPUs; a k-GPU unit's pods on the node (`mult`)."""
        elig = [s for s in node.slots if self._eligible(c, s)]
        if c.k > 1:
            elig = one_group(elig, c.k, c.rep.gpu_per_process)
        if len(elig) < c.k or c.total == 0:
            return
        if c.k > 1:
            mv = self.m.new_int_var(0, min(c.total, self._max_pods_per_gpu(elig)), f"m{c.cid}_{node.name}")
            self.mult[c.cid, node.name] = mv
        self._grant_vars(c, elig)
        xs = [self.x[c.cid, s.gid] for s in elig if (c.cid, s.gid) in self.x]
        if c.k > 1:
            mv = self.mult[c.cid, node.name]
            # sum x = k*m with x <= m always decomposes into pods on k distinct GPUs.
            self.m.add(sum(xs) == c.k * mv)
            for xv in xs:
                self.m.add(xv <= mv)
            pods_on_node[c.cid, node.name].append(mv)
        else:
            pods_on_node[c.cid, node.name].extend(xs)

    def _grant_vars(self, c: Unit, elig: list[GpuSlot]) -> None:
        """One grant count per eligible GPU that could take any grant of `c`."""
        for s in elig:
            ub = min(c.total, self._cap(c, s))
            if ub <= 0:
                continue
            self.x[c.cid, s.gid] = self.m.new_int_var(0, ub, f"x{c.cid}_{s.gid}")

    def _unit_flows(self, pods_on_node: dict[tuple[int, str], list[LinExpr]]) -> dict[int, list[cp_model.IntVar]]:
        """Pods placed per unit, handed to its member classes by flow variables; returns class -> its flows."""
        m = self.m
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
        return flows

    def _class_placed(self, flows: dict[int, list[cp_model.IntVar]]) -> None:
        """Pods placed per class (its flows); drained holders must all be placed again."""
        m = self.m
        for pc in self.classes:
            pv = m.new_int_var(0, len(pc.pods) + pc.extra, f"placed{pc.cid}")
            m.add(pv == sum(flows[pc.cid]))
            self.placed[pc.cid] = pv
            if pc.drainable:
                # Every drained holder must be placed again; pending pods fill the rest.
                drained = pc.extra - sum(self.kept[h.key] for h in pc.drainable)
                m.add(pv >= drained)
                m.add(pv - drained <= len(pc.pods))

    def _cap(self, c: Unit, s: GpuSlot) -> int:
        """Most grants of class c the GPU could take on its own."""
        if s.gid in self.choices:
            ch = self.choices[s.gid]
            return min(ch.max_instances, sum(1 for inst in ch.placements if inst.memory_mib >= c.vram))
        if s.rules.instanced:
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
        """One GPU's capacity rules (per its mode), its stranded VRAM terms and whether it is opened."""
        cls = [c for c in self.units if (c.cid, s.gid) in self.x]
        if s.gid in self.choices:
            self._layout_rules(s, cls)  # capacity is per placement there
        if not cls:
            return
        xs = [self.x[c.cid, s.gid] for c in cls]
        if s.gid in self.choices:
            pass
        elif s.rules.instanced:
            self._instance_rules(s, cls)
        else:
            self._slot_rules(s, cls, xs)
        if s.idle:
            self._opened_rule(s, cls, xs)

    def _instance_rules(self, s: GpuSlot, cls: list[Unit]) -> None:
        """MIG as it is: each unit's grants split by the size of the free instance used (`z`), per size at most
        the free instances of that size."""
        m = self.m
        sizes = sorted(s.buckets)
        for c in cls:
            parts = []
            for size in sizes:
                if size >= c.vram:
                    zv = m.new_int_var(0, min(len(s.buckets[size]), c.total), f"z{c.cid}_{s.gid}_{size}")
                    self.z[c.cid, s.gid, size] = zv
                    parts.append(zv)
                    self._stranded_terms.append((zv, size - c.vram))
            m.add(self.x[c.cid, s.gid] == sum(parts))
        for size in sizes:
            zs = [zv for (cid, gid, sz), zv in self.z.items() if gid == s.gid and sz == size]
            if zs:
                m.add(sum(zs) <= len(s.buckets[size]))

    def _slot_rules(self, s: GpuSlot, cls: list[Unit], xs: list[cp_model.IntVar]) -> None:
        """Whole GPUs and shares: at most `slots` grants, within the pool, stranded per unit, one tenant."""
        self.m.add(sum(xs) <= s.slots)
        if s.pool is not None:
            self._pool_rules(s, cls)
        if s.stranded_unit is not None:
            for c in cls:
                self._stranded_terms.append((self.x[c.cid, s.gid], s.stranded_unit - c.vram))
        if s.rules.shared and not self.relax and s.owner is None:
            self._tenancy_rule(s, cls)

    def _pool_rules(self, s: GpuSlot, cls: list[Unit]) -> None:
        """A pooled GPU: the grants' VRAM within the pool, with size-threshold cuts."""
        assert s.pool is not None
        m = self.m
        m.add(sum(c.vram * self.x[c.cid, s.gid] for c in cls) <= s.pool)
        # Size-threshold cuts (valid for integers, strong for the LP): at most pool // v pods of
        # v MiB or more fit. Without them the LP bound counts 1.1 pods of 72 GB on an 80 GB GPU.
        for v in sorted({max(1, c.vram) for c in cls}):
            big = [self.x[c.cid, s.gid] for c in cls if c.vram >= v]
            limit = min(s.slots, s.pool // v)
            if limit < sum(self._cap(c, s) for c in cls if c.vram >= v):
                m.add(sum(big) <= limit)

    def _tenancy_rule(self, s: GpuSlot, cls: list[Unit]) -> None:
        """A shared GPU without an owner yet goes to one tenant of those that could use it."""
        m = self.m
        tenants = sorted({c.rep.tenant for c in cls})
        if len(tenants) <= 1:
            return
        tv = {t: m.new_bool_var(f"t{s.gid}_{t}") for t in tenants}
        m.add_at_most_one(tv.values())
        for t in tenants:
            xt = [self.x[c.cid, s.gid] for c in cls if c.rep.tenant == t]
            m.add(sum(xt) <= min(s.slots, sum(self._cap(c, s) for c in cls)) * tv[t])

    def _opened_rule(self, s: GpuSlot, cls: list[Unit], xs: list[cp_model.IntVar]) -> None:
        """An idle GPU is opened iff it gets a grant."""
        m = self.m
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
        self.load: dict[int, LinExpr] = {}
        for node in self.nodes:
            for s in node.slots:
                terms = [c.vram * self.x[c.cid, s.gid] for c in self.units if (c.cid, s.gid) in self.x]
                self.load[s.gid] = sum(terms) if terms else 0
        self.sym_gpu_groups: list[list[int]] = []
        for node in self.nodes:
            self._order_gpus(node)
        self.sym_node_groups: list[list[str]] = []
        self._order_nodes()

    def _pinned(self, s: GpuSlot) -> bool:
        """Holders on a repartitioned GPU pin its positions: it is not interchangeable."""
        return s.gid in self.choices and bool(self.choices[s.gid].holder_at)

    def _order_gpus(self, node: NodeInfo) -> None:
        """Identical GPUs of the node receive non-increasing VRAM."""
        groups: dict[tuple[object, ...], list[GpuSlot]] = defaultdict(list)
        for s in node.slots:
            if not self._pinned(s):
                groups[s.signature()].append(s)
        for members in groups.values():
            if len(members) < 2:
                continue
            self.sym_gpu_groups.append([s.gid for s in members])
            for a, b in zip(members, members[1:], strict=False):
                _add_ge(self.m, self.load[a.gid], self.load[b.gid])

    def _order_nodes(self) -> None:
        """Identical nodes (none with pinned GPUs) receive non-increasing VRAM."""
        ngroups: dict[tuple[object, ...], list[NodeInfo]] = defaultdict(list)
        for node in self.nodes:
            if not any(self._pinned(s) for s in node.slots):
                ngroups[node.signature()].append(node)
        for nmembers in ngroups.values():
            if len(nmembers) < 2:
                continue
            self.sym_node_groups.append([n.name for n in nmembers])
            loads = [sum(self.load[s.gid] for s in n.slots) for n in nmembers]
            for la, lb in zip(loads, loads[1:], strict=False):
                _add_ge(self.m, la, lb)

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



def _add_ge(m: cp_model.CpModel, a: LinExpr, b: LinExpr) -> None:
    if isinstance(a, int) and isinstance(b, int):
        return
    m.add(a >= b)
