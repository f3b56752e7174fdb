"""`vramfit inspect`'s per-pod usage: booked, used and peak VRAM per pod as the node agent measured them (the Node
annotation `vramfit.io/pod-usage`, read by packing/k8s/pod_usage.py), pods over their booking flagged, and the
processes no pod claims, per node.

A figure NVML did not give is shown as `unknown`, never 0; a pod vramfit did not book shows `-` as booked.
Per pod, a unit's booking is counted once however many containers use it (each container's entry repeats it),
its containers' use and peaks are added; a pod is over where, on some unit, its known use is above the booking.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from packing.k8s.pod_usage import NodeUsageReport, PodUsage, node_usage_reports
from packing.model import InputError

MIB = 1 << 20
_HEAD = ("POD", "CONTAINER", "GPU", "UNIT", "BOOKED", "USED", "PEAK", "")


@dataclass(frozen=True)
class PodFigures:
    """One pod's use on one node: totals over its units, and each (container, GPU unit) entry."""

    pod: str  # namespace/name
    booked_bytes: int | None  # None: vramfit booked none of its units
    used_bytes: int | None  # None: unknown for some entry
    peak_bytes: int | None
    over_bytes: int  # how far its known use is above the booking, summed over units over it; 0: within
    entries: tuple[PodUsage, ...]


def node_reports(objects: list[dict[str, Any]], warnings: list[str]) -> list[tuple[str, NodeUsageReport]]:
    """(node name, its usage report) for every Node carrying one, by name; a report that cannot be read is a
    warning naming the node and the field (the rest of the view still shows)."""
    def unread(err: InputError) -> None:
        warnings.append(f"{err.obj}: field {err.field_name}: {err.problem}: its usage is not shown")

    return sorted(node_usage_reports(objects, unread), key=lambda nr: nr[0])


def pod_figures(report: NodeUsageReport) -> list[PodFigures]:
    by_pod: dict[str, list[PodUsage]] = {}
    for u in report.pods:
        by_pod.setdefault(u.key, []).append(u)
    return [_figures(key, tuple(us)) for key, us in sorted(by_pod.items())]


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _figures(key: str, entries: tuple[PodUsage, ...]) -> PodFigures:
    units: dict[str, list[PodUsage]] = {}
    for u in entries:
        units.setdefault(f"{u.gpu_uuid}|{u.unit}", []).append(u)
    booked = [b for us in units.values() if (b := _unit_booked(us)) is not None]
    over = sum(_unit_over(us) for us in units.values())
    return PodFigures(key, sum(booked) if booked else None, _sum([u.used_bytes for u in entries]),
                      _sum([u.peak_bytes for u in entries]), over, entries)


def _unit_booked(us: list[PodUsage]) -> int | None:
    known = [u.booked_bytes for u in us if u.booked_bytes is not None]
    return max(known) if known else None


def _unit_over(us: list[PodUsage]) -> int:
    """Known use above the unit's booking (unknown adds nothing, as the agent judges it), or 0."""
    booked = _unit_booked(us)
    used = sum(u.used_bytes or 0 for u in us)
    if any(u.over for u in us) or (booked is not None and used > booked):
        return max(used - (booked or 0), 0)
    return 0


def mib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / MIB:.0f} MiB"


def _booked(nbytes: int | None) -> str:
    return "-" if nbytes is None else mib(nbytes)


def _flag(f: PodFigures) -> str:
    return f"OVER booking by {mib(f.over_bytes)}" if f.over_bytes else ""


def _rows(report: NodeUsageReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for f in pod_figures(report):
        if len(f.entries) == 1:
            u = f.entries[0]
            rows.append((f.pod, u.container, u.gpu_uuid, u.unit, _booked(f.booked_bytes), mib(f.used_bytes),
                         mib(f.peak_bytes), _flag(f)))
            continue
        rows.append((f.pod, f"({len(f.entries)} entries)", "", "", _booked(f.booked_bytes), mib(f.used_bytes),
                     mib(f.peak_bytes), _flag(f)))
        rows += [("", u.container, u.gpu_uuid, u.unit, _booked(u.booked_bytes), mib(u.used_bytes),
                  mib(u.peak_bytes), "") for u in f.entries]
    return rows


def _node_head(name: str, report: NodeUsageReport) -> str:
    cut = "; truncated: the pods with the most entries are left out" if report.truncated else ""
    return f"node {name} (sampled {report.sampled_at}, every {report.period_s:g} s{cut})"


def _unmapped(report: NodeUsageReport) -> list[str]:
    return [f"unmapped: pid {p.pid} on {p.gpu_uuid}: {mib(p.used_bytes)} ({p.why})" for p in report.unmapped]


def to_text(reports: list[tuple[str, NodeUsageReport]]) -> str:
    """The usage section of the text view ("" when no node reports usage)."""
    if not reports:
        return ""
    lines = ["Per-pod VRAM use (node agent, vramfit.io/pod-usage; booked - = not booked by vramfit):"]
    for name, report in reports:
        lines.append(_node_head(name, report))
        rows = [_HEAD, *_rows(report)]
        if len(rows) > 1:
            widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
            lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += ["  " + line for line in _unmapped(report)]
    return "\n".join(lines)


def to_html(reports: list[tuple[str, NodeUsageReport]]) -> str:
    """The usage section of the HTML page ("" when no node reports usage)."""
    if not reports:
        return ""
    parts = ["<h2>Per-pod VRAM use</h2><p>booked, used and peak as the node agent measured them "
             "(vramfit.io/pod-usage); booked - = not booked by vramfit</p>"]
    for name, report in reports:
        parts.append(f"<h3>{html.escape(_node_head(name, report))}</h3><table>")
        parts.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in _HEAD) + "</tr>")
        for r in _rows(report):
            cls = ' class="over"' if r[7] else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        parts.append("</table>")
        unmapped = _unmapped(report)
        if unmapped:
            parts.append("<ul>" + "".join(f"<li>{html.escape(u)}</li>" for u in unmapped) + "</ul>")
    return "".join(parts)
