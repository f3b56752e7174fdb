"""`vramfit whatif`: place pending pods on a cluster snapshot, offline, with any registered policy."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import replace
from typing import Any

from kubeio.files import (
    CliError,
    input_error,
    iter_items,
    load_snapshot,
    read_yaml_documents,
    unknown_field_warnings,
)
from packing.catalog import Catalog, load_catalog
from packing.dra.allocate import Allocator, Ledger, PodAllocation, PodClaims, Unallocated
from packing.dra.index import EligibleIndex
from packing.dra.results import allocation_json
from packing.k8s.demand import ANN_MODELS, pod_demand, pod_key
from packing.k8s.dra_snapshot import DraObjects
from packing.k8s.pod_keys import check_extended_resources
from packing.k8s.quantity import format_quantity
from packing.k8s.trust import NO_NAMESPACE_RULES, Tenancy
from packing.model import InputError, PodDemand
from packing.model_names import unknown_models_problem
from packing.place import Decision, place_all
from packing.policies import DEFAULT_POLICY, get_policy
from packing.policies.base import Policy
from packing.state import ClusterState
from vramfit.served import count_served
from vramfit.summary import summary_json
from vramfit.whatif_usage import (
    add_usage_arguments,
    check_usage_flags,
    format_usage,
    read_peaks,
    right_size,
    wants_usage,
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "whatif", help="place pending pods on a cluster snapshot (offline)",
        description="Place PENDING pods, in order, on the cluster in a snapshot taken with "
                    "`kubectl get namespaces,nodes,pods -o yaml -A` (Namespaces: which tenants their pods may name). "
                    "By default the answer is what `vramfit serve` does with its default config (planning: true): "
                    "one CP-SAT plan of the whole pending list, then each pod in order by the extender's "
                    "follow-the-plan rule; --online answers with the online policy alone (planning: false). "
                    "Only nodes whose kubelet advertises vramfit.io/gpu (the node agent runs there) are counted, "
                    "as the extender counts them; a snapshot where no node does is read as a cluster before "
                    "vramfit is installed, every node counted, with a warning.")
    p.add_argument("--snapshot", required=True, metavar="CLUSTER.yaml", help="Nodes and Pods (a List or documents)")
    p.add_argument("--pods", metavar="PENDING.yaml",
                   help="the pods to place, in order (required, except for --capacity alone)")
    p.add_argument("--policy", default=None, help=f"placement policy (default {DEFAULT_POLICY}; "
                                                  "see `vramfit policies`); needs --pods")
    p.add_argument("--online", action="store_true",
                   help="place with the online policy alone, pod by pod, as `vramfit serve` does with "
                        "`planning: false` (default: plan the queue, then follow the plan, as serve does)")
    p.add_argument("--format", choices=("json", "table"), default="table")
    p.add_argument("--catalog", metavar="MODELS.yaml", help="YAML file adding or overriding GPU models")
    p.add_argument("--relax-tenancy", action="store_true",
                   help="let tenants share MPS/time-sliced GPUs (dev clusters only)")
    try:
        from vramfit.whatif_solvers import add_solver_arguments
    except ModuleNotFoundError as err:
        if err.name != "vramfit.whatif_solvers":
            raise
    else:
        add_solver_arguments(p)
    add_usage_arguments(p)
    p.set_defaults(func=run)
    return p


def load_catalog_arg(path: str | None) -> Catalog:
    try:
        return load_catalog(path)
    except InputError as err:
        raise input_error(path or "catalog", err) from None


def load_cluster(path: str, catalog: Catalog, relax_tenancy: bool = False) -> tuple[ClusterState, list[str]]:
    """The cluster of a snapshot file and its warnings; `kubeio.files.load_snapshot` does the checking."""
    snap = load_snapshot(path, catalog, relax_tenancy=relax_tenancy)
    drop_dra_nodes(snap.state, snap.dra)
    return snap.state, snap.warnings


def drop_dra_nodes(state: ClusterState, dra: DraObjects | None) -> None:
    """Leave only the device-plugin nodes in `state`: pods asking vramfit for VRAM are never offered a DRA node
    (no node agent runs there; its GPUs are allocated through claims)."""
    for name in sorted(dra.node_names if dra is not None else ()):
        if state.has_node(name):
            state.remove_node(name)


def load_pending(path: str, warnings: list[str] | None = None, tenancy: Tenancy = NO_NAMESPACE_RULES,
                 catalog: Catalog | None = None, state: ClusterState | None = None) -> list[PodDemand]:
    """The pods of a --pods file, in order, their tenants by `tenancy` (the snapshot's Namespaces: a pod naming
    a tenant its namespace does not allow is an error); objects of other kinds are ignored with a warning.

    Each pod goes through the webhook's checks (VRAM in requests without an equal limit; with `catalog`,
    `vramfit.io/gpu-models` names no GPU matches), and is placed once: a pod twice in the file, or one that
    already holds GPUs in `state`, is an error."""
    docs = read_yaml_documents(path)
    demands = []
    seen: dict[str, str] = {}
    try:
        for item in iter_items(path, docs):
            if not isinstance(item.obj, dict):
                raise CliError(f"{path}: {item.where}: expected an object, got {type(item.obj).__name__}")
            if item.kind != "Pod":
                if warnings is not None:
                    warnings.append(f"{path}: {item.label}: not a Pod (kind {item.kind!r}): ignored")
                continue
            if warnings is not None:
                warnings.extend(f"{path}: {item.label}: {w}" for w in unknown_field_warnings(item.obj))
            demand = pod_demand(item.obj, tenancy)
            if demand is None:
                raise InputError(f"pod {pod_key(item.obj)}", "spec.containers[*].resources",
                                 "asks for no VRAM: set resource vramfit.io/vram (MiB) or annotation vramfit.io/vram")
            _webhook_checks(item.obj, demand, catalog, state)
            if demand.key in seen:
                raise CliError(f"{path}: {item.label}: field metadata.name: pod {demand.key} is already "
                               f"{seen[demand.key]}: each pending pod is placed once (give it its own name)")
            seen[demand.key] = f"at {item.where}"
            held = state.holder(demand.key) if state is not None else None
            if held is not None:
                raise CliError(f"{path}: {item.label}: field metadata.name: pod {demand.key} already runs on "
                               f"{held.assignment.node} in the snapshot: a pending pod needs a name of its own")
            demands.append(demand)
    except InputError as err:
        raise input_error(path, err) from None
    if not demands:
        raise CliError(f"{path}: no Pod objects found")
    return demands


def _webhook_checks(obj: dict[str, Any], demand: PodDemand, catalog: Catalog | None,
                    state: ClusterState | None) -> None:
    """What the admission webhook refuses at creation (extender/webhook.py), so a what-if never places a pod
    the cluster would not admit: the same core checks, the same words."""
    who = f"pod {demand.key}"
    check_extended_resources(obj.get("spec") or {}, who)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANN_MODELS) if isinstance(annotations, dict) else None
    if catalog is None or not isinstance(raw, str):
        return
    problem = unknown_models_problem(catalog, [m for m in raw.split(",") if m.strip()],
                                     lambda: _products(state))
    if problem is not None:
        raise InputError(who, f"metadata.annotations[{ANN_MODELS}]", problem)


def _products(state: ClusterState | None) -> set[str]:
    if state is None:
        return set()
    return {g.product for name in state.node_names for g in state.node(name).gpus}


def simulate(state: ClusterState, pending: list[PodDemand], policy_name: str, planning: bool = False,
             time_limit: float | None = None) -> dict[str, Any]:
    """Place `pending` on `state` (mutated) and return the what-if JSON document: with `planning`, as
    `vramfit serve` does by default (one plan of the queue, then follow it: `whatif_solvers.plan_and_follow`,
    the online answer beside it as `placements_online`), else by the online policy alone."""
    policy = _policy(policy_name)
    online_state = state.copy() if planning else state
    decisions = place_all(online_state, pending, policy)
    online = {"placements": [placement_json(d) for d in decisions],
              "summary": {**summary_json(online_state, decisions, policy_name), "planning": "off"}}
    if not planning:
        return online
    from vramfit.whatif_solvers import DEFAULT_TIME_LIMIT, plan_and_follow

    return plan_and_follow(state, pending, online, DEFAULT_TIME_LIMIT if time_limit is None else time_limit)


def _policy(name: str) -> Policy:
    try:
        return get_policy(name)
    except KeyError as err:
        raise CliError(f"--policy: {err.args[0]}") from None


# ------------------------------------------------------------------------------------------------------ DRA
def place_dra(state: ClusterState, dra: DraObjects, ledger: Ledger, policy_name: str) -> dict[str, Any]:
    """The DRA pods' claims allocated on `state` (mutated) as vramfit's live allocator does
    (`packing.dra.allocate.Allocator`, the live policy), online, in queue order (priority, then creation): per
    pod its node, each claim's devices and the `status.allocation` it would get; the others with why."""
    alloc = Allocator(state, dict(dra.inventory.nodes), EligibleIndex(dra.inventory, dra.classes),
                      _policy(policy_name), ledger)
    done: dict[str, str] = {}  # claim key -> node, for a claim two pods share: allocated once
    queue = sorted(enumerate(dra.pending), key=lambda e: (-e[1].priority, e[1].created, e[0]))
    rows = [_dra_pod(alloc, pod, done, dra) for _, pod in queue]
    rows += [{"pod": w.pod, "tenant": None, "isolation": None, "node": None, "claims": [], "gated": w.gated,
              "reason": w.reason} for w in dra.waiting]
    return {"placements": rows, "summary": _dra_summary(state, dra, rows, policy_name)}


