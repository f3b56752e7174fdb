"""filter: which of the requested nodes can take the pod now, and why each other one cannot.

A vectorised summary reason for every rejected node, the core's full reason for the first `EXPLAIN_LIMIT`
(cached per pod shape, node and node version, so a busy node is explained once, not every cycle). Every pod
it names is remembered (`FilterMemory`): bind places only pods a filter call named within the window. With
`shortlist_k` on, a pod fitting many nodes passes only the best K of them (`extender.verbs.shortlist`) and no
node is listed as failed: reasons matter only to a pod that fits nowhere, and were most of the answer's bytes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from extender import wire
from extender.metrics import Metrics
from extender.store import DRA_NODE_REASON
from extender.verbs import shortlist
from extender.verbs.shared import CACHE_SHAPES, Eval, Shared, requested
from packing import fit
from packing.model import InputError, PodDemand

EXPLAIN_LIMIT = 16  # per request: detailed core reasons; beyond it a vectorised summary reason
# Per-node reasons are explained for the first EXPLAIN_LIMIT nodes of a call: enough for every cached shape a few
# node versions over (100,000 held ~45 MiB under a flood of one-off shapes).
CACHE_REASONS = CACHE_SHAPES * EXPLAIN_LIMIT * 4
FILTERED_MAX = 50_000  # pod UIDs remembered as filtered (bind's check); older ones also age out


@dataclass(frozen=True, slots=True)
class Filtered:
    """What bind needs to know of a pod a filter call named."""

    at: float  # monotonic clock
    scheduler: object  # the filter's Pod spec.schedulerName (None when absent)
    node: object  # its spec.nodeName


class FilterMemory:
    """The pods filter calls named, by UID: at most FILTERED_MAX, none older than `window_s` (bind's check)."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._filtered: OrderedDict[str, Filtered] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, pod: PodDemand, pod_obj: dict[str, Any]) -> None:
        if not pod.uid:
            return
        spec = pod_obj.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        now = self.clock()
        with self._lock:
            self._filtered[pod.uid] = Filtered(now, spec.get("schedulerName"), spec.get("nodeName"))
            self._filtered.move_to_end(pod.uid)
            horizon = now - self.window_s
            while self._filtered and (len(self._filtered) > FILTERED_MAX
                                      or next(iter(self._filtered.values())).at < horizon):
                self._filtered.popitem(last=False)

    def recent(self, uid: str) -> Filtered | None:
        """The filter call that named this UID within the window, or None."""
        with self._lock:
            seen = self._filtered.get(uid)
        if seen is None or seen.at < self.clock() - self.window_s:
            return None
        return seen


class Filter:
    """ExtenderArgs -> ExtenderFilterResult: the requested nodes the pod fits now, the rest with reasons."""

    def __init__(self, shared: Shared, memory: FilterMemory, metrics: Metrics, shortlist_k: int = 0) -> None:
        """`shortlist_k`: pass at most this many of the nodes a pod fits, the best by the policy (0: all)."""
        self.shared = shared
        self.shortlist_k = shortlist_k
        self.store = shared.store
        self.memory = memory
        self._reasons: OrderedDict[tuple[object, ...], str] = OrderedDict()
        self._never: OrderedDict[tuple[object, ...], tuple[np.ndarray, dict[str, str]]] = OrderedDict()
        self._fit_count = metrics.filter_nodes.labels("fit")  # children bound once: labels() is a lookup
        self._full_count = metrics.filter_nodes.labels("full")
        self._never_count = metrics.filter_nodes.labels("never")
        self._cut_count = metrics.filter_nodes.labels("shortlist")  # fitting, left off the shortlist (not listed)

    def __call__(self, args: wire.ExtenderArgs) -> dict[str, Any]:
        items, names = requested(args)
        by_nodes = args.NodeNames is None
        shared = self.shared
        try:
            pod = shared.demand(args.Pod)
        except InputError as err:
            # Short: the text is repeated for every node, and a hostile pod's name may be megabytes long.
            reason = _short(f"pod cannot be placed by vramfit: {err}")
            return self._answer(items, names, by_nodes, [], {}, dict.fromkeys(names, reason))
        if pod is None:  # not a vramfit pod: every node passes
            return self._answer(items, names, by_nodes, list(range(len(names))), {}, {}, passed_names=list(names))
        self.memory.note(pod, args.Pod)
        if self.store.remember(pod):
            with self.store.lock:  # a learning policy's state is read by score/choose under the same lock
                shared.guarded.observe(pod)
        plan = shared.plan() if self.shortlist_k else None
        with self.store.lock:
            passed, failed, never, passed_names, cut = self._judge(pod, names, by_nodes, plan)
        self._cut_count.inc(cut)
        return self._answer(items, names, by_nodes, passed, failed, never, passed_names)

    def _answer(self, items: list[dict[str, Any]], names: list[str], by_nodes: bool, passed: list[int],
                failed: dict[str, str], never: dict[str, str],
                passed_names: list[str] | None = None) -> dict[str, Any]:
        """The filter result in the form asked (Node objects or names), the node counts metered."""
        self._fit_count.inc(len(passed))
        self._full_count.inc(len(failed))
        self._never_count.inc(len(never))
        if by_nodes:
            return wire.filter_result(nodes=[items[k] for k in passed], failed=failed, unresolvable=never)
        if passed_names is None:
            passed_names = [names[k] for k in passed]
        return wire.filter_result(node_names=passed_names, failed=failed, unresolvable=never)

    def _judge(self, pod: PodDemand, names: list[str], by_nodes: bool, plan: Any
               ) -> tuple[list[int], dict[str, str], dict[str, str], list[str] | None, int]:
        """(passed positions, full-now reasons, never reasons, passed names when asked by name, fitting nodes
        left off the shortlist); under the store's lock."""
        shared = self.shared
        self.store.sweep()
        ev = shared.eval(pod, want_scores=self.shortlist_k > 0)  # the scores prioritize reads next: computed once
        rows, name_arr = shared.positions(names)
        known = rows >= 0
        if len(ev.mask.now):
            safe = np.where(known, rows, 0)
            now = ev.mask.now[safe] & known
            is_never = ev.mask.never[safe] & known
        else:  # an empty state: no name is known (and there is no row 0 to stand in for them)
            now = is_never = np.zeros(len(rows), dtype=bool)
        passed = np.flatnonzero(now)
        if shortlist.applies(self.shortlist_k, passed.size):
            # The pod fits many nodes: only the best K pass, and no node is listed as failed. kube-scheduler drops
            # a node missing from the answer without a reason, and reasons only matter to a pod that fits nowhere
            # (its preemption and its event); thousands of them were most of the answer's bytes.
            passed, off = self._shortlist(pod, ev, passed, rows, name_arr, plan)
            positions, passed_names = self._passed(passed, rows, name_arr, by_nodes, shared)
            return positions, {}, {}, passed_names, off.size
        failed: dict[str, str] = {}
        never = self._unknown_reasons(names, known)
        fail = np.flatnonzero(known & ~now)
        # A vectorised summary reason for every rejected node, the core's full reason for the first few
        # (with thousands of nodes, kube-scheduler's event groups identical texts, so the summary is also
        # the readable one). Where a pod can never go depends on the pod's shape and the hardware, not on
        # occupancy: that map is reused across cycles.
        if is_never.any():
            never.update(self._never_map(pod, is_never, name_arr))
        for k in fail[:EXPLAIN_LIMIT].tolist():
            (never if is_never[k] else failed)[names[k]] = self._reason(pod, names[k], int(rows[k]))
        rest = fail[EXPLAIN_LIMIT:]
        if rest.size:
            failed.update(self._full_summary(pod, ev, rest[~is_never[rest]], rows, name_arr))
        positions, passed_names = self._passed(passed, rows, name_arr, by_nodes, shared)
        return positions, failed, never, passed_names, 0

    @staticmethod
    def _passed(passed: np.ndarray, rows: np.ndarray, name_arr: np.ndarray, by_nodes: bool, shared: Shared
                ) -> tuple[list[int], list[str] | None]:
        passed_names = None
        if not by_nodes:
            passed_names = name_arr[passed].tolist()
            # The scheduler's prioritize call names (a subset of) these: register their rows now.
            shared.remember_positions(passed_names, rows[passed], name_arr[passed])
        return passed.tolist(), passed_names

    def _shortlist(self, pod: PodDemand, ev: Eval, passed: np.ndarray, rows: np.ndarray, name_arr: np.ndarray,
                   plan: Any) -> tuple[np.ndarray, np.ndarray]:
        """(the positions of `passed` on the shortlist, those left off), both in request order. Lock held."""
        assert ev.scores is not None
        fit_rows = rows[passed]
        keep = shortlist.best_k(ev.scores, fit_rows, self.shortlist_k)
        planned, reserved = shortlist.plan_word(self.shared, plan, pod)
        shortlist.keep_for_plan(keep, ev.scores, fit_rows, name_arr[passed], planned, reserved)
        return passed[keep], passed[~keep]

    def _unknown_reasons(self, names: list[str], known: np.ndarray) -> dict[str, str]:
        """Why each name vramfit holds no row for can never take the pod."""
        never: dict[str, str] = {}
        for k in np.flatnonzero(~known).tolist():
            name = names[k]
            never[name] = self.store.bad_nodes.get(name) or (
                self.store.not_served_reason(name) if name in self.store.unserved
                else DRA_NODE_REASON.format(node=name) if self.store.is_dra_node(name)
                else f"node {name} is not known to vramfit")
        return never

    def _full_summary(self, pod: PodDemand, ev: Eval, rest_full: np.ndarray, rows: np.ndarray,
                      name_arr: np.ndarray) -> dict[str, str]:
        """The one-line reason for the full-now nodes past the explained few: the largest free unit each has."""
        if not rest_full.size:
            return {}
        largest = self._largest_free(ev)[rows[rest_full]]
        values, inverse = np.unique(largest, return_inverse=True)
        texts = np.array([f"full now: needs {pod.vram_mib} MiB, largest free unit {int(v)} MiB"
                          for v in values], dtype=object)
        return dict(zip(name_arr[rest_full].tolist(), texts[inverse].tolist(), strict=True))

    def _reason(self, pod: PodDemand, name: str, i: int) -> str:
        state = self.store.state
        whole = self.shared.policy.whole_gpu
        key = (pod.shape, whole, name, int(state.version[i]))
        text = self._reasons.get(key)
        if text is None:
            text = fit.explain(state, name, pod, whole).reason or "does not fit"
            self._reasons[key] = text
            if len(self._reasons) > CACHE_REASONS:
                self._reasons.popitem(last=False)
        return text

    def _largest_free(self, ev: Eval) -> np.ndarray:
        if ev.largest is None:
            state = self.store.state
            um = state.unit_max * state.present
            ev.largest = um.max(axis=1) if um.shape[1] else np.zeros(len(state), dtype=np.int64)
        return ev.largest

    def _never_map(self, pod: PodDemand, is_never: np.ndarray, name_arr: np.ndarray) -> dict[str, str]:
        key = (pod.shape, self.shared.policy.whole_gpu, np.packbits(is_never).tobytes(), len(name_arr), id(name_arr))
        hit = self._never.get(key)
        if hit is not None and hit[0] is name_arr:
            return hit[1]
        text = (f"never fits: no GPU here can hold {pod.vram_mib} MiB"
                + (f" on each of {pod.gpu_count} GPUs" if pod.gpu_count > 1 else "")
                + f" with isolation {pod.isolation.value}"
                + (f" and models {','.join(sorted(pod.models))}" if pod.models else ""))
        mapping = dict.fromkeys(name_arr[is_never].tolist(), text)
        self._never[key] = (name_arr, mapping)
        if len(self._never) > CACHE_SHAPES:
            self._never.popitem(last=False)
        return mapping


def _short(text: str, limit: int = 512) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
