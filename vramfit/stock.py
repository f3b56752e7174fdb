"""The honest baseline: what kube-scheduler with the stock NVIDIA device plugin does on the same nodes.

The stock plugin advertises what each node's labels and sharing config say, and knows nothing of VRAM:
- a time-sliced or MPS GPU is `replicas` interchangeable units: a pod takes a replica whatever its VRAM
  (under MPS the plugin's per-client limit is memory / replicas, under time-slicing nothing is enforced);
- a MIG GPU (mixed strategy) offers `nvidia.com/mig-<profile>` units: the pod must name a profile, and is
  given the smallest one that holds its VRAM (the best a user who knows the pod can write);
- any other GPU is one whole `nvidia.com/gpu`.
The pod's isolation is honoured the only way the stock setup can, with a node selector on the sharing
strategy (hardware: MIG or whole GPUs; process: no time-slicing); tenants are not (no such rule exists).
kube-scheduler picks, among nodes with enough free units, the least allocated one (its default scoring);
the plugin hands out units lowest index first, replicas spread over GPUs (its `distributed` policy).

Reported beside vramfit: pods placed, GPUs used, stranded and free VRAM (the core's definitions), and what
the stock set-up allows that vramfit never does: pods whose VRAM exceeds their replica's share
(`over_commits`) and GPUs shared by two tenants (`tenant_mixes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packing.model import Mode, PodDemand
from packing.modes import mode_rules
from packing.state import ClusterState

POLICY_NAME = "device-plugin"


@dataclass
class _Unit:
    """One allocatable device of the stock plugin: a whole GPU, a MIG instance, or a replica."""

    gpu: int
    size_mib: int  # what the pod may use there (the replica's share for replicas)
    mig: str | None = None
    profile: str | None = None
    holder: tuple[str, str, int] | None = None  # (pod, tenant, vram)


@dataclass
class _Node:
    name: str
    kind: str  # "shared" (MPS / time-slicing), "mig", "whole"
    modes: set[Mode]
    units: list[_Unit] = field(default_factory=list)
    memory: dict[int, int] = field(default_factory=dict)  # GPU index -> MiB
    products: set[str] = field(default_factory=set)  # lower-case GFD products and catalog models

    def free(self, want: str | None) -> list[_Unit]:
        return [u for u in self.units if u.holder is None and (want is None or u.profile == want)]


def _nodes(state: ClusterState) -> list[_Node]:
    out: list[_Node] = []
    for node in state.nodes():
        usage = {gu.gpu.index: gu for gu in state.usage(node.name).gpus}
        kinds = {_kind(g.mode) for g in node.gpus}
        for kind in sorted(kinds):  # a node mixing kinds is one node per kind of resource here
            n = _Node(node.name, kind, {g.mode for g in node.gpus},
                      products={x.lower() for g in node.gpus for x in (g.product, g.model or "") if x})
            for g in node.gpus:
                gu = usage[g.index]
                n.memory[g.index] = g.memory_mib
                if kind != _kind(g.mode):
                    continue
                if kind == "shared":
                    replicas = g.replicas or 1
                    held = list(gu.grants.items())
                    for r in range(replicas):
                        h = held[r] if r < len(held) else None
                        n.units.append(_Unit(g.index, g.memory_mib // replicas,
                                             holder=(h[0], _tenant(state, h[0]), h[1].vram_mib) if h else None))
                elif kind == "mig":
                    for inst in g.mig:
                        key = gu.mig_holder.get(inst.ref)
                        n.units.append(_Unit(g.index, inst.memory_mib, inst.ref, inst.profile,
                                             (key, _tenant(state, key), gu.grants[key].vram_mib) if key else None))
                else:
                    key = next(iter(gu.grants), None)
                    n.units.append(_Unit(g.index, g.memory_mib, holder=(key, _tenant(state, key),
                                                                        gu.grants[key].vram_mib) if key else None))
            out.append(n)
    return out


def _kind(mode: Mode) -> str:
    """The stock plugin's resource for a GPU of `mode`: replicas of a shared GPU, profiles of an instanced
    one, else the whole GPU."""
    rules = mode_rules(mode)
    return "shared" if rules.shared else "mig" if rules.instanced else "whole"


def _tenant(state: ClusterState, key: str) -> str:
    h = state.holder(key)
    return h.pod.tenant if h is not None else ""


def _allowed(pod: PodDemand, node: _Node) -> bool:
    # The stock set-up's node selector on the sharing strategy: a shared node only when every shared mode on
    # it gives the pod the isolation it asks for.
    if node.kind == "shared" and not all(mode_rules(m).admits(pod.isolation) for m in node.modes
                                         if mode_rules(m).shared):
        return False
    # A model constraint is a node selector on nvidia.com/gpu.product in the stock set-up.
    return not pod.models or bool(pod.models & node.products)


def _profile_for(pod: PodDemand, node: _Node) -> str | None:
    """The smallest MIG profile on the node that holds the pod's VRAM (what its spec would name)."""
    sizes = sorted({(u.size_mib, u.profile) for u in node.units if u.profile})
    return next((p for size, p in sizes if size >= pod.vram_mib), None)


