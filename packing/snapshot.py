"""Kubernetes objects (Nodes and Pods as the API server emits them) -> ClusterState.

Pure: callers read files or watch the API and hand dicts in. The what-if CLI, the demo, the extender's
snapshot mode and its live list+watch all build state through these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from packing import fit
from packing.catalog import Catalog
from packing.demand import Holding, is_active, pod_holding, pod_key
from packing.inventory import node_from_k8s
from packing.model import Assignment, GpuGrant, InputError, MigInstance, Mode, Node, PodDemand
from packing.state import ClusterState, PlacementError


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


def load_objects(objs: Iterable[Any], catalog: Catalog, relax_tenancy: bool = False,
                 source: str = "input") -> tuple[ClusterState, list[str]]:
    """A whole cluster from Node and Pod objects; returns the state and warnings for operators."""
    node_objs, pod_objs = split_objects(objs, source)
    state = ClusterState(relax_tenancy=relax_tenancy)
    warnings: list[str] = []
    for obj in node_objs:
        warnings.extend(sync_node(state, obj, catalog))
    for obj in pod_objs:
        warnings.extend(sync_pod(state, obj))
    return state, warnings


def sync_node(state: ClusterState, obj: Mapping[str, Any], catalog: Catalog) -> list[str]:
    """Add or update a node from its API object; holders that no longer fit are reported."""
    node = node_from_k8s(dict(obj), catalog)
    displaced = state.upsert_node(node)
    warnings = [f"node {node.name}: {w}" for w in node.warnings]
    warnings.extend(f"node {node.name} changed: {h.pod.key} no longer fits its units and was dropped"
                    for h in displaced)
    return warnings


def remove_node(state: ClusterState, name: str) -> list[str]:
    return [h.pod.key for h in state.remove_node(name)]


def forget_pod(state: ClusterState, key: str) -> bool:
    return state.release(key) is not None


def sync_pod(state: ClusterState, obj: Mapping[str, Any]) -> list[str]:
    """Bring one pod's holding in line with its API object (bound+running holds, anything else holds nothing).

    A reserved (chosen, not yet bound) holder is kept while the pod is still pending: the extender owns it.
    """
    key = pod_key(obj)
    current = state.holder(key)
    if not is_active(obj):
        if current is not None and not current.reserved:
            state.release(key)
        return []
    node_name = str((obj.get("spec") or {}).get("nodeName"))
    holding = pod_holding(obj)
    if holding is None:
        if current is not None:
            state.release(key)
        return []
    if current is not None:
        same_node = current.assignment.node == node_name
        if same_node and (holding.grants is None or tuple(holding.grants) == current.assignment.gpus):
            state.confirm(key)  # bound where we reserved it
            return []
        state.release(key)
    if not state.has_node(node_name):
        return [f"pod {key} is bound to {node_name}, which vramfit does not know"]
    try:
        _record(state, holding, node_name)
    except PlacementError as err:
        return [f"pod {key} on {node_name}: cannot record what it holds: {err}"]
    return []


def _record(state: ClusterState, holding: Holding, node_name: str) -> None:
    pod = holding.pod
    if holding.grants is not None:
        state.allocate(pod, Assignment(node_name, holding.grants), force=True)
        return
    if pod.vram_mib > 0 and not holding.whole_gpus and not holding.mig_profiles:
        # A vramfit pod bound without an assignment annotation (e.g. by another binder): pick units now.
        chosen = fit.choose_units(state, node_name, pod)
        if chosen is None:
            raise PlacementError(f"no units on {node_name} fit {pod.vram_mib} MiB x {pod.gpu_count}")
        state.allocate(pod, chosen, force=True)
        return
    grants = _foreign_grants(state, node_name, holding)
    placeholder = PodDemand(key=pod.key, vram_mib=0, gpu_count=len(grants), tenant=pod.tenant, uid=pod.uid)
    state.allocate(placeholder, Assignment(node_name, tuple(grants)), force=True)


def _foreign_grants(state: ClusterState, node_name: str, holding: Holding) -> list[GpuGrant]:
    """Units for a pod placed without vramfit (`nvidia.com/gpu`, `nvidia.com/mig-<p>`): lowest free first,
    as the device plugin's allocator does not tell us which it gave."""
    usage = state.usage(node_name)
    grants: list[GpuGrant] = []
    used: set[int] = set()
    for profile in holding.mig_profiles:
        for gu in usage.gpus:
            if gu.gpu.index in used or gu.gpu.mode is not Mode.MIG:
                continue
            inst: MigInstance | None = next((i for i in gu.free_instances() if i.profile == profile), None)
            if inst is not None:
                grants.append(GpuGrant(gu.gpu.index, inst.memory_mib, mig=inst.ref))
                used.add(gu.gpu.index)
                break
        else:
            raise PlacementError(f"no free MIG instance {profile}")
    for _ in range(holding.whole_gpus):
        for gu in usage.gpus:
            g = gu.gpu
            if g.index in used or g.mode is Mode.MIG:
                continue
            if g.mode is Mode.EXCLUSIVE and not gu.grants:
                grants.append(GpuGrant(g.index, g.memory_mib))
            elif g.mode in (Mode.MPS, Mode.TIMESLICE) and gu.pods < gu.max_pods():
                # A replica: the device plugin's equal split is the best estimate of its VRAM.
                grants.append(GpuGrant(g.index, g.memory_mib // max(1, g.replicas or 1)))
            else:
                continue
            used.add(g.index)
            break
        else:
            raise PlacementError("no free GPU or replica for nvidia.com/gpu")
    return grants


def node_summary(state: ClusterState, node: Node) -> dict[str, Any]:
    """JSON view of one node's GPUs and units: who holds what, free VRAM (for /state and what-if)."""
    usage = state.usage(node.name)
    gpus = []
    for gu in usage.gpus:
        g = gu.gpu
        units: list[dict[str, Any]] = []
        if g.mode is Mode.MIG:
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