def _dra_pod(alloc: Allocator, pod: PodClaims, done: dict[str, str], dra: DraObjects) -> dict[str, Any]:
    row: dict[str, Any] = {"pod": pod.key, "tenant": pod.tenant, "isolation": pod.isolation.value, "node": None,
                           "claims": [], "gated": pod.key in dra.gated, "reason": None}
    fixed = {done[c.ref.key] for c in pod.claims if c.ref.key in done} | ({pod.node} if pod.node else set())
    todo = tuple(c for c in pod.claims if c.ref.key not in done)
    if len(fixed) > 1:
        row["reason"] = f"its claims are allocated on different nodes ({', '.join(sorted(fixed))})"
        return row
    if not todo:  # every claim allocated for an earlier pod of the queue: it runs where they are
        row["node"] = next(iter(fixed))
        return row
    got = alloc.allocate(replace(pod, claims=todo, node=next(iter(fixed), None)))
    if isinstance(got, Unallocated):
        row["reason"] = got.reason
        return row
    assert isinstance(got, PodAllocation)
    row["node"] = got.node
    for cp in got.claims:
        done[cp.claim.ref.key] = got.node
        row["claims"].append({
            "claim": cp.claim.ref.key, "from_template": dra.templated.get(cp.claim.ref.key),
            "devices": [{"request": p.request, "driver": p.fit.device.id.driver, "pool": p.fit.device.id.pool,
                         "device": p.fit.device.id.device,
                         "consumed": None if p.fit.consumed is None else
                         {k: format_quantity(v) for k, v in p.fit.consumed.items()}} for p in cp.picks],
            "allocation": allocation_json(cp, dra.classes, _share_ids(cp.claim.ref.key))})
    return row


