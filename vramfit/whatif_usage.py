"""`vramfit whatif --usage PEAKS.csv` / `--usage-from-nodes`: right-sizing by measured peaks.

Each listed pod's VRAM request (per GPU) becomes its peak plus `--margin` percent, rounded up to whole MiB and
never below 1 MiB. The listed pods that run in the snapshot are released and placed again with that request
(first, so a running pod is never pushed out by a pending one), then the `--pods` (their request right-sized
too when listed), through the same placement as the answer above it (`vramfit.whatif.simulate`: the queue plan
and follow rule, or the online policy with --online), on a copy of the cluster as it was before the pending pods.
Every unit is booked through `ClusterState.allocate`, so every rule holds in the re-plan. A running pod the
re-plan cannot place again is put back where it runs, on its old request, and said so.

The CSV (header `pod,peak_bytes`; `pod` is namespace/name, `peak_bytes` the most the pod used on any one of its
GPUs) is what the node agent measures (docs/usage.md); `--usage-from-nodes` reads the same peaks from the
snapshot's Node annotations `vramfit.io/pod-usage` (packing/k8s/pod_usage.py).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from kubeio.files import CliError, input_error
from packing.k8s.pod_usage import NodeUsageReport, node_usage_reports
from packing.model import InputError, PodDemand
from packing.state import ClusterState, PlacementError

MIB = 1 << 20
DEFAULT_MARGIN_PERCENT = 10
CSV_FIELDS = ("pod", "peak_bytes")


@dataclass(frozen=True)
class Peak:
    """One pod's measured peak VRAM per GPU, and where it was read (for messages)."""

    pod: str  # namespace/name
    peak_bytes: int
    source: str  # "peaks.csv line 3" or "node n1"


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("right-sizing by measured use")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--usage", metavar="PEAKS.csv",
                     help="re-plan with each listed pod's request set to its peak plus --margin (CSV header "
                          "`pod,peak_bytes`, pod as namespace/name, peak per GPU in bytes) and report what it frees")
    src.add_argument("--usage-from-nodes", action="store_true",
                     help="as --usage, the peaks read from the snapshot's Node annotations vramfit.io/pod-usage")
    g.add_argument("--margin", metavar="PERCENT", default=None,
                   help=f"headroom over the peak, in percent (`10` or `10%%`; default {DEFAULT_MARGIN_PERCENT})")


def wants_usage(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "usage", None) or getattr(args, "usage_from_nodes", False))


def check_usage_flags(args: argparse.Namespace) -> None:
    if getattr(args, "margin", None) is not None and not wants_usage(args):
        raise InputError("command line", "--margin", "only applies with --usage or --usage-from-nodes")
    margin_percent(args)


def margin_percent(args: argparse.Namespace) -> Fraction:
    """--margin as a percentage (exact: `12.5` is 25/2); InputError names the flag."""
    raw = getattr(args, "margin", None)
    if raw is None:
        return Fraction(DEFAULT_MARGIN_PERCENT)
    text = str(raw).strip().removesuffix("%").strip()
    try:
        value = Fraction(Decimal(text))
    except (InvalidOperation, ValueError):
        raise InputError("command line", "--margin", f"expected a percentage such as 10 or 10%, got {raw!r}") \
            from None
    if value < 0:
        raise InputError("command line", "--margin", f"must not be negative, got {raw!r}")
    return value


def recommend_mib(peak_bytes: int, margin: Fraction) -> int:
    """The request a pod with this peak should make: peak x (1 + margin %), up to whole MiB, at least 1 MiB.
    Rounding up keeps it at or above the peak whatever the margin."""
    return max(1, math.ceil(Fraction(peak_bytes) * (1 + margin / 100) / MIB))


