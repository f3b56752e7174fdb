"""A node group too big for one CP-SAT model: the portfolio `packing.solvers.optimal` runs on it.

Insertion where capacity says there is room, large-neighbourhood search that re-solves random groups of nodes
exactly (`NodeGroupSearch`), the unit-counting bound of `packing.solvers.bound` as the proof, and the whole
model when it is small enough (`solve_large` runs them in that order).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from packing.model import Assignment, PodDemand
from packing.solvers.bound import threshold_bound
from packing.solvers.capacity import capacity, choose_on_node
from packing.solvers.extract import extract, hint_from
from packing.solvers.model import STAGES, PackingModel, StageResult, solve_stages
from packing.solvers.slots import GpuSlot, NodeInfo, PodClass
from packing.state import ClusterState
from packing.usage import gpu_model_allowed

MODEL_VARS_LIMIT = 30_000  # a large group's whole model is solved only below this many count variables

Placements = dict[str, Assignment | None]  # pod key -> assignment, None = unplaced
# Re-solve one node group exactly: (sub-state, pods, time limit, hint) -> (placements, pods placed, state after).
StepSolve = Callable[[ClusterState, list[PodDemand], float, Placements], tuple[Placements, int, ClusterState]]


def opened_gpus(before: ClusterState, after: ClusterState) -> int:
    """GPUs idle before and in use after."""
    n = 0
    for name in before.node_names:
        for gu_before, gu_after in zip(before.usage(name).gpus, after.usage(name).gpus, strict=True):
            n += int(not gu_before.grants and bool(gu_after.grants))
    return n


def sub_state(state: ClusterState, names: Sequence[str]) -> ClusterState:
    """The named nodes alone, with the holders they carry."""
    sub = ClusterState([state.node(n) for n in names], relax_tenancy=bool(getattr(state, "relax_tenancy", False)))
    for n in names:
        for h in state.holders_on(n):
            sub.allocate(h.pod, h.assignment, reserved=h.reserved)
    return sub


def with_placements(base: ClusterState, by_key: Mapping[str, PodDemand], placements: Placements) -> ClusterState:
    """A copy of `base` with the placed pods of `placements` allocated."""
    out = base.copy()
    for key, asg in placements.items():
        if asg is not None:
            out.allocate(by_key[key], asg)
    return out


def _could_ever(slot: GpuSlot, pod: PodDemand) -> bool:
    """Could the GPU hold one grant of `pod` if everything placed by this batch left it (holders stay)?"""
    gu = slot.usage
    g = gu.gpu
    if gu.whole_holder is not None or not gpu_model_allowed(g, pod.models):
        return False
    if slot.whole:
        return pod.vram_mib <= g.memory_mib
    return gu.rules.admits(pod.isolation) and gu.unit_cap() >= pod.vram_mib


def _quality(before: ClusterState, after: ClusterState, placed: int) -> tuple[int, int, int]:
    """Lexicographic: pods placed, then fewest GPUs opened, then least stranded VRAM."""
    return placed, -opened_gpus(before, after), -after.stranded_mib()


def _placed_count(placements: Placements) -> int:
    return sum(1 for a in placements.values() if a is not None)


class NodeGroupSearch:
    """Large-neighbourhood search by node group over one batch: the current placement and the state it makes.

    Each step frees a group of nodes - half of them nodes where some unplaced pod could ever fit, half at
    random: the pods placed there and a few unplaced pods are placed again by the exact model restricted to
    those nodes, seeded with the current placement (so a step never makes things worse).
    """

    def __init__(self, state: ClusterState, nodes: list[NodeInfo], pods: list[PodDemand], start: Placements,
                 seed: int, group_size: int, step: StepSolve) -> None:
        self.state = state
        self.nodes = nodes
        self.pods = pods
        self.by_key = {p.key: p for p in pods}
        self.current: Placements = dict(start)
        self.names = [n.name for n in nodes]
        self.name_set = set(self.names)
        self.rng = random.Random(seed)
        self.group_size = group_size
        self.step = step
        self.now = with_placements(state, self.by_key, self.current)
        self.steps = 0
        self.improved = 0

    def placed(self) -> int:
        return _placed_count(self.current)

    def unplaced(self) -> list[PodDemand]:
        return [p for p in self.pods if self.current.get(p.key) is None]

    def run(self, end: float) -> None:
        """Step until `end` (less a margin for the last step); every fourth step first inserts where there is room."""
        room: list[str] = []
        steps = 0
        while time.monotonic() < end - 0.3:
            if steps % 4 == 0:
                self._insert_where_room(end)
                room = self._nodes_with_room()
            group = self._pick_group(room)
            sub_pods = self._step_pods(group)
            if not sub_pods:
                continue
            self._improve(group, sub_pods, end)
            steps += 1

    # ---------------------------------------------------------------- insertion
    def _insert_where_room(self, end: float) -> None:
        """Insert unplaced pods where capacity says there is room now, largest shapes first."""
        by_shape: dict[tuple[object, ...], list[PodDemand]] = defaultdict(list)
        for p in self.unplaced():
            by_shape[p.shape].append(p)
        for same_shape in sorted(by_shape.values(), key=lambda g: -g[0].vram_mib * g[0].gpu_count):
            if time.monotonic() > end:
                break
            self._insert_shape(same_shape)

    def _insert_shape(self, same_shape: list[PodDemand]) -> None:
        """Insert pods of one shape on the group's nodes with room, in capacity's order, until room runs out."""
        room_left = {n: c for n, c in capacity(self.now, same_shape[0]).nodes.items() if c > 0 and n in self.name_set}
        for p in same_shape:
            self._insert_one(p, room_left)
            if not room_left:
                break

    def _insert_one(self, p: PodDemand, room_left: dict[str, int]) -> None:
        """Place `p` on the first node of `room_left` that takes it; nodes found full leave `room_left`."""
        while room_left:
            n = next(iter(room_left))
            asg = choose_on_node(self.now, n, p)
            if asg is None:
                del room_left[n]
                continue
            self.now.allocate(p, asg)
            self.current[p.key] = asg
            room_left[n] -= 1
            if room_left[n] <= 0:
                del room_left[n]
            return

    def _nodes_with_room(self) -> list[str]:
        """Nodes that could ever hold an unplaced shape: where moving pods away may make room."""
        room_set: set[str] = set()
        for p in {q.shape: q for q in self.unplaced()}.values():
            for info in self.nodes:
                ok = sum(1 for sl in info.slots if _could_ever(sl, p))
                if ok >= p.gpu_count:
                    room_set.add(info.name)
        return sorted(room_set)

    # ---------------------------------------------------------------- one step
    def _pick_group(self, room: list[str]) -> list[str]:
        """Up to half the group from the nodes with room, the rest at random."""
        k = min(self.group_size, len(self.names))
        group = self.rng.sample(room, min(len(room), k // 2)) if room else []
        rest = [n for n in self.names if n not in set(group)]
        group += self.rng.sample(rest, min(len(rest), k - len(group)))
        return group

    def _step_pods(self, group: list[str]) -> list[PodDemand]:
        """The pods placed on the group, plus a few unplaced pods per shape (enough to fill any room made)."""
        gset = set(group)
        n_gpus = sum(len(self.state.node(n).gpus) for n in group)
        per_shape: dict[tuple[object, ...], int] = defaultdict(int)
        sub_pods = []
        for p in self.pods:
            asg = self.current.get(p.key)
            if asg is not None:
                if asg.node in gset:
                    sub_pods.append(p)
            elif per_shape[p.shape] < min(n_gpus, 3) and len(sub_pods) < 60:
                per_shape[p.shape] += 1
                sub_pods.append(p)
        return sub_pods

    def _improve(self, group: list[str], sub_pods: list[PodDemand], end: float) -> None:
        """Re-solve the group exactly; adopt the result only if it is better."""
        sub = sub_state(self.state, group)
        old_hint = {p.key: self.current.get(p.key) for p in sub_pods}
        old_q = _quality(sub, with_placements(sub, self.by_key, old_hint), _placed_count(old_hint))
        step_limit = min(1.5, max(0.3, end - time.monotonic()))
        placements, placed, after = self.step(sub, sub_pods, step_limit, old_hint)
        self.steps += 1
        if _quality(sub, after, placed) > old_q:
            self.improved += 1
            self._adopt(old_hint, placements)

    def _adopt(self, old: Placements, new: Placements) -> None:
        """Move the step's pods from their old places to their new ones."""
        for key, asg in old.items():
            if asg is not None:
                self.now.release(key)
        for key, asg in new.items():
            self.current[key] = asg
            if asg is not None:
                self.now.allocate(self.by_key[key], asg)


