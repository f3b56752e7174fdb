"""A view people can read: each node's GPUs drawn as their units, who holds each (and for which tenant), free
and stranded VRAM, and the pending pods with the reason they wait. One model, two renderings: the extender's
`GET /` (HTML, no external assets) and `vramfit inspect` (terminal).
"""

from __future__ import annotations

import contextlib
import html
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from packing import fit
from packing.catalog import Catalog
from packing.model import PodDemand
from packing.modes import mode_rules
from packing.state import ClusterState
from packing.usage import GpuUsage

MAX_PENDING = 100  # pods listed with their reasons (the rest are counted)
CHUNK_NODES = 16  # nodes read per hold of the store's lock (a few ms at 8 GPUs a node): verbs get in between


def pause() -> None:
    """Let a thread waiting for the interpreter lock (the server's event loop) have it now: a long walk in a
    worker thread otherwise kept it from the verbs for hundreds of ms at a time (measured, CPython 3.11)."""
    time.sleep(0)


T = TypeVar("T")


def each_node(state: ClusterState, lock: contextlib.AbstractContextManager[object],
              read: Callable[[str], T]) -> list[T]:
    """`read(name)` of every node of `state`, CHUNK_NODES nodes per hold of `lock` (a pause between two holds,
    so a server's verbs get in); nodes that left meanwhile are skipped."""
    with lock:
        names = list(state.node_names)
    out: list[T] = []
    for i in range(0, len(names), CHUNK_NODES):
        with lock:
            out += [read(n) for n in names[i:i + CHUNK_NODES] if state.has_node(n)]
        pause()
    return out


@dataclass(frozen=True)
class UnitView:
    label: str  # "3g.40gb@4", "share 2/4", "replica", "whole GPU", "free"
    memory_mib: int  # the unit's size (what its holder may use)
    holder: str | None = None  # namespace/name
    tenant: str | None = None
    vram_mib: int = 0  # what the holder asked
    start: int | None = None  # MIG: first memory slice
    slices: int | None = None  # MIG: memory slices


@dataclass(frozen=True)
class GpuView:
    index: int
    product: str
    mode: str
    memory_mib: int
    free_mib: int
    stranded_mib: int
    tenant: str | None
    units: tuple[UnitView, ...]
    uuid: str | None = None
    grid: int = 8  # MIG memory slices of the model (8 on 7-way GPUs)


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: tuple[GpuView, ...]

    @property
    def free_mib(self) -> int:
        return sum(g.free_mib for g in self.gpus)

    @property
    def stranded_mib(self) -> int:
        return sum(g.stranded_mib for g in self.gpus)


@dataclass(frozen=True)
class PendingView:
    pod: str
    tenant: str
    vram_mib: int
    gpu_count: int
    reason: str


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingView, ...] = ()
    more_pending: int = 0
    conflicted: tuple[str, ...] = field(default=())
    not_served: tuple[tuple[str, str], ...] = ()  # (node, why): nodes not counted as vramfit capacity


def _gpu_view(state: ClusterState, gu: GpuUsage, catalog: Catalog | None) -> GpuView:
    g = gu.gpu

    def tenant_of(key: str) -> str | None:
        h = state.holder(key)
        return h.pod.tenant if h is not None else None

    units: list[UnitView] = []
    rules = mode_rules(g.mode)
    if rules.instanced:
        for inst in sorted(g.mig, key=lambda i: i.start):
            key = gu.mig_holder.get(inst.ref)
            units.append(UnitView(inst.ref, inst.memory_mib, key, tenant_of(key) if key else None,
                                  gu.grants[key].vram_mib if key else 0, inst.start, inst.memory_slices))
    else:
        for key, grant in sorted(gu.grants.items()):
            # A daemon's clients with replicas hold equal fixed shares (MPS); other shared units their grant.
            size = g.memory_mib if (grant.whole or rules.takes_whole) else (
                gu.share_mib() if rules.client_limited and g.replicas else grant.vram_mib)
            label = "whole GPU" if size == g.memory_mib else ("MPS share" if rules.client_limited else "replica")
            units.append(UnitView(label, size, key, tenant_of(key), grant.vram_mib))
        free_slots = gu.slots_free() if gu.max_pods() < (1 << 20) else (1 if gu.pool_free() else 0)
        if gu.pool_free() > 0 and free_slots > 0:
            units.append(UnitView(f"free x{free_slots}" if free_slots > 1 else "free", gu.pool_free()))
    # The model's placement grid (8 memory slices on 7-way GPUs, 4 on A30, 12 on RTX PRO 6000).
    model = catalog.get(g.model) if catalog is not None and g.model else None
    grid = model.mig.memory_slices if model is not None and model.mig is not None else 8
    grid = max(grid, max((i.start + i.memory_slices for i in g.mig), default=0))
    return GpuView(g.index, g.product or (g.model or ""), g.mode.value, g.memory_mib, gu.pool_free(),
                   gu.stranded_mib(), gu.tenant(), tuple(units), g.uuid, grid)


