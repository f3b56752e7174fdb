"""`vramfit whatif` solver flags: --optimal, --capacity, --repartition (CP-SAT, packing.solvers.optimal & co).

`vramfit/whatif.py` adds these arguments to its parser and, when any is set, calls `run_solvers` with the
cluster as it was before the online policy ran; the keys returned are merged into the what-if JSON
(`summary` into the summary, the rest at top level).
"""

from __future__ import annotations

import argparse
from typing import Any

from packing.catalog import Catalog
from packing.k8s.quantity import vram_to_mib
from packing.model import Assignment, InputError, Isolation, PodDemand
from packing.place import Decision, unplaced_reason
from packing.solvers.capacity import capacity, shape
from packing.solvers.optimal import solve_optimal
from packing.solvers.repartition import plan_repartition
from packing.state import ClusterState

DEFAULT_TIME_LIMIT = 10.0

# Two VRAM-waste figures, kept apart by name because they measure different things (both in MiB):
STRANDED_MEANS = ("on every GPU in use after placing (running pods included), VRAM that no pod holds and no "
                  "new pod can get (ClusterState.stranded_mib: the figure of the summary, the demo and /state)")
SLACK_MEANS = ("the solver's third objective: over the pending pods it placed only, the unit each got (whole "
               "GPU, MIG instance, MPS share) minus the VRAM it asked; time-sliced GPUs count 0")
# packing.solvers.optimal calls its third stage `stranded_vram_mib`; it is the slack above, so it is renamed here.
_STAGE_NAMES = {"stranded_vram_mib": "placed_unit_slack_mib"}


def add_solver_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("solver (OR-Tools CP-SAT)")
    g.add_argument("--optimal", action="store_true",
                   help="also place the pending pods optimally (most pods, then fewest GPUs opened, then least VRAM "
                        "left unused inside the units handed out: each unit's memory minus its pod's VRAM) and "
                        "compare with the online policy")
    g.add_argument("--queue", action="store_true",
                   help="also replay the pending pods through the extender's cycle with the queue visible: plan "
                        "the whole pending list (packing.planning.queue_plan), then place each pod in order by the "
                        "live extender's follow-the-plan rule (packing/planning/follow.py)")
    g.add_argument("--time-limit", metavar="SECONDS", default=None,
                   help=f"solver time limit per question (default {DEFAULT_TIME_LIMIT:g}); unproven answers report "
                        "their bound and gap")
    g.add_argument("--capacity", metavar="QUANTITY", default=None,
                   help="how many more pods of this VRAM per GPU fit now, per node and in total (the "
                        "vramfit.io/vram rule: 14Gi, or a bare number of MiB); needs no --pods")
    g.add_argument("--tenant", metavar="T", default=None, help="tenant of the --capacity shape (default: default)")
    g.add_argument("--isolation", metavar="L", default=None,
                   help="isolation of the --capacity shape: hardware, process or none (default none)")
    g.add_argument("--gpus", metavar="N", default=None, help="GPUs per pod of the --capacity shape (default 1)")
    g.add_argument("--repartition", action="store_true",
                   help="plan new MIG layouts so the pending pods fit (fewest drained pods, then fewest GPUs "
                        "reconfigured); with --capacity also report capacity after the best re-partition")