# ------------------------------------------------------------------------------------------- the portfolio
def solve_large(state: ClusterState, nodes: list[NodeInfo], classes: list[PodClass], pods: list[PodDemand],
                start: Placements, time_limit: float, workers: int, relax: bool, symmetry: bool, seed: int,
                group_size: int, step: StepSolve) -> tuple[Placements, list[StageResult]]:
    """Large-neighbourhood search by node group, then an upper bound.

    Insert and improve by node group first (fast on loose clusters). If unit counting does not prove that
    optimal, solve the whole model seeded with that result when it is small enough (crowded clusters leave
    few (pod, GPU) pairs), else keep improving by node group. The bound is the tighter of unit counting
    (packing.solvers.bound.threshold_bound) and the whole model's proven bound.
    """
    t0 = time.monotonic()
    search = NodeGroupSearch(state, nodes, pods, start, seed, group_size, step)
    search.run(t0 + 0.1 * time_limit)
    sub_all = state if len(search.names) == len(state.node_names) else sub_state(state, search.names)
    bound = min(len(pods), threshold_bound(sub_all, pods))
    placed = search.placed()
    proof_s = time.monotonic() - t0 if placed >= bound else None  # when pods placed was proven optimal
    model_stages: list[StageResult] | None = None
    if placed < bound:
        bound, model_stages = _whole_model(search, classes, relax, symmetry, workers, bound,
                                           t0 + 0.93 * time_limit)
    if model_stages is None:
        search.run(t0 + 0.93 * time_limit)
    return search.current, _large_stages(state, search, bound, t0, proof_s, model_stages)


