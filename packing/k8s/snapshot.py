"""Kubernetes objects (Nodes and Pods as the API server emits them) -> ClusterState.

Pure: callers read files or watch the API and hand dicts in. The what-if CLI, the demo, the extender's
snapshot mode and its live list+watch all build state through these functions.

A pod is never silently dropped: what cannot be recorded (its units clash with another holder's, or are not
on the node) comes back as `Unrecorded`, with the units that clash with nobody recorded for it meanwhile.
`settle_node` records a node's pods in an order that depends only on the objects, so any arrival order of the
same objects gives the same holders. Pods placed by a device plugin are counted under every name it uses
(`packing.vendors.PluginNames`; NVIDIA's: `packing.vendors.nvidia.plugin_names`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from packing import fit
from packing.catalog import Catalog, profile_key
from packing.k8s.demand import (
    Holding,
    bound_at,
    is_active,
    pod_holding,
    pod_key,
)
from packing.k8s.dra_snapshot import DEFAULT_CLASSES, DraObjects, Ledger, install_dra, read_dra
from packing.k8s.inventory import node_from_k8s
from packing.k8s.trust import TRUST_AS_WRITTEN, PodTrust, Tenancy
from packing.model import Assignment, GpuGrant, Holder, InputError, MigInstance, Node, PodDemand
from packing.state import ClusterState, PlacementError
from packing.usage import GpuUsage
from packing.vendors import DEFAULT_PLUGIN_NAMES, PluginNames, node_vendor

# A pod placed without vramfit may hold more device plugin units on one GPU than one holder can carry (two
# replicas of one time-sliced GPU, two 1g.10gb instances of one A100): the n-th unit on a GPU is held under
# `<namespace>/<name>#<n>`. Pod names cannot contain `#`, so a part never collides with a real pod.
PART = "#"


@dataclass(frozen=True)
class Unrecorded:
    """A pod bound to a node vramfit knows whose holding cannot be recorded in full: its units clash with
    another holder's, or are not on the node (any more, e.g. after a MIG re-partition). `held` are the units
    recorded for it meanwhile (those nobody else holds): they are not offered to another pod either."""

    key: str
    uid: str
    node: str
    reason: str
    held: tuple[GpuGrant, ...] = ()


@dataclass
class PodSync:
    """What `record_pod` did: warnings for operators, and the pod's holding if it could not be recorded."""

    warnings: list[str] = field(default_factory=list)
    unrecorded: Unrecorded | None = None


@dataclass
class NodeSync:
    """What `upsert_node` did: warnings, and the pods whose units no longer fit the node's new description."""

    warnings: list[str]
    displaced: list[str]  # pod keys, in the order they were recorded


@dataclass
class NodeSettle:
    """What `settle_node` did: the pods it could not record in full, and those it could not read."""

    unrecorded: list[Unrecorded]
    errors: list[InputError]