EXPLAIN_NODES = 32  # per pending pod: the most promising nodes are explained, the rest counted
EXPLAIN_GROUPS = 3  # distinct reasons shown, the most common first


def _reason(state: ClusterState, pod: PodDemand) -> str:
    """Why the pod waits, from every node (as kube-scheduler's "0/N nodes are available: ..."): how many could
    hold it once units free, then the most promising nodes' reasons grouped by text, the most common first."""
    mask = fit.feasible(state, pod)
    fits = int(mask.now.sum())
    if fits:
        return f"fits {fits} node(s) now: waiting for the scheduler"
    names = state.node_names
    if not names:
        return "no GPU node is known"
    total = len(names)
    could = np.flatnonzero(~mask.never)
    if could.size:
        head = f"full now: 0/{total} nodes fit now, {could.size} could hold it once units free"
        rows, size = could, state.unit_max
    else:
        head = f"never fits: none of {total} nodes could hold it"
        rows, size = np.arange(total), state.unit_cap
    # The most promising first: the largest unit a node has (free now, or at all).
    largest = (size * state.present).max(axis=1) if size.shape[1] else np.zeros(total, dtype=np.int64)
    examined = rows[np.argsort(-largest[rows], kind="stable")][:EXPLAIN_NODES]
    groups: dict[str, list[str]] = {}
    for i in examined.tolist():
        why = fit.explain(state, names[i], pod).reason or ("no room now" if could.size else "no GPU can hold it")
        groups.setdefault(why, []).append(names[i])
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    parts = [f"{len(ns)} node(s) ({', '.join(ns[:3])}{', ...' if len(ns) > 3 else ''}): {why}"
             for why, ns in ranked[:EXPLAIN_GROUPS]]
    left = rows.size - sum(len(ns) for _, ns in ranked[:EXPLAIN_GROUPS])
    if left:
        parts.append(f"{left} other node(s)")
    return f"{head}: " + "; ".join(parts)


def cluster_view(state: ClusterState, pending: Iterable[PodDemand] = (), conflicted: Iterable[str] = (),
                 catalog: Catalog | None = None, *, lock: contextlib.AbstractContextManager[object] | None = None,
                 pending_total: int | None = None, not_served: Iterable[tuple[str, str]] = ()) -> ClusterView:
    """The view of `state` and the first MAX_PENDING of `pending` (`pending_total`: how many wait in all, when
    `pending` is only the head). With `lock` (the live store's), the state is read CHUNK_NODES nodes per hold
    of it and each pending pod's reason in a hold of its own, so a server's verbs are never held up by the
    whole walk; nodes that left meanwhile are skipped (the page is a view of a moving cluster)."""
    hold = lock if lock is not None else contextlib.nullcontext()
    nodes = each_node(state, hold, lambda n: NodeView(n, tuple(_gpu_view(state, gu, catalog)
                                                                for gu in state.usage(n).gpus)))
    waiting = list(pending)
    shown: list[PendingView] = []
    for p in waiting[:MAX_PENDING]:
        with hold:
            shown.append(PendingView(p.key, p.tenant, p.vram_mib, p.gpu_count, _reason(state, p)))
        pause()
    total = len(waiting) if pending_total is None else max(pending_total, len(waiting))
    return ClusterView(tuple(nodes), tuple(shown), max(0, total - len(shown)), tuple(conflicted), tuple(not_served))