# ---------------------------------------------------------------------------------------------- reading
def read_usage_csv(path: str) -> list[Peak]:
    """The peaks of a usage CSV; CliError names the file, the line and the field at fault."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [(n, row) for n, row in _numbered(csv.reader(f)) if any(c.strip() for c in row)]
    except OSError as err:
        raise CliError(f"{path}: cannot read: {err.strerror or err}") from None
    except (csv.Error, UnicodeDecodeError) as err:
        raise CliError(f"{path}: not a CSV file: {err}") from None
    if not rows:
        raise CliError(f"{path}: line 1: header: missing (expected `{','.join(CSV_FIELDS)}`)")
    line, header = rows[0]
    names = [c.strip().lower() for c in header]
    missing = [f for f in CSV_FIELDS if f not in names]
    if missing:
        raise CliError(f"{path}: line {line}: header: missing column {', '.join(missing)} (expected "
                       f"`{','.join(CSV_FIELDS)}`, got {','.join(header)!r})")
    col = {f: names.index(f) for f in CSV_FIELDS}
    peaks: list[Peak] = []
    seen: dict[str, int] = {}
    for n, row in rows[1:]:
        peak = _csv_peak(path, n, row, col)
        if peak.pod in seen:
            raise CliError(f"{path}: line {n}: field pod: {peak.pod} is already on line {seen[peak.pod]}")
        seen[peak.pod] = n
        peaks.append(peak)
    return peaks


def _numbered(reader: Any) -> Any:
    for row in reader:
        yield reader.line_num, row


def _csv_peak(path: str, line: int, row: list[str], col: dict[str, int]) -> Peak:
    def cell(field: str) -> str:
        i = col[field]
        return row[i].strip() if i < len(row) else ""

    pod = cell("pod")
    ns, _, name = pod.partition("/")
    if not ns or not name or "/" in name:
        raise CliError(f"{path}: line {line}: field pod: expected namespace/name, got {pod!r}")
    raw = cell("peak_bytes")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0:
        raise CliError(f"{path}: line {line}: field peak_bytes: expected a non-negative number of bytes, "
                       f"got {raw!r}")
    return Peak(pod, math.ceil(value), f"{path} line {line}")


def peaks_from_nodes(objects: list[dict[str, Any]], path: str, warnings: list[str]) -> list[Peak]:
    """Each pod's peak per GPU from the Nodes' `vramfit.io/pod-usage` (its containers' peaks on one unit added
    up, then the largest unit). A pod with an unknown peak on any unit is left out, with a warning."""
    def refuse(err: InputError) -> None:
        raise input_error(path, err) from None

    peaks: list[Peak] = []
    for name, report in node_usage_reports(objects, refuse):
        where = f"node {name}"
        if report.truncated:
            warnings.append(f"{path}: {where}: its usage report is truncated: pods left out of it are not "
                            "right-sized")
        peaks += _report_peaks(report, where, warnings)
    if not peaks:
        warnings.append(f"{path}: no Node carries a usable vramfit.io/pod-usage: nothing to right-size")
    return peaks


def _report_peaks(report: NodeUsageReport, where: str, warnings: list[str]) -> list[Peak]:
    per_unit: dict[str, dict[str, int | None]] = {}
    for u in report.pods:
        units = per_unit.setdefault(u.key, {})
        unit = f"{u.gpu_uuid}|{u.unit}"
        before = units.get(unit, 0)
        units[unit] = None if before is None or u.peak_bytes is None else before + u.peak_bytes
    out = []
    for pod, units in per_unit.items():
        known = [v for v in units.values() if v is not None]
        if len(known) < len(units):
            warnings.append(f"{where}: pod {pod}: peak unknown (NVML gave no figure): not right-sized")
            continue
        out.append(Peak(pod, max(known), where))
    return out


# ---------------------------------------------------------------------------------------------- the re-plan
@dataclass
class _Listed:
    peak: Peak
    demand: PodDemand
    running: bool
    booked_mib: int | None


Placer = Callable[[ClusterState, list[PodDemand]], dict[str, Any]]  # places pods on the state (mutated): a doc


def right_size(args: argparse.Namespace, place: Placer, base: ClusterState, before: ClusterState,
               pending: list[PodDemand], peaks: list[Peak], warnings: list[str]) -> dict[str, Any]:
    """The right-sizing answer: `recommendations`, `placements_after_usage` and `summary.usage`. `base` is the
    cluster before the pending pods (not modified), `before` the cluster after the answer placed them, `place`
    the answer's own placement."""
    margin = margin_percent(args)
    listed = _listed(base, pending, peaks, warnings)
    resized = {k: replace(x.demand, vram_mib=recommend_mib(x.peak.peak_bytes, margin)) for k, x in listed.items()}
    after = base.copy()
    running = [resized[k] for k, x in listed.items() if x.running]
    for p in running:
        after.release(p.key)
    rows = _place(place, after, running)
    rows = [_put_back(after, base, r, warnings) for r in rows]
    queue = [resized.get(p.key, p) for p in pending]
    rows += [{**r, "status": "pending"} for r in _place(place, after, queue)]
    pending_placed = [r for r in rows if r["status"] == "pending" and r["node"]]
    summary = {"margin_percent": float(margin), "source": _source(args),
               "before": _figures(before, sum(1 for p in pending if before.holder(p.key) is not None)),
               "after": _figures(after, len(pending_placed))}
    return {"recommendations": [_recommendation(x, resized[k]) for k, x in listed.items()],
            "placements_after_usage": rows, "summary": {"usage": summary}}


