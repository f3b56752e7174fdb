"""`vramfit whatif` solver flags: --optimal, --capacity, --repartition (CP-SAT, packing.optimal & co).

`vramfit/whatif.py` adds these arguments to its parser and, when any is set, calls `run_solvers` with the
cluster as it was before the online policy ran; the keys returned are merged into the what-if JSON
(`summary` into the summary, the rest at top level).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from packing.capacity import capacity, shape
from packing.catalog import Catalog
from packing.model import Assignment, InputError, Isolation, PodDemand
from packing.optimal import solve_optimal
from packing.quantity import quantity_to_mib
from packing.repartition import plan_repartition
from packing.state import ClusterState

DEFAULT_TIME_LIMIT = 10.0
_BARE_NUMBER = re.compile(r"^\s*\d+\s*$")


def add_solver_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("solver (OR-Tools CP-SAT)")
    g.add_argument("--optimal", action="store_true",
                   help="also place the pending pods optimally (most pods, then fewest GPUs opened, then least "
                        "stranded VRAM) and compare with the online policy")
    g.add_argument("--time-limit", metavar="SECONDS", default=None,
                   help=f"solver time limit per question (default {DEFAULT_TIME_LIMIT:g}); unproven answers report "
                        "their bound and gap")
    g.add_argument("--capacity", metavar="QUANTITY", default=None,
                   help="how many more pods of this VRAM per GPU fit now, per node and in total "
                        "(a Kubernetes quantity such as 14Gi, or a bare number of MiB)")
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
    try:
        mib = int(raw) if _BARE_NUMBER.match(str(raw)) else quantity_to_mib(raw)
    except (ValueError, TypeError, ArithmeticError):
        raise InputError("command line", "--capacity",
                         f"expected a quantity such as 14Gi or a number of MiB, got {raw!r}") from None
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


def _check_flags(args: argparse.Namespace) -> None:
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
    _check_flags(args)
    limit = _time_limit(args)
    out: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    if getattr(args, "optimal", False):
        res = solve_optimal(state, pending, time_limit=limit)
        online_summary = online.get("summary", {})
        online_placed = int(online_summary.get("placed", 0))
        summary["optimal"] = res.optimal
        summary["bound"] = res.bound
        summary["gap"] = round(res.gap, 6)
        summary["online_vs_optimal"] = {
            "policy": online_summary.get("policy"),
            "online_placed": online_placed,
            "optimal_placed": res.placed,
            "extra_pods_placed": res.placed - online_placed,
            "online_gpus_used": online_summary.get("gpus_used"),
            "optimal_gpus_used": res.state.gpus_used() if res.state is not None else None,
            "online_stranded_vram_mib": online_summary.get("stranded_vram_mib"),
            "optimal_stranded_vram_mib": res.stranded_vram_mib,
            "optimal_gpus_opened": res.gpus_opened,
            "solver_wall_s": round(res.wall_s, 3),
            "stages": [{"name": s.name, "value": s.value, "bound": s.bound, "status": s.status} for s in res.stages],
        }
        out["placements_optimal"] = placements_json(pending, res.placements, "not placed by the optimal solution")
    if getattr(args, "capacity", None) is not None:
        probe = capacity_shape(args)
        cap = capacity(state, probe).to_json()
        cap["shape"] = {"vram_mib": probe.vram_mib, "gpus": probe.gpu_count, "tenant": probe.tenant,
                        "isolation": probe.isolation.value}
        if getattr(args, "repartition", False):
            cap["after_repartition"] = capacity(state, probe, repartition=True, catalog=catalog).to_json()
        out["capacity"] = cap
    if getattr(args, "repartition", False):
        plan = plan_repartition(state, pending, catalog, time_limit=limit)
        out["plan"] = [e.to_json() for e in plan.plan]
        drained_pods = [h.pod for k in plan.drained if (h := state.holder(k)) is not None]
        out["placements_after_plan"] = placements_json(pending + drained_pods, plan.placements,
                                                       "does not fit even after the plan")
        out["mig_parted"] = plan.mig_parted
        summary["repartition"] = plan.summary()
    if summary:
        out["summary"] = summary
    return out