# ---- HTML ----------------------------------------------------------------------------------------------------
_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}
.node{border:1px solid #bbb;border-radius:6px;margin:0 0 1em;padding:.6em}
.node h2{font-size:1.05em;margin:.1em 0 .5em}.gpu{display:flex;align-items:stretch;margin:.25em 0}
.gpu .name{width:22em;font-size:.85em}.units{display:grid;flex:1;gap:2px}
.unit{border-radius:3px;padding:2px 4px;font-size:.78em;overflow:hidden;white-space:nowrap;min-height:2.4em}
.held{background:#4c8bf5;color:#fff}.free{background:#e6efe6;color:#355e35}.t1{background:#e07b39}
.t2{background:#8e5cc7}.t3{background:#2a9d8f}.t4{background:#c9406a}.stranded{color:#b00}
table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.85em}
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _tenant_class(tenant: str | None, palette: dict[str, str]) -> str:
    if tenant is None:
        return "held"
    if tenant not in palette:
        palette[tenant] = ["held", "t1", "t2", "t3", "t4"][len(palette) % 5]
    return palette[tenant]


def to_html(view: ClusterView, title: str = "vramfit") -> str:
    return "".join(html_pieces(view, title))


def html_pieces(view: ClusterView, title: str = "vramfit") -> Iterator[str]:
    """The page a chunk of nodes at a time (the server encodes each and pauses between them: one join and
    encode of a 5,000-node page held the interpreter lock for tens of ms)."""
    palette: dict[str, str] = {}
    out = [f"<!doctype html><html><head><meta charset=utf-8><title>{_esc(title)}</title><style>{_CSS}</style>"
           f"</head><body><h1>{_esc(title)}: {len(view.nodes)} nodes, "
           f"{sum(len(n.gpus) for n in view.nodes)} GPUs</h1>"]
    for k, node in enumerate(view.nodes):
        if k % CHUNK_NODES == 0:
            yield "".join(out)
            out.clear()
            pause()
        out.append(f'<div class=node data-node="{_esc(node.name)}"><h2>{_esc(node.name)} — free '
                   f'{node.free_mib} MiB, <span class=stranded>stranded {node.stranded_mib} MiB</span></h2>')
        for g in node.gpus:
            who = f", tenant {_esc(g.tenant)}" if g.tenant else ""
            out.append(f'<div class=gpu data-gpu="{g.index}"><div class=name>GPU {g.index} {_esc(g.product)} '
                       f"({_esc(g.mode)}, {g.memory_mib} MiB{who})<br>free {g.free_mib} MiB, stranded "
                       f"{g.stranded_mib} MiB</div>")
            if g.mode == "mig":
                out.append(f'<div class=units style="grid-template-columns:repeat({g.grid},1fr)">')
                for u in g.units:
                    col = f"grid-column:{(u.start or 0) + 1} / span {u.slices or 1}"
                    out.append(_unit_html(u, col, palette))
            else:
                weights = " ".join(f"{max(1, u.memory_mib)}fr" for u in g.units) or "1fr"
                out.append(f'<div class=units style="grid-template-columns:{weights}">')
                for u in g.units:
                    out.append(_unit_html(u, "", palette))
            out.append("</div></div>")
        out.append("</div>")
    if view.pending or view.more_pending:
        out.append("<h1>Pending</h1><table><tr><th>pod</th><th>tenant</th><th>VRAM/GPU</th><th>GPUs</th>"
                   "<th>why it waits</th></tr>")
        out += [f"<tr class=pending><td>{_esc(p.pod)}</td><td>{_esc(p.tenant)}</td><td>{p.vram_mib} MiB</td>"
                f"<td>{p.gpu_count}</td><td>{_esc(p.reason)}</td></tr>" for p in view.pending]
        if view.more_pending:
            out.append(f"<tr><td colspan=5>... and {view.more_pending} more</td></tr>")
        out.append("</table>")
    if view.conflicted:
        out.append("<h1>Conflicted</h1><ul>" + "".join(f"<li>{_esc(c)}</li>" for c in view.conflicted) + "</ul>")
    if view.not_served:
        out.append("<h1>Not counted as vramfit capacity</h1><ul>"
                   + "".join(f"<li>{_esc(n)}: {_esc(why)}</li>" for n, why in view.not_served) + "</ul>")
    out.append("</body></html>")
    yield "".join(out)


def _unit_html(u: UnitView, style: str, palette: dict[str, str]) -> str:
    if u.holder is None:
        return (f'<div class="unit free" style="{style}" title="{_esc(u.label)} free">{_esc(u.label)}<br>'
                f"{u.memory_mib} MiB</div>")
    cls = _tenant_class(u.tenant, palette)
    return (f'<div class="unit {cls}" style="{style}" data-holder="{_esc(u.holder)}" '
            f'title="{_esc(u.holder)} ({_esc(u.tenant)}): {u.vram_mib} of {u.memory_mib} MiB">'
            f"{_esc(u.label)}<br>{_esc(u.holder)}</div>")


# ---- terminal ------------------------------------------------------------------------------------------------
def to_text(view: ClusterView) -> str:
    lines: list[str] = []
    for node in view.nodes:
        lines.append(f"{node.name}  free {node.free_mib} MiB  stranded {node.stranded_mib} MiB")
        for g in node.gpus:
            who = f"  tenant {g.tenant}" if g.tenant else ""
            lines.append(f"  GPU {g.index}  {g.product}  {g.mode}  {g.memory_mib} MiB  free {g.free_mib}  "
                         f"stranded {g.stranded_mib}{who}")
            for u in g.units:
                holder = f"{u.holder} ({u.tenant}) {u.vram_mib} MiB" if u.holder else "-"
                lines.append(f"    {u.label:<14} {u.memory_mib:>7} MiB  {holder}")
    if view.pending:
        lines.append("")
        lines.append("PENDING")
        width = max(len(p.pod) for p in view.pending)
        lines += [f"  {p.pod.ljust(width)}  {p.tenant}  {p.vram_mib} MiB x{p.gpu_count}  {p.reason}"
                  for p in view.pending]
        if view.more_pending:
            lines.append(f"  ... and {view.more_pending} more")
    if view.conflicted:
        lines.append("")
        lines.append("CONFLICTED")
        lines += [f"  {c}" for c in view.conflicted]
    if view.not_served:
        lines += ["", "NOT COUNTED AS VRAMFIT CAPACITY"] + [f"  {n}: {why}" for n, why in view.not_served]
    return "\n".join(lines)