def _listed(base: ClusterState, pending: list[PodDemand], peaks: list[Peak], warnings: list[str]
            ) -> dict[str, _Listed]:
    by_key = {p.key: p for p in pending}
    out: dict[str, _Listed] = {}
    for peak in peaks:
        held = base.holder(peak.pod)
        if held is not None:
            booked = max(g.vram_mib for g in held.assignment.gpus) if held.assignment.gpus else None
            out[peak.pod] = _Listed(peak, held.pod, True, booked)
        elif peak.pod in by_key:
            out[peak.pod] = _Listed(peak, by_key[peak.pod], False, None)
        else:
            warnings.append(f"{peak.source}: pod {peak.pod} neither runs in the snapshot nor is in --pods: ignored")
    return out


def _place(place: Placer, state: ClusterState, pods: list[PodDemand]) -> list[dict[str, Any]]:
    if not pods:
        return []
    rows: list[dict[str, Any]] = place(state, pods)["placements"]
    return [{**r, "status": "running"} for r in rows]


def _put_back(after: ClusterState, base: ClusterState, row: dict[str, Any], warnings: list[str]
              ) -> dict[str, Any]:
    """A running pod the re-plan left out goes back where it runs, on its old request, if its units are free."""
    if row["node"]:
        return row
    held = base.holder(row["pod"])
    assert held is not None
    try:
        after.allocate(held.pod, held.assignment)
    except PlacementError as err:
        warnings.append(f"pod {row['pod']}: right-sized, it fits nowhere, and its old units are taken: {err}")
        return row
    warnings.append(f"pod {row['pod']}: right-sized, it fits nowhere: kept where it runs, on its old request")
    return {**row, "node": held.assignment.node, "gpus": [g.to_json() for g in held.assignment.gpus],
            "vram_mib": held.pod.vram_mib, "reason": "kept where it runs, on its old request"}


def _figures(state: ClusterState, pending_placed: int) -> dict[str, Any]:
    present = state.present
    return {"pods_placed": len(state.holders()), "pending_placed": pending_placed, "gpus_used": state.gpus_used(),
            "gpus_total": int(present.sum()), "stranded_vram_mib": state.stranded_mib(),
            "free_vram_mib": int(state.pool_free[present].sum()),
            "booked_vram_mib": sum(g.vram_mib for h in state.holders() for g in h.assignment.gpus)}


def _recommendation(x: _Listed, resized: PodDemand) -> dict[str, Any]:
    return {"pod": x.demand.key, "status": "running" if x.running else "pending", "gpu_count": x.demand.gpu_count,
            "requested_mib": x.demand.vram_mib, "booked_mib": x.booked_mib, "peak_bytes": x.peak.peak_bytes,
            "peak_mib": math.ceil(x.peak.peak_bytes / MIB), "recommended_mib": resized.vram_mib,
            "freed_mib": (x.demand.vram_mib - resized.vram_mib) * x.demand.gpu_count, "source": x.peak.source}


def _source(args: argparse.Namespace) -> str:
    usage = getattr(args, "usage", None)
    return str(usage) if usage else "vramfit.io/pod-usage"


def read_peaks(args: argparse.Namespace, objects: list[dict[str, Any]], warnings: list[str]) -> list[Peak]:
    if getattr(args, "usage", None):
        return read_usage_csv(args.usage)
    return peaks_from_nodes(objects, args.snapshot, warnings)


# ---------------------------------------------------------------------------------------------- table
def format_usage(doc: dict[str, Any]) -> list[str]:
    from vramfit.whatif_solvers import _table

    u = doc["summary"]["usage"]
    b, a = u["before"], u["after"]
    lines = [f"== right-sized by measured peaks ({u['source']}, margin {u['margin_percent']:g}%) =="]
    figures = [("pods placed", "pods_placed"), ("pending pods placed", "pending_placed"), ("GPUs used", "gpus_used"),
               ("stranded VRAM (MiB)", "stranded_vram_mib"), ("free VRAM (MiB)", "free_vram_mib"),
               ("booked VRAM (MiB)", "booked_vram_mib")]
    lines += _table([("", "before", "after"), *((label, str(b[k]), str(a[k])) for label, k in figures)])
    if not doc["recommendations"]:
        return [*lines, "no listed pod runs in the snapshot or is in --pods"]
    after = {r["pod"]: r for r in doc["placements_after_usage"]}
    rows: list[tuple[str, ...]] = [("POD", "STATUS", "REQUEST MiB", "PEAK MiB", "RECOMMENDED MiB", "FREED MiB",
                                    "NODE AFTER")]
    for r in doc["recommendations"]:
        rows.append((r["pod"], r["status"], str(r["requested_mib"]), str(r["peak_mib"]), str(r["recommended_mib"]),
                     str(r["freed_mib"]), (after.get(r["pod"]) or {}).get("node") or "-"))
    return [*lines, "", *_table(rows, right=2),
            "request and peak are per GPU; freed = (request - recommended) x GPUs"]