def _time_limit(args: argparse.Namespace) -> float:
    raw = getattr(args, "time_limit", None)
    if raw is None:
        return DEFAULT_TIME_LIMIT
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise InputError("command line", "--time-limit", f"expected a number of seconds, got {raw!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise InputError("command line", "--time-limit", f"must be a positive number of seconds, got {raw!r}")
    return value


def capacity_shape(args: argparse.Namespace) -> PodDemand:
    """The --capacity pod shape from the flags; InputError names the flag at fault."""
    raw = args.capacity
    # The one rule pods are read by (packing.k8s.quantity): `--capacity 14Gi` asks about the pods that say 14Gi.
    try:
        mib = vram_to_mib(str(raw).strip())
    except (ValueError, TypeError, ArithmeticError) as err:
        raise InputError("command line", "--capacity",
                         f"expected a quantity such as 14Gi or a number of MiB, got {raw!r}: {err}") from None
    if mib <= 0:
        raise InputError("command line", "--capacity", f"must be more than 0 MiB, got {raw!r}")
    gpus_raw = getattr(args, "gpus", None)
    gpus = 1
    if gpus_raw is not None:
        try:
            gpus = int(str(gpus_raw).strip())
        except ValueError:
            raise InputError("command line", "--gpus", f"expected a whole number of GPUs, got {gpus_raw!r}") from None
        if gpus < 1:
            raise InputError("command line", "--gpus", f"must be at least 1, got {gpus_raw!r}")
    iso_raw = getattr(args, "isolation", None)
    iso = Isolation.NONE
    if iso_raw is not None:
        try:
            iso = Isolation(str(iso_raw).strip().lower())
        except ValueError:
            raise InputError("command line", "--isolation",
                             f"expected one of {', '.join(i.value for i in Isolation)}, got {iso_raw!r}") from None
    tenant = getattr(args, "tenant", None)
    if tenant is not None and not str(tenant).strip():
        raise InputError("command line", "--tenant", "must not be empty")
    return shape(mib, gpus=gpus, tenant=str(tenant).strip() if tenant else "default", isolation=iso)


def check_flags(args: argparse.Namespace) -> None:
    """Flags that answer nothing in this combination are usage errors (exit 2), never silently ignored."""
    _check_shape_flags(args)
    # A usage re-plan (--usage, --usage-from-nodes) places pods too: the placement flags apply to it.
    pods = getattr(args, "pods", None) is not None or bool(getattr(args, "usage", None)) \
        or bool(getattr(args, "usage_from_nodes", False))
    if not pods:
        for flag in ("policy", "online"):
            if getattr(args, flag, None):
                raise InputError("command line", f"--{flag}", "only applies with --pods (pods to place) or a usage "
                                 "re-plan (--usage, --usage-from-nodes)")
    solves = pods and (not getattr(args, "online", False) or any(
        getattr(args, flag, False) for flag in ("optimal", "queue", "repartition")))
    if getattr(args, "time_limit", None) is not None and not solves:
        raise InputError("command line", "--time-limit",
                         "only applies when a solver runs: the queue plan (the default with --pods), --optimal, "
                         "--queue or --repartition with --pods")


def _check_shape_flags(args: argparse.Namespace) -> None:
    if getattr(args, "capacity", None) is None:
        for flag in ("tenant", "isolation", "gpus"):
            if getattr(args, flag, None) is not None:
                raise InputError("command line", f"--{flag}", "only applies with --capacity")


def placements_json(pending: list[PodDemand], placements: dict[str, Assignment | None], why: str
                    ) -> list[dict[str, Any]]:
    out = []
    for p in pending:
        asg = placements.get(p.key)
        out.append({"pod": p.key, "tenant": p.tenant, "vram_mib": p.vram_mib, "gpu_count": p.gpu_count,
                    "node": asg.node if asg else None, "gpus": [g.to_json() for g in asg.gpus] if asg else [],
                    "reason": None if asg else why})
    return out


def run_solvers(args: argparse.Namespace, state: ClusterState, pending: list[PodDemand], online: dict[str, Any],
                catalog: Catalog) -> dict[str, Any]:
    """Answer the solver flags on `state` (the cluster before the online run; not modified)."""
    _check_shape_flags(args)
    limit = _time_limit(args)
    out: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    if getattr(args, "optimal", False):
        res = solve_optimal(state, pending, time_limit=limit)
        online_summary = online.get("summary", {})
        online_placed = int(online_summary.get("placed", 0))
        used_before = state.gpus_used()
        stages = [{"name": _STAGE_NAMES.get(st.name, st.name), "value": st.value, "bound": st.bound,
                   "status": st.status} for st in res.stages]
        slack = next((st["value"] for st in stages if st["name"] == "placed_unit_slack_mib"), None)
        summary["optimal"] = res.optimal
        summary["bound"] = res.bound
        summary["gap"] = round(res.gap, 6)
        online_used = online_summary.get("gpus_used")
        summary["online_vs_optimal"] = {
            "policy": online_summary.get("policy"),
            "planning": online_summary.get("planning", "off"),  # "queue": the default answer, plan and follow
            "online_placed": online_placed,
            "optimal_placed": res.placed,
            "extra_pods_placed": res.placed - online_placed,
            "online_gpus_used": online_used,
            "optimal_gpus_used": res.state.gpus_used() if res.state is not None else None,
            # GPUs opened = idle before the pending pods, in use after them (the solver's second objective).
            "online_gpus_opened": online_used - used_before if isinstance(online_used, int) else None,
            "optimal_gpus_opened": res.gpus_opened,
            "online_stranded_vram_mib": online_summary.get("stranded_vram_mib"),
            "optimal_stranded_vram_mib": res.stranded_vram_mib,
            "optimal_placed_unit_slack_mib": slack,
            "definitions": {"stranded_vram_mib": STRANDED_MEANS, "placed_unit_slack_mib": SLACK_MEANS},
            "solver_wall_s": round(res.wall_s, 3),
            "stages": stages,
        }
        out["placements_optimal"] = placements_json(pending, res.placements, "not placed by the optimal solution")
    if getattr(args, "queue", False):
        out["placements_queue"], summary["queue"] = queue_replay(state, pending, online, limit)
    if getattr(args, "capacity", None) is not None:
        probe = capacity_shape(args)
        cap = capacity(state, probe).to_json()
        cap["shape"] = {"vram_mib": probe.vram_mib, "gpus": probe.gpu_count, "tenant": probe.tenant,
                        "isolation": probe.isolation.value}
        if getattr(args, "repartition", False):
            cap["after_repartition"] = capacity(state, probe, repartition=True, catalog=catalog).to_json()
        out["capacity"] = cap
    if getattr(args, "repartition", False) and pending:
        plan = plan_repartition(state, pending, catalog, time_limit=limit)
        out["plan"] = [_plan_entry(state, e.to_json()) for e in plan.plan]
        drained_pods = [h.pod for k in plan.drained if (h := state.holder(k)) is not None]
        out["placements_after_plan"] = placements_json(pending + drained_pods, plan.placements,
                                                       "does not fit even after the plan")
        out["mig_parted"] = plan.mig_parted
        summary["repartition"] = plan.summary()
    if summary:
        out["summary"] = summary
    return out


def plan_and_follow(state: ClusterState, pending: list[PodDemand], online: dict[str, Any], limit: float
                    ) -> dict[str, Any]:
    """What `vramfit serve` does with its default config (`planning: true`), on `state` (mutated): one plan of
    the whole pending list, then each pod placed in order by `packing.planning.follow`. The what-if document: its
    placements (each with `via` and, when not placed, why), its summary, and the online policy's placements
    beside it (`placements_online`; `online` is the online policy's document on the same cluster)."""
    from vramfit.summary import summary_json

    policy_name = str(online["summary"]["policy"])
    rows, decisions, plan = _follow(state, pending, policy_name, limit)
    summary = summary_json(state, decisions, policy_name)
    summary.update({"planning": "queue", "plan_status": plan.status, "plan_solve_s": round(plan.solve_s, 3),
                    "by_plan": sum(1 for r in rows if r["via"] == "plan"),
                    "fallback": sum(1 for r in rows if r["via"] == "fallback"),
                    "online_placed": int(online["summary"]["placed"])})
    return {"placements": rows, "summary": summary, "placements_online": online["placements"]}


def _follow(state: ClusterState, pending: list[PodDemand], policy_name: str, limit: float
            ) -> tuple[list[dict[str, Any]], list[Decision], Any]:
    """The pending pods through the extender's cycle with the queue visible, on `state` (mutated): one plan of
    the whole list (in file order: priority, then order as age), then each pod placed by `packing.planning.follow`; a
    pod left out gets the online policy's reason on the cluster as it was at its turn."""
    from packing.planning.follow import place_one
    from packing.planning.queue_plan import QueuedPod, plan_queue
    from packing.policies import get_policy

    policy = get_policy(policy_name)
    # As the extender's planner: the plan scores with a fork of the policy the verbs then place with.
    plan = plan_queue(state, [QueuedPod(p, float(k)) for k, p in enumerate(pending)], time_limit_s=limit,
                      policy=policy)
    rows: list[dict[str, Any]] = []
    decisions: list[Decision] = []
    for p in pending:
        asg, via = place_one(state, p, policy, plan.assignments)
        reason = None if asg is not None else unplaced_reason(state, p, policy.whole_gpu)
        decisions.append(Decision(p, asg.node if asg else None, asg, reason))
        row = placements_json([p], {p.key: asg}, reason or "")[0]
        rows.append({**row, "via": via})
    return rows, decisions, plan


def queue_replay(state: ClusterState, pending: list[PodDemand], online: dict[str, Any], limit: float
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`--queue`: the plan-and-follow answer beside the online policy's, on a copy of `state`."""
    policy_name = str(online.get("summary", {}).get("policy") or "vramfit")
    sim = state.copy()
    rows, _, plan = _follow(sim, pending, policy_name, limit)
    placed = sum(1 for r in rows if r["node"])
    summary = {"policy": policy_name, "plan_status": plan.status, "plan_solve_s": round(plan.solve_s, 3),
               "plan_placed": plan.placed, "placed": placed, "unplaced": len(pending) - placed,
               "online_placed": int(online.get("summary", {}).get("online_placed",
                                                                  online.get("summary", {}).get("placed", 0))),
               "by_plan": sum(1 for r in rows if r["via"] == "plan"),
               "fallback": sum(1 for r in rows if r["via"] == "fallback"),
               "gpus_used": sim.gpus_used(), "stranded_vram_mib": sim.stranded_mib()}
    return rows, summary


def format_queue(doc: dict[str, Any]) -> list[str]:
    q = doc["summary"]["queue"]
    lines = [f"== with the queue visible (plan {q['plan_status']}, {q['plan_solve_s']} s): placed {q['placed']}, "
             f"pending {q['unplaced']} (online alone: {q['online_placed']}); by plan {q['by_plan']}, fallback "
             f"{q['fallback']}; GPUs used {q['gpus_used']}, stranded VRAM {q['stranded_vram_mib']} MiB =="]
    online_nodes = {p["pod"]: p["node"] for p in doc.get("placements_online", doc.get("placements", []))}
    rows: list[tuple[str, ...]] = [("POD", "ONLINE NODE", "QUEUE NODE", "VIA")]
    for p in doc.get("placements_queue", []):
        rows.append((p["pod"], online_nodes.get(p["pod"]) or "-", p["node"] or "-", p["via"]))
    return [*lines, *_table(rows, right=99)]


def _plan_entry(state: ClusterState, entry: dict[str, Any]) -> dict[str, Any]:
    """A plan entry with the GPU's layout today beside the new one (`layout`), as instance refs."""
    gpu = next((g for g in state.node(entry["node"]).gpus if g.index == entry["gpu"]), None)
    entry["old_layout"] = [inst.ref for inst in gpu.mig] if gpu is not None else []
    entry["new_layout"] = [f"{p['profile']}@{p['start']}" for p in entry["layout"]]
    return entry


# ---------------------------------------------------------------------------------------- table format
def _table(rows: list[tuple[str, ...]], right: int = 1) -> list[str]:
    """Columns padded to their widest cell; columns from `right` on are numbers, right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i >= right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def format_optimal(doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    c = s["online_vs_optimal"]
    online = f"queue plan ({c['policy']})" if c.get("planning") == "queue" else f"online ({c['policy']})"
    rows: list[tuple[str, ...]] = [("", online, "optimal"),
                                   ("pods placed", _num(c["online_placed"]), _num(c["optimal_placed"])),
                                   ("GPUs used", _num(c["online_gpus_used"]), _num(c["optimal_gpus_used"])),
                                   ("GPUs opened", _num(c["online_gpus_opened"]), _num(c["optimal_gpus_opened"])),
                                   ("stranded VRAM (MiB)", _num(c["online_stranded_vram_mib"]),
                                    _num(c["optimal_stranded_vram_mib"])),
                                   ("placed-unit slack (MiB)", "-", _num(c["optimal_placed_unit_slack_mib"]))]
    status = ("proven optimal" if s["optimal"] else
              f"not proven within the time limit: at most {s['bound']} pods, gap {s['gap'] * 100:.1f}%")
    stages = ", ".join(f"{st['name']} {st['value']} ({st['status']}, bound {st['bound']})" for st in c["stages"])
    lines = [f"== {online} vs optimal (most pods, then fewest GPUs opened, then least placed-unit slack) ==",
             *_table(rows),
             f"solver: {status}; {c['solver_wall_s']} s; stages: {stages}"]
    online_nodes = {p["pod"]: p["node"] for p in doc.get("placements", [])}
    diff = [(p["pod"], online_nodes.get(p["pod"]) or "-", p["node"] or "-") for p in doc.get("placements_optimal", [])
            if (online_nodes.get(p["pod"]) is None) != (p["node"] is None)]
    if diff:
        lines += ["", *_table([("POD", "ONLINE NODE", "OPTIMAL NODE"), *diff], right=3)]
    lines += [f"stranded VRAM: {STRANDED_MEANS}.", f"placed-unit slack: {SLACK_MEANS}.",
              "GPUs opened: idle before the pending pods, in use after them."]
    if (c["optimal_stranded_vram_mib"] or 0) > (c["online_stranded_vram_mib"] or 0):
        # Not a solver bug: fewer GPUs opened ranks above less waste, and packing tighter can strand more.
        lines.append("the optimum strands more VRAM here: it ranks fewer GPUs opened above less slack, and "
                     "slack is counted on the new pods only")
    return lines


def format_capacity(doc: dict[str, Any]) -> list[str]:
    cap = doc["capacity"]
    sh = cap["shape"]
    after = cap.get("after_repartition")
    head = ("NODE", "FIT NOW", "AFTER RE-PARTITION") if after else ("NODE", "FIT NOW")
    rows: list[tuple[str, ...]] = [head]
    names = sorted(set(cap["nodes"]) | set(after["nodes"] if after else ()))
    for name in names:
        row = (name, str(cap["nodes"].get(name, 0)))
        rows.append((*row, str(after["nodes"].get(name, 0))) if after else row)
    rows.append(("total", str(cap["total"]), str(after["total"])) if after else ("total", str(cap["total"])))
    per = f"{sh['vram_mib']} MiB on each of {sh['gpus']} GPUs" if sh["gpus"] > 1 else f"{sh['vram_mib']} MiB on one GPU"
    when = " (before the --pods are placed)" if doc.get("placements") else ""
    lines = [f"== capacity: more pods of {per} (tenant {sh['tenant']}, isolation "
             f"{sh['isolation']}) that fit now{when} ==", *_table(rows)]
    if after:
        lines.append("after re-partition: each MIG GPU on the layout that fits the most, draining nobody")
    return lines


def format_plan(doc: dict[str, Any]) -> list[str]:
    r = doc["summary"]["repartition"]
    status = "proven optimal" if r["optimal"] else "not proven within the time limit"
    lines = [f"== re-partition plan: placed {r['placed']}, pending {r['unplaced']}, pods to drain {r['drained']}, "
             f"GPUs reconfigured {r['gpus_reconfigured']} ({status}, {r['wall_s']} s) =="]
    if not doc["plan"]:
        return [*lines, "no MIG layout change helps the pending pods"]
    rows: list[tuple[str, ...]] = [("NODE", "GPU", "OLD LAYOUT", "NEW LAYOUT", "PODS TO DRAIN")]
    for e in doc["plan"]:
        rows.append((e["node"], str(e["gpu"]), ",".join(e["old_layout"]) or "-", ",".join(e["new_layout"]) or "-",
                     ",".join(e["drain"]) or "-"))
    lines += _table(rows, right=99)
    for node, config in sorted(doc.get("mig_parted", {}).items()):
        # The config's own header says how to apply it; quote that rather than rebuild the config name.
        command = next((ln.lstrip("# ").strip() for ln in config.splitlines() if "kubectl label node" in ln), "")
        if command:
            lines.append(f"apply on {node}: drain the pods listed, then {command}")
    if doc.get("mig_parted"):
        lines.append("(the mig-parted configs: --format json, key mig_parted)")
    return lines


def format_solver_tables(doc: dict[str, Any]) -> list[str]:
    """The solver answers present in a what-if document, as text sections (empty when none)."""
    sections: list[list[str]] = []
    if "online_vs_optimal" in doc.get("summary", {}):
        sections.append(format_optimal(doc))
    if "queue" in doc.get("summary", {}):
        sections.append(format_queue(doc))
    if "capacity" in doc:
        sections.append(format_capacity(doc))
    if "plan" in doc:
        sections.append(format_plan(doc))
    out: list[str] = []
    for section in sections:
        out += ["", *section] if out else section
    return out