def split_objects(objs: Iterable[Any], source: str = "input") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and Pods out of a flat list of objects (a `List`'s items, or YAML documents)."""
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i, obj in enumerate(_flatten(objs)):
        if not isinstance(obj, dict):
            raise InputError(source, f"items[{i}]", f"expected an object, got {type(obj).__name__}")
        kind = obj.get("kind")
        if kind == "Node":
            nodes.append(obj)
        elif kind == "Pod":
            pods.append(obj)
        elif kind is None:
            raise InputError(source, f"items[{i}].kind", "missing (expected Node or Pod)")
        # Other kinds (Services, ConfigMaps, ...) in a `kubectl get -A` dump are irrelevant here.
    return nodes, pods


def _flatten(objs: Iterable[Any]) -> Iterable[Any]:
    for obj in objs:
        if obj is None:
            continue  # empty YAML document
        if isinstance(obj, dict) and (obj.get("kind") == "List" or str(obj.get("kind", "")).endswith("List")):
            items = obj.get("items")
            if not isinstance(items, list):
                raise InputError("List", "items", "expected a list")
            yield from _flatten(items)
        else:
            yield obj


def namespace_objects(objs: Iterable[Any]) -> list[dict[str, Any]]:
    """The Namespace objects among `objs` (their tenancy rules, `packing.k8s.trust`)."""
    return [o for o in _flatten(objs) if isinstance(o, dict) and o.get("kind") == "Namespace"]


def snapshot_trust(objs: Iterable[Any]) -> PodTrust:
    """How a snapshot's pods are read: its Namespaces' tenancy rules; assignments as written (no key)."""
    return PodTrust(tenancy=Tenancy.from_objects(namespace_objects(objs)))


@dataclass
class LoadedCluster:
    """A cluster read from objects: its state, warnings, DRA objects and the capacity their allocations use."""

    state: ClusterState
    warnings: list[str]
    dra: DraObjects
    ledger: Ledger


def load_objects(objs: Iterable[Any], catalog: Catalog, relax_tenancy: bool = False, source: str = "input",
                 names: PluginNames = DEFAULT_PLUGIN_NAMES,
                 trust: PodTrust | None = None) -> tuple[ClusterState, list[str]]:
    """`load_cluster`'s state and warnings for operators."""
    loaded = load_cluster(objs, catalog, relax_tenancy, source, names, trust)
    return loaded.state, loaded.warnings


def load_cluster(objs: Iterable[Any], catalog: Catalog, relax_tenancy: bool = False, source: str = "input",
                 names: PluginNames = DEFAULT_PLUGIN_NAMES, trust: PodTrust | None = None,
                 dra_classes: tuple[str, ...] = DEFAULT_CLASSES) -> LoadedCluster:
    """A whole cluster from Node, Pod and DRA objects (`packing.k8s.dra_snapshot`).

    Each node's pods are recorded in `settle_node`'s order, so the result does not depend on the order of
    the objects: the extender rebuilds the same state from the API. `trust` defaults to the objects' own
    Namespaces (`snapshot_trust`). DRA nodes and the claims' allocations are booked before any pod."""
    objs = list(objs)
    trust = snapshot_trust(objs) if trust is None else trust
    node_objs, pod_objs = split_objects(objs, source)
    state = ClusterState(relax_tenancy=relax_tenancy)
    warnings: list[str] = []
    for obj in node_objs:
        warnings.extend(sync_node(state, obj, catalog, names))
    dra = read_dra(_flatten(objs), catalog, trust.tenancy, dra_classes)
    ledger, dra_warnings = install_dra(state, dra)
    warnings += [*dra.warnings, *dra_warnings]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for obj in pod_objs:
        key = pod_key(obj)
        if not is_active(obj):
            continue
        node_name = _node_of(obj)
        if not state.has_node(node_name):
            if pod_holding(obj, names, trust) is not None:
                warnings.append(f"pod {key} is bound to {node_name}, which vramfit does not know")
            continue
        by_node.setdefault(node_name, []).append(obj)
    for node_name, objs_here in by_node.items():
        settled = settle_node(state, node_name, objs_here, names, trust)
        if settled.errors:
            raise settled.errors[0]
        warnings.extend(_unrecorded_warning(u) for u in settled.unrecorded)
    return LoadedCluster(state, warnings, dra, ledger)


def upsert_node(state: ClusterState, obj: Mapping[str, Any], catalog: Catalog,
                names: PluginNames = DEFAULT_PLUGIN_NAMES) -> NodeSync:
    """Add or update a node from its API object; the pods whose units no longer fit are returned (released)."""
    node = node_from_k8s(dict(obj), catalog, names)
    displaced = state.upsert_node(node)
    gone = {h.pod.key for h in displaced}
    keys = _base_keys(h.pod.key for h in displaced)
    for key in keys:
        # Not half a pod: a pod that lost some of its parts gives up all of them, to be recorded again whole.
        _release_parts(state, key, gone)
    warnings = [f"node {node.name}: {w}" for w in node.warnings]
    warnings.extend(f"node {node.name} changed: {key} no longer fits its units" for key in keys)
    return NodeSync(warnings, keys)


def sync_node(state: ClusterState, obj: Mapping[str, Any], catalog: Catalog,
              names: PluginNames = DEFAULT_PLUGIN_NAMES) -> list[str]:
    """Add or update a node from its API object; holders that no longer fit are reported."""
    return upsert_node(state, obj, catalog, names).warnings


def remove_node(state: ClusterState, name: str) -> list[str]:
    """Remove a node; returns the keys of the pods that held units there."""
    return _base_keys(h.pod.key for h in state.remove_node(name))


def forget_pod(state: ClusterState, key: str) -> bool:
    return release_pod(state, key) is not None


def release_pod(state: ClusterState, key: str) -> Holder | None:
    """Free everything a pod holds, its parts included; returns its (first) holder."""
    return _release_parts(state, key, frozenset())


def pod_units(state: ClusterState, key: str) -> list[GpuGrant]:
    """Every unit recorded for a pod, its parts included."""
    units: list[GpuGrant] = []
    h = state.holder(key)
    n = 2
    while h is not None:
        units.extend(h.assignment.gpus)
        h = state.holder(f"{key}{PART}{n}")
        n += 1
    return units


def _release_parts(state: ClusterState, key: str, gone: Iterable[str]) -> Holder | None:
    # Parts are recorded and released together, so they are numbered 2..k without gaps; `gone` are parts
    # the state has just dropped itself (upsert_node), which would otherwise look like the end.
    missing = set(gone)
    first = state.release(key)
    n = 2
    while True:
        part = f"{key}{PART}{n}"
        if state.release(part) is None and part not in missing:
            return first
        n += 1


def _base_keys(keys: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(k.split(PART, 1)[0] for k in keys))


def _node_of(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    return str((spec.get("nodeName") if isinstance(spec, dict) else None) or "")


def record_pod(state: ClusterState, obj: Mapping[str, Any],
               names: PluginNames = DEFAULT_PLUGIN_NAMES, trust: PodTrust = TRUST_AS_WRITTEN) -> PodSync:
    """Bring one pod's holding in line with its API object (bound+running holds, anything else holds nothing).

    A reserved (chosen, not yet bound) holder is kept while the pod is still pending: the extender owns it.
    A holding that cannot be recorded in full is returned as `unrecorded` (what it could hold is recorded).
    """
    key = pod_key(obj)
    current = state.holder(key)
    if not is_active(obj):
        if current is not None and not current.reserved:
            release_pod(state, key)
        return PodSync()
    node_name = _node_of(obj)
    holding = pod_holding(obj, names, trust)
    notes = [holding.distrusted] if holding is not None and holding.distrusted else []
    if holding is None:
        if current is not None:
            release_pod(state, key)
        return PodSync()
    if current is not None:
        if current.assignment.node == node_name and _complete(state, holding, current):
            state.confirm(key)  # bound where we reserved it, or recorded already
            return PodSync(notes)
        release_pod(state, key)
    if not state.has_node(node_name):
        return PodSync([*notes, f"pod {key} is bound to {node_name}, which vramfit does not know"])
    return PodSync(notes, unrecorded=_record(state, holding, node_name))


def _unrecorded_warning(u: Unrecorded) -> str:
    return f"pod {u.key} on {u.node}: cannot record what it holds: {u.reason}"


def settle_node(state: ClusterState, node_name: str, objs: Iterable[Mapping[str, Any]],
                names: PluginNames = DEFAULT_PLUGIN_NAMES, trust: PodTrust = TRUST_AS_WRITTEN) -> NodeSettle:
    """Record every pod the API shows bound to `node_name` afresh, in one order that does not depend on the
    order their objects arrived in, so a restart rebuilds the same holders and the same unrecorded pods:

    1. pods whose units an assignment names, earliest bound first (`vramfit.io/bound-at`, else creation):
       of two pods naming one unit, the one bound first got it on the node and keeps it;
    2. pods placed by the device plugin: their units are picked (see `_plugin_units`), after the named ones, so
       a guess never takes a unit an assignment names;
    3. vramfit pods bound without an assignment (units picked by best fit).

    Pods not among `objs` keep what they hold: reservations, and binds confirmed before their pod's watch event.
    A pod whose object cannot be read keeps what it held and is returned in `errors`."""
    entries: list[tuple[int, float, str, Holding]] = []
    errors: list[InputError] = []
    for obj in objs:
        if not is_active(obj) or _node_of(obj) != node_name:
            continue
        try:
            key = pod_key(obj)
            holding = pod_holding(obj, names, trust)
        except InputError as err:
            errors.append(err)
            continue
        release_pod(state, key)
        if holding is not None:
            entries.append((_record_class(holding), _bound_time(obj), key, holding))
    unrecorded: list[Unrecorded] = []
    if not state.has_node(node_name):
        return NodeSettle(unrecorded, errors)
    for _, _, _, holding in sorted(entries, key=lambda e: e[:3]):
        problem = _record(state, holding, node_name)
        if problem is not None:
            unrecorded.append(problem)
    return NodeSettle(unrecorded, errors)


def _record_class(holding: Holding) -> int:
    if holding.grants is not None:
        return 0
    return 1 if holding.whole_gpus or holding.mig_profiles else 2


def _bound_time(obj: Mapping[str, Any]) -> float:
    """When the pod was bound (epoch seconds, `packing.k8s.demand.bound_at`); +inf when unknown."""
    stamp = bound_at(obj)
    return math.inf if stamp is None else stamp


def _units_needed(holding: Holding) -> int:
    if holding.grants is not None:
        return len(holding.grants)
    if holding.whole_gpus or holding.mig_profiles:
        return holding.whole_gpus + len(holding.mig_profiles)
    return holding.pod.gpu_count


def _complete(state: ClusterState, holding: Holding, current: Holder) -> bool:
    """Whether the recorded holder is all the pod's object says it holds (not a partial record)."""
    if holding.grants is not None:
        return tuple(holding.grants) == current.assignment.gpus
    return len(pod_units(state, current.pod.key)) == _units_needed(holding)


def _record(state: ClusterState, holding: Holding, node_name: str) -> Unrecorded | None:
    """Record a bound pod's holding (reality wins: capacity and tenancy are not re-judged, but a unit is never
    booked twice). What cannot be recorded is returned; the units that clash with nobody are recorded anyway."""
    pod = holding.pod
    if holding.grants is not None:
        try:
            state.allocate(pod, Assignment(node_name, holding.grants), force=True)
            return None
        except PlacementError as err:
            problems = {g: _grant_problem(state, node_name, pod, g) for g in holding.grants}
            held = tuple(g for g, problem in problems.items() if problem is None)
            if held:
                state.allocate(replace(pod, gpu_count=len(held)), Assignment(node_name, held), force=True)
            reason = "; ".join(p for p in problems.values() if p) or str(err)
            return Unrecorded(pod.key, pod.uid, node_name, reason, held)
    if not holding.whole_gpus and not holding.mig_profiles:
        # A vramfit pod bound without an assignment annotation (e.g. by another binder): pick units now.
        chosen = fit.choose_units(state, node_name, pod)
        if chosen is None:
            return Unrecorded(pod.key, pod.uid, node_name,
                              f"no units on {node_name} fit {pod.vram_mib} MiB x {pod.gpu_count}")
        state.allocate(pod, chosen, force=True)
        return None
    picked, shortfall = _plugin_units(state, node_name, holding)
    layers: list[list[GpuGrant]] = []
    depth: dict[int, int] = {}
    for grant in picked:
        n = depth.get(grant.index, 0)
        depth[grant.index] = n + 1
        if n == len(layers):
            layers.append([])
        layers[n].append(grant)
    for n, layer in enumerate(layers):
        key = pod.key if n == 0 else f"{pod.key}{PART}{n + 1}"
        part = PodDemand(key=key, vram_mib=0, gpu_count=len(layer), tenant=pod.tenant, uid=pod.uid)
        state.allocate(part, Assignment(node_name, tuple(sorted(layer, key=lambda g: g.index))), force=True)
    if shortfall:
        return Unrecorded(pod.key, pod.uid, node_name, "; ".join(shortfall), tuple(picked))
    return None


def _grant_problem(state: ClusterState, node_name: str, pod: PodDemand, grant: GpuGrant) -> str | None:
    """Why this one unit cannot be recorded for the pod now (None: it can)."""
    try:
        state.check(replace(pod, gpu_count=1), Assignment(node_name, (grant,)), force=True)
    except PlacementError as err:
        return str(err)
    return None


def _plugin_units(state: ClusterState, node_name: str, holding: Holding) -> tuple[list[GpuGrant], list[str]]:
    """Units for a pod the device plugin placed, which does not say which it gave: one per unit asked, picked
    the way the plugin's default `distributed` policy picks (the GPU with the fewest units handed out first,
    then the one picked fewest times for this pod, then the lowest index), so the guess is where the pod most
    likely is. Returns the units found and what could not be found."""
    usage = state.usage(node_name)
    pick = _PluginPick(usage.gpus)
    missing: dict[str, int] = {}
    for profile in holding.mig_profiles:
        if not pick.take_instance(profile):
            missing[f"MIG instance {profile}"] = missing.get(f"MIG instance {profile}", 0) + 1
    single = node_vendor(usage.node).gpu_units_are_instances(usage.node)
    for _ in range(holding.whole_gpus):
        if not (pick.take_instance(None) if single else pick.take_gpu()):
            what = "MIG device (MIG strategy single)" if single else "GPU or replica"
            missing[what] = missing.get(what, 0) + 1
    shortfall = [f"no free {what} on {node_name} for {n} of its device plugin units" if n > 1
                 else f"no free {what} on {node_name} for one of its device plugin units"
                 for what, n in missing.items()]
    return pick.picked, shortfall


class _PluginPick:
    """The units picked so far for one pod the device plugin placed, on one node's GPUs (`_plugin_units`)."""

    def __init__(self, gpus: Iterable[GpuUsage]) -> None:
        self.gpus = list(gpus)
        self.taken: dict[int, int] = {}  # GPU index -> units picked for this pod
        self.taken_instances: set[tuple[int, str]] = set()
        self.picked: list[GpuGrant] = []

    def _order(self, gu: GpuUsage) -> tuple[int, int, int]:
        i = gu.gpu.index
        # The plugin counts only its own units; vramfit's pods on a GPU count here too (a cheap, close proxy).
        return gu.pods + self.taken.get(i, 0), self.taken.get(i, 0), i

    def _first_free_instance(self, gu: GpuUsage, profile: str | None) -> MigInstance | None:
        """The GPU's first free instance of `profile` (any profile: None) not picked yet; instances are in start
        order, so it stands for the GPU."""
        for inst in gu.free_instances():
            if (gu.gpu.index, inst.ref) in self.taken_instances:
                continue
            if profile is not None and profile_key(inst.profile) != profile_key(profile):
                continue
            return inst
        return None

    def take_instance(self, profile: str | None) -> bool:
        best: tuple[tuple[int, int, int], GpuUsage, MigInstance] | None = None
        for gu in self.gpus:
            if not gu.rules.instanced or gu.whole_holder is not None:
                continue
            inst = self._first_free_instance(gu, profile)
            if inst is not None and (best is None or self._order(gu) < best[0]):
                best = (self._order(gu), gu, inst)
        if best is None:
            return False
        _, gu, inst = best
        self.taken_instances.add((gu.gpu.index, inst.ref))
        self.taken[gu.gpu.index] = self.taken.get(gu.gpu.index, 0) + 1
        self.picked.append(GpuGrant(gu.gpu.index, inst.memory_mib, mig=inst.ref))
        return True

    def _unit_free(self, gu: GpuUsage) -> bool:
        """One more device plugin unit of this (not instanced) GPU is free: the GPU itself when a grant takes
        it whole, else a replica of it."""
        n = self.taken.get(gu.gpu.index, 0)
        if gu.rules.takes_whole:
            return not gu.grants and n == 0
        return gu.pods + n < gu.max_pods()

    def take_gpu(self) -> bool:
        best: tuple[tuple[int, int, int], GpuUsage] | None = None
        for gu in self.gpus:
            if gu.rules.instanced or gu.whole_holder is not None or not self._unit_free(gu):
                continue
            if best is None or self._order(gu) < best[0]:
                best = (self._order(gu), gu)
        if best is None:
            return False
        gu = best[1]
        g = gu.gpu
        self.taken[g.index] = self.taken.get(g.index, 0) + 1
        # A replica: the device plugin's equal split is the best estimate of its VRAM.
        vram = g.memory_mib if gu.rules.takes_whole else g.memory_mib // max(1, g.replicas or 1)
        self.picked.append(GpuGrant(g.index, vram))
        return True


def node_summary(state: ClusterState, node: Node) -> dict[str, Any]:
    """JSON view of one node's GPUs and units: who holds what, free VRAM (for /state and what-if)."""
    usage = state.usage(node.name)
    gpus = []
    for gu in usage.gpus:
        g = gu.gpu
        units: list[dict[str, Any]] = []
        if gu.rules.instanced:
            for inst in g.mig:
                holder = gu.mig_holder.get(inst.ref)
                units.append({"mig": inst.ref, "memory_mib": inst.memory_mib, "holder": holder,
                              "vram_mib": gu.grants[holder].vram_mib if holder else 0})
        else:
            units = [{"holder": k, "vram_mib": gr.vram_mib, "whole": gr.whole} for k, gr in gu.grants.items()]
        gpus.append({"index": g.index, "product": g.product, "model": g.model, "mode": g.mode.value,
                     "memory_mib": g.memory_mib, "replicas": g.replicas, "tenant": gu.tenant(),
                     "free_mib": gu.pool_free(), "largest_free_unit_mib": gu.unit_max(), "pods": gu.pods,
                     "units": units})
    return {"name": node.name, "gpus": gpus, "warnings": list(node.warnings)}