def _share_ids(claim_key: str) -> Any:
    """shareIDs for one claim's allocation: RFC 4122 UUIDs, the same on every run of the same what-if."""
    n = iter(range(1 << 30))
    return lambda: str(uuid.uuid5(uuid.NAMESPACE_URL, f"vramfit-whatif:{claim_key}:{next(n)}"))


def _dra_summary(state: ClusterState, dra: DraObjects, rows: list[dict[str, Any]], policy_name: str
                 ) -> dict[str, Any]:
    nodes = [n for n in sorted(dra.node_names) if state.has_node(n)]
    usages = [state.usage(n) for n in nodes]
    return {"policy": policy_name, "planning": "off", "allocated": sum(1 for r in rows if r["node"]),
            "unallocated": sum(1 for r in rows if not r["node"]), "nodes": len(nodes),
            "gpus_used": sum(1 for u in usages for gu in u.gpus if gu.grants),
            "gpus_total": sum(len(u.gpus) for u in usages),
            "stranded_vram_mib": sum(u.stranded_mib() for u in usages),
            "free_vram_mib": sum(gu.pool_free() for u in usages for gu in u.gpus)}


def format_dra(doc: dict[str, Any]) -> list[str]:
    """The DRA section of a what-if table: one row per claim allocated (devices as driver/pool/device)."""
    s = doc["summary"]
    rows = [("POD", "TENANT", "NODE", "CLAIM", "DEVICES", "WHY PENDING")]
    for p in doc["placements"]:
        claims = p["claims"] or [None]
        for i, c in enumerate(claims):
            devices = ",".join(f"{d['driver']}/{d['pool']}/{d['device']}" + _consumed(d) for d in c["devices"]) \
                if c else "-"
            first = i == 0
            rows.append((p["pod"] if first else "", (p["tenant"] or "-") if first else "",
                         (p["node"] or "-") if first else "", c["claim"] if c else "-", devices,
                         (p["reason"] or "") if first else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"DRA claims, allocated as vramfit's allocator would (policy {s['policy']}, online, queue order):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows]
    lines += ["", f"DRA: allocated {s['allocated']}, pending {s['unallocated']}, GPUs used {s['gpus_used']}/"
                  f"{s['gpus_total']}, stranded VRAM {s['stranded_vram_mib']} MiB, free VRAM {s['free_vram_mib']} MiB"]
    return lines


def _consumed(device: dict[str, Any]) -> str:
    mem = (device.get("consumed") or {}).get("memory")
    return f" ({mem} shared)" if mem else ""


def placement_json(d: Decision) -> dict[str, Any]:
    gpus = [g.to_json() for g in d.assignment.gpus] if d.assignment else []
    return {"pod": d.pod.key, "tenant": d.pod.tenant, "vram_mib": d.pod.vram_mib, "gpu_count": d.pod.gpu_count,
            "node": d.node, "gpus": gpus, "reason": d.reason}


def format_table(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    if doc.get("pods_given", True):
        rows = [("POD", "TENANT", "VRAM/GPU", "NODE", "UNITS", "WHY PENDING")]
        for p in doc["placements"]:
            units = ",".join(f"gpu{g['index']}" + (f":{g['mig']}" if g["mig"] else "") for g in p["gpus"])
            vram = f"{p['vram_mib']} MiB" + (f" x{p['gpu_count']}" if p["gpu_count"] > 1 else "")
            rows.append((p["pod"], p["tenant"], vram, p["node"] or "-", units or "-", p["reason"] or ""))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows]
        s = doc["summary"]
        lines.append("")
        lines.append(f"policy {s['policy']}{_how(s)}: placed {s['placed']}, pending {s['unplaced']}, GPUs used "
                     f"{s['gpus_used']}/{s['gpus_total']}, stranded VRAM {s['stranded_vram_mib']} MiB, "
                     f"free VRAM {s['free_vram_mib']} MiB")
    elif not doc.get("dra") or doc["summary"].get("gpus_total"):
        s = doc["summary"]
        lines.append(f"cluster: GPUs used {s['gpus_used']}/{s['gpus_total']}, stranded VRAM "
                     f"{s['stranded_vram_mib']} MiB, free VRAM {s['free_vram_mib']} MiB")
    try:
        from vramfit.whatif_solvers import format_solver_tables
    except ModuleNotFoundError as err:
        if err.name != "vramfit.whatif_solvers":
            raise
    else:
        solver = format_solver_tables(doc)
        if solver:
            lines += ["", *solver]
    if "usage" in doc.get("summary", {}):
        lines += ["", *format_usage(doc)]
    if doc.get("dra"):
        lines += ["", *format_dra(doc["dra"])] if lines else format_dra(doc["dra"])
    return "\n".join(line.rstrip() for line in lines)


def _how(s: dict[str, Any]) -> str:
    """How the answer was reached, as `vramfit serve` would reach it (config `planning`)."""
    if s.get("planning") == "queue":
        return (f", queue planned then followed as `vramfit serve` does (plan {s['plan_status']}, "
                f"{s['plan_solve_s']} s; by plan {s['by_plan']}, fallback {s['fallback']}; the online policy "
                f"alone places {s['online_placed']})")
    if s.get("planning") == "off":
        return " online, pod by pod, no queue plan"
    return ""


def run(args: argparse.Namespace) -> int:
    try:
        _check_flags(args)
        doc = _answer(args)
    except (CliError, InputError) as err:
        print(f"vramfit whatif: {err}", file=sys.stderr)
        return 2
    # Warnings first, on stderr: they say what the answer below does not account for.
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        for w in doc.get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
        print(format_table(doc))
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """CliError for flags that do not go together: the solvers' own (when installed), and a question that
    needs pods to place asked without --pods."""
    try:
        from vramfit.whatif_solvers import check_flags
    except ModuleNotFoundError as err:
        if err.name != "vramfit.whatif_solvers":
            raise
    else:
        check_flags(args)
    check_usage_flags(args)
    if args.pods is not None:
        return
    # Capacity is about the cluster as it is; the other answers are about placing given pods
    # (--repartition beside --capacity alone means capacity after re-partition). Without either, the
    # snapshot's own DRA pods may be the question (checked once it is read, `_answer`).
    capacity_only = getattr(args, "capacity", None) is not None
    asking = [flag for flag, wants in (("--optimal", getattr(args, "optimal", False)),
                                       ("--queue", getattr(args, "queue", False)),
                                       ("--repartition", getattr(args, "repartition", False)
                                        and not capacity_only)) if wants]
    if asking:
        raise CliError(f"--pods: required by {' and '.join(asking)} (only --capacity answers without pods to "
                       "place)")


def _no_question(args: argparse.Namespace, dra: DraObjects | None) -> CliError | None:
    """Without --pods, --capacity, --usage or pending DRA pods in the snapshot there is nothing to answer."""
    if args.pods is not None or getattr(args, "capacity", None) is not None or wants_usage(args) or _dra_pods(dra):
        return None
    return CliError("--pods: required (only --capacity, --usage, or a snapshot with pods waiting for DRA claims, "
                    "answers without pods to place)")


def _dra_pods(dra: DraObjects | None) -> bool:
    return dra is not None and bool(dra.pending or dra.waiting)


def _answer(args: argparse.Namespace) -> dict[str, Any]:
    """The what-if document: placements (or the cluster as it is), summary, warnings, nodes counted, and the
    solvers' answers when asked."""
    catalog = load_catalog_arg(args.catalog)
    snap = load_snapshot(args.snapshot, catalog, relax_tenancy=args.relax_tenancy)
    state, warnings = snap.state, snap.warnings
    nodes, node_warnings = count_served(state, snap.unserved, args.snapshot, strict=False)
    warnings += node_warnings
    missing = _no_question(args, snap.dra)
    if missing is not None:
        raise missing
    dra_doc = place_dra(state, snap.dra, snap.ledger, args.policy or DEFAULT_POLICY) \
        if snap.dra is not None and _dra_pods(snap.dra) else None
    drop_dra_nodes(state, snap.dra)
    pending = (load_pending(args.pods, warnings, snap.tenancy, catalog, state) if args.pods is not None
               else [])
    base = state.copy() if _wants_solvers(args) else None
    usage_base = state.copy() if wants_usage(args) else None
    if args.pods is not None:
        doc = placed_on(args, state, pending)
    else:
        # --capacity alone: nothing to place, the cluster as it is.
        doc = {"placements": [], "summary": cluster_summary(state), "pods_given": False}
    doc["warnings"] = warnings
    doc["nodes"] = nodes
    if dra_doc is not None:
        doc["dra"] = dra_doc
    if base is not None:
        from vramfit.whatif_solvers import run_solvers

        for key, value in run_solvers(args, base, pending, doc, catalog).items():
            if key == "summary":
                doc["summary"].update(value)
            else:
                doc[key] = value
    if usage_base is not None:
        _add_usage(doc, args, usage_base, state, pending, snap.objects)
    return doc


def _add_usage(doc: dict[str, Any], args: argparse.Namespace, base: ClusterState, before: ClusterState,
               pending: list[PodDemand], objects: list[dict[str, Any]]) -> None:
    """--usage / --usage-from-nodes: the re-plan with right-sized requests beside the answer."""
    peaks = read_peaks(args, objects, doc["warnings"])
    answer = right_size(args, lambda st, pods: placed_on(args, st, pods), base, before, pending, peaks,
                        doc["warnings"])
    for key, value in answer.items():
        if key == "summary":
            doc["summary"].update(value)
        else:
            doc[key] = value


def placed_on(args: argparse.Namespace, state: ClusterState, pending: list[PodDemand]) -> dict[str, Any]:
    """The pods placed on `state` (mutated) as `vramfit serve` would place them (queue planned unless
    --online)."""
    limit = None
    if not args.online:
        from vramfit.whatif_solvers import _time_limit

        limit = _time_limit(args)
    return simulate(state, pending, args.policy or DEFAULT_POLICY, planning=not args.online, time_limit=limit)


def cluster_summary(state: ClusterState) -> dict[str, Any]:
    """The summary's cluster figures, for a run with no pods to place."""
    present = state.present
    return {"gpus_used": state.gpus_used(), "gpus_total": int(present.sum()),
            "stranded_vram_mib": state.stranded_mib(), "free_vram_mib": int(state.pool_free[present].sum())}


def _wants_solvers(args: argparse.Namespace) -> bool:
    return any(getattr(args, flag, None) for flag in ("optimal", "capacity", "repartition", "queue"))