def _whole_model(search: NodeGroupSearch, classes: list[PodClass], relax: bool, symmetry: bool, workers: int,
                 bound: int, deadline: float) -> tuple[int, list[StageResult] | None]:
    """Solve the whole group's model seeded with the search's placement, when it is small enough.

    Returns the bound (tightened by the model's proven one) and the model's stages when its placement,
    at least as good as the search's, replaced `search.current`; None when the model was not used.
    """
    placed = search.placed()
    pm = PackingModel(search.nodes, classes, relax, symmetry=symmetry)
    if len(pm.x) + len(pm.z) > MODEL_VARS_LIMIT:
        return bound, None
    class_of = {p.key: c.cid for c in classes for p in c.pods}
    limit = max(1.0, deadline - time.monotonic())
    values, st = solve_stages(pm, STAGES, limit, workers, hint_from(pm, search.current, search.by_key, class_of))
    if st and st[0].status in ("OPTIMAL", "FEASIBLE"):
        bound = min(bound, st[0].bound)
    if values is None or not st or st[0].value < placed:
        return bound, None
    current: Placements = {p.key: None for p in search.pods}
    for key, (node_name, grants) in extract(pm, values).items():
        current[key] = Assignment(node_name, tuple(grants))
    search.current = current
    return bound, st


def _large_stages(state: ClusterState, search: NodeGroupSearch, bound: int, t0: float, proof_s: float | None,
                  model_stages: list[StageResult] | None) -> list[StageResult]:
    """The stages to report: pods placed against the bound, then the model's later stages or the search's."""
    placed = search.placed()
    bound = max(placed, bound)
    wall = time.monotonic() - t0
    status = "OPTIMAL" if bound == placed else "FEASIBLE"
    if proof_s is not None:
        wall = proof_s  # stage 1 was settled then; the rest of the time went to GPUs and stranded VRAM
    final = with_placements(state, search.by_key, search.current)
    note = f"LNS({search.steps} steps, {search.improved} improved)"
    if model_stages is not None:
        later = [replace(st_, status=f"{note}+model:{st_.status}") for st_ in model_stages[1:]]
        return [StageResult("placed", placed, bound, status, wall), *later]
    return [StageResult("placed", placed, bound, status, wall),
            StageResult("gpus_opened", opened_gpus(state, final), 0, note, 0.0),
            StageResult("stranded_vram_mib", final.stranded_mib(), 0, note, 0.0)]