def _take(node: _Node, pod: PodDemand, want: str | None) -> list[_Unit] | None:
    free = node.free(want)
    if node.kind == "shared":
        # `distributed`: the GPU with the fewest replicas handed out first; one replica per GPU per pod.
        by_gpu: dict[int, list[_Unit]] = {}
        for u in free:
            by_gpu.setdefault(u.gpu, []).append(u)
        used = {g: sum(1 for u in node.units if u.gpu == g and u.holder) for g in by_gpu}
        order = sorted(by_gpu, key=lambda g: (used[g], g))
        picked = [by_gpu[g][0] for g in order[:pod.gpu_count]]
    else:
        picked = []
        for u in free:
            if all(p.gpu != u.gpu for p in picked):
                picked.append(u)
            if len(picked) == pod.gpu_count:
                break
    return picked if len(picked) == pod.gpu_count else None


def simulate_stock(state: ClusterState, pending: list[PodDemand]) -> dict[str, Any]:
    """Place `pending` as the stock set-up would; returns a what-if document (placements, summary)."""
    nodes = _nodes(state)
    placements: list[dict[str, Any]] = []
    for pod in pending:
        best: tuple[float, str, _Node, list[_Unit]] | None = None
        for n in nodes:
            if not _allowed(pod, n):
                continue
            want = _profile_for(pod, n) if n.kind == "mig" else None
            if n.kind == "mig" and want is None:
                continue
            picked = _take(n, pod, want)
            if picked is None:
                continue
            score = len(n.free(want)) / max(1, len([u for u in n.units if want is None or u.profile == want]))
            if best is None or (-score, n.name) < (-best[0], best[1]):
                best = (score, n.name, n, picked)
        if best is None:
            placements.append({"pod": pod.key, "tenant": pod.tenant, "vram_mib": pod.vram_mib,
                               "gpu_count": pod.gpu_count, "node": None, "gpus": [],
                               "reason": "no node offers enough free units of a resource this pod can name "
                                         "(nvidia.com/gpu replicas or whole GPUs, nvidia.com/mig-<profile>)"})
            continue
        _, _, n, picked = best
        for u in picked:
            u.holder = (pod.key, pod.tenant, pod.vram_mib)
        placements.append({"pod": pod.key, "tenant": pod.tenant, "vram_mib": pod.vram_mib,
                           "gpu_count": pod.gpu_count, "node": n.name,
                           "gpus": [{"index": u.gpu, "mig": u.mig, "vram_mib": pod.vram_mib} for u in picked],
                           "reason": None, "unit_mib": [u.size_mib for u in picked]})
    return {"placements": placements, "summary": _summary(nodes, placements)}


def _summary(nodes: list[_Node], placements: list[dict[str, Any]]) -> dict[str, Any]:
    stranded = free = used = total = mixes = 0
    for n in nodes:
        for gpu, memory in n.memory.items():
            units = [u for u in n.units if u.gpu == gpu]
            if not units:
                continue
            total += 1
            held = [u for u in units if u.holder]
            if held:
                used += 1
            if n.kind == "shared":
                asked = sum(u.holder[2] for u in held if u.holder)
                left = max(0, memory - asked)
                full = len(held) == len(units)
                stranded += left if full and held else 0
                free += 0 if full else left
                mixes += len({u.holder[1] for u in held if u.holder}) > 1
            else:
                stranded += sum(max(0, u.size_mib - u.holder[2]) for u in held if u.holder)
                free += sum(u.size_mib for u in units if not u.holder)
    placed = [p for p in placements if p["node"]]
    over = sum(1 for p in placed if any(p["vram_mib"] > size for size in p.get("unit_mib", [])))
    return {"policy": POLICY_NAME, "placed": len(placed), "unplaced": len(placements) - len(placed),
            "gpus_used": used, "gpus_total": total, "stranded_vram_mib": stranded, "free_vram_mib": free,
            "requested_vram_mib": sum(p["vram_mib"] * p["gpu_count"] for p in placed),
            "over_commits": over, "tenant_mixes": mixes}
