"""Cluster state: who holds which GPU unit, with exact accounting and numpy views for fast scoring.

`allocate` is the single place where every placement rule is enforced; filter, what-if, benchmark and
the extender's bind all end here, so an invalid placement can never enter the state whatever chose it.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable

from packing.model import (
    Assignment,
    GpuGrant,
    Holder,
    Node,
    PodDemand,
)
from packing.modes import WHOLE_GPU, ModeRules, combination_problem
from packing.usage import GpuUsage, NodeUsage, gpu_model_allowed
from packing.views import StateViews


class PlacementError(ValueError):
    """An allocation that would break a rule; the state is left unchanged."""


HOLDER_LOG_MIN = 4096  # the holder journal keeps at least this many entries (and twice the holders)
_ROW_EPOCHS = itertools.count()  # process-wide, so two states (or one state's two row layouts) never share one


class ClusterState(StateViews):
    """All nodes, all holders. Mutated only through upsert_node / remove_node / allocate / release."""

    def __init__(self, nodes: Iterable[Node] = (), relax_tenancy: bool = False, max_gpus: int = 8) -> None:
        super().__init__(max_gpus)
        self.relax_tenancy = relax_tenancy
        # Changes whenever a row starts to mean another node (one added, one removed): a reader that keys on it
        # (`DeltaSource`) need not compare the node names, which at 5,000 nodes cost ~3 ms under the lock.
        self.rows_epoch = next(_ROW_EPOCHS)
        self._index: dict[str, int] = {}
        self._holders: dict[str, Holder] = {}
        # Keys of the holders added, replaced or dropped, in order, from position _holder_log_base on: a working
        # copy's `DeltaSource` reads what changed from here instead of comparing every holder under the lock.
        self._holder_log: list[str] = []
        self._holder_log_base = 0
        for n in nodes:
            self.upsert_node(n)

    # ------------------------------------------------------------------ nodes
    @property
    def node_names(self) -> list[str]:
        return [nu.node.name for nu in self._nodes]

    def __len__(self) -> int:
        return len(self._nodes)

    def index_of(self, name: str) -> int:
        return self._index[name]

    def has_node(self, name: str) -> bool:
        return name in self._index

    def node(self, name: str) -> Node:
        return self._nodes[self._index[name]].node

    def node_at(self, i: int) -> Node:
        return self._nodes[i].node

    def usage(self, name: str) -> NodeUsage:
        return self._nodes[self._index[name]]

    def nodes(self) -> list[Node]:
        return [nu.node for nu in self._nodes]

    def upsert_node(self, node: Node) -> list[Holder]:
        """Add or replace a node. Holders that no longer fit the new description are evicted and returned."""
        if len(node.gpus) > self._g:
            self._grow(len(self._nodes), len(node.gpus))
        existing = self._index.get(node.name)
        displaced: list[Holder] = []
        if existing is not None:
            old_holders = self.holders_on(node.name)
            for h in old_holders:
                self._drop(h.pod.key)
            self._nodes[existing] = NodeUsage(node, [GpuUsage(g) for g in node.gpus])
            self._refresh(existing)
            for h in old_holders:
                try:
                    self.allocate(h.pod, h.assignment, reserved=h.reserved)
                except PlacementError:
                    displaced.append(h)
            return displaced
        i = len(self._nodes)
        if i >= self._present.shape[0]:
            self._grow(max(8, 2 * i), self._g)
        self._nodes.append(NodeUsage(node, [GpuUsage(g) for g in node.gpus]))
        self._index[node.name] = i
        self.rows_epoch = next(_ROW_EPOCHS)
        self._refresh(i)
        return displaced

    def remove_node(self, name: str) -> list[Holder]:
        """Remove a node; its holders are released and returned."""
        i = self._index.get(name)
        if i is None:
            return []
        gone = self.holders_on(name)
        for h in gone:
            self._drop(h.pod.key)
        last = len(self._nodes) - 1
        # Move the last node into the hole so rows stay dense.
        if i != last:
            self._nodes[i] = self._nodes[last]
            self._index[self._nodes[i].node.name] = i
        self._nodes.pop()
        del self._index[name]
        self.rows_epoch = next(_ROW_EPOCHS)
        if i != last:
            self._refresh(i)
        self._present[last] = False
        self._version[last] += 1
        return gone

    # ---------------------------------------------------------------- holders
    def _holder_changed(self, pod_key: str) -> None:
        log = self._holder_log
        log.append(pod_key)
        if len(log) > max(HOLDER_LOG_MIN, 2 * len(self._holders)):  # a reader this far behind reads every holder
            cut = len(log) // 2
            del log[:cut]
            self._holder_log_base += cut

    def holder_changes_since(self, position: int | None) -> tuple[list[str] | None, int]:
        """(keys of holders added, replaced or dropped since `position` of the journal, possibly repeated; the
        position now). None instead of the keys when `position` is None or was trimmed: compare every holder."""
        end = self._holder_log_base + len(self._holder_log)
        if position is None or position < self._holder_log_base or position > end:
            return None, end
        return self._holder_log[position - self._holder_log_base:], end

    def holder(self, pod_key: str) -> Holder | None:
        return self._holders.get(pod_key)

    def holders(self) -> list[Holder]:
        return list(self._holders.values())

    def holders_on(self, node_name: str) -> list[Holder]:
        return [h for h in self._holders.values() if h.assignment.node == node_name]

    def check(self, pod: PodDemand, assignment: Assignment, force: bool = False) -> None:
        """Raise PlacementError unless `assignment` is valid for `pod` right now.

        force=True records a pod that already runs: capacity, tenancy and isolation are not re-judged
        (reality wins), but a unit is still never booked twice.
        """
        if pod.key in self._holders:
            raise PlacementError(f"{pod.key} already holds {self._holders[pod.key].assignment.node}")
        i = self._index.get(assignment.node)
        if i is None:
            raise PlacementError(f"unknown node {assignment.node}")
        nu = self._nodes[i]
        if len(assignment.gpus) != pod.gpu_count:
            raise PlacementError(f"{pod.key} needs {pod.gpu_count} GPUs, assignment has {len(assignment.gpus)}")
        if len({g.index for g in assignment.gpus}) != len(assignment.gpus):
            raise PlacementError(f"{pod.key}: a GPU appears twice in the assignment")
        cpu_cap = None if force else nu.node.cpu_milli
        if cpu_cap is not None and nu.cpu_used + pod.cpu_milli > cpu_cap:
            raise PlacementError(f"{pod.key}: node {nu.node.name} lacks CPU")
        mem_cap = None if force else nu.node.memory_mib
        if mem_cap is not None and nu.mem_used + pod.memory_mib > mem_cap:
            raise PlacementError(f"{pod.key}: node {nu.node.name} lacks memory")
        by_index = {gu.gpu.index: gu for gu in nu.gpus}
        for grant in assignment.gpus:
            gu = by_index.get(grant.index)
            if gu is None:
                raise PlacementError(f"node {nu.node.name} has no GPU {grant.index}")
            problem = oversized(gu, grant) or (
                self._double_booking(pod, gu, grant) if force else self.grant_problem(pod, gu, grant))
            if problem:
                raise PlacementError(f"{pod.key} on {nu.node.name} GPU {grant.index}: {problem}")
        combined = None if force else self.units_problem(pod, assignment)
        if combined:
            raise PlacementError(f"{pod.key} on {nu.node.name}: {combined}")

    def units_problem(self, pod: PodDemand, assignment: Assignment) -> str | None:
        """Why the pod may not hold these units together (`packing.modes.combine`: one kind of unit, as many GPUs
        of it as the kind allows); None when it may. Forced records (pods already running) are not judged."""
        i = self._index.get(assignment.node)
        if i is None or len(assignment.gpus) < 2:
            return None
        by_index = {gu.gpu.index: gu for gu in self._nodes[i].gpus}
        units: list[ModeRules] = [WHOLE_GPU if g.whole else by_index[g.index].rules
                                  for g in assignment.gpus if g.index in by_index]
        return combination_problem(units, pod.gpu_per_process)

    @staticmethod
    def _double_booking(pod: PodDemand, gu: GpuUsage, grant: GpuGrant) -> str | None:
        if gu.whole_holder is not None:
            return f"held whole by {gu.whole_holder}"
        if grant.whole and gu.grants:
            return "whole-GPU grant on a GPU that is in use"
        return gu.rules.booking_problem(gu, grant)

    def grant_problem(self, pod: PodDemand, gu: GpuUsage, grant: GpuGrant) -> str | None:
        g = gu.gpu
        if not gpu_model_allowed(g, pod.models):
            return f"GPU model {g.product or g.model} not in {sorted(pod.models or ())}"
        if gu.whole_holder is not None:
            return f"held whole by {gu.whole_holder}"
        if grant.vram_mib < pod.vram_mib:
            return f"grant of {grant.vram_mib} MiB is below the pod's {pod.vram_mib} MiB"
        if grant.whole:
            if gu.grants:
                return "whole-GPU grant on a GPU that is in use"
            if pod.vram_mib > g.memory_mib:
                return f"needs {pod.vram_mib} MiB, GPU has {g.memory_mib} MiB"
            return None
        if not gu.rules.admits(pod.isolation):
            return f"isolation {pod.isolation.value} forbids {g.mode.value}"
        return gu.rules.grant_problem(gu, pod, grant, self.relax_tenancy)

    def allocate(self, pod: PodDemand, assignment: Assignment, reserved: bool = False,
                 force: bool = False) -> Holder:
        """Record that `pod` holds `assignment`. All-or-nothing; raises PlacementError.

        force=True: see `check` (used only for pods the API server reports as already running).
        """
        self.check(pod, assignment, force)
        i = self._index[assignment.node]
        nu = self._nodes[i]
        by_index = {gu.gpu.index: gu for gu in nu.gpus}
        for grant in assignment.gpus:
            gu = by_index[grant.index]
            gu.grants[pod.key] = grant
            if grant.whole:
                gu.whole_holder = pod.key
            elif grant.mig is not None:
                gu.mig_holder[grant.mig] = pod.key
            else:
                gu.used_mib += grant.vram_mib
            gu.tenants[pod.tenant] = gu.tenants.get(pod.tenant, 0) + 1
        nu.cpu_used += pod.cpu_milli
        nu.mem_used += pod.memory_mib
        holder = Holder(pod, assignment, reserved)
        self._holders[pod.key] = holder
        self._holder_changed(pod.key)
        self._refresh(i)
        return holder

    def confirm(self, pod_key: str) -> Holder | None:
        """A reserved holder's Binding succeeded: it now simply holds its units."""
        h = self._holders.get(pod_key)
        if h is not None and h.reserved:
            h = Holder(h.pod, h.assignment, reserved=False)
            self._holders[pod_key] = h
            self._holder_changed(pod_key)
        return h

    def _drop(self, pod_key: str) -> Holder | None:
        h = self._holders.pop(pod_key, None)
        if h is None:
            return None
        self._holder_changed(pod_key)
        i = self._index.get(h.assignment.node)
        if i is None:
            return h
        nu = self._nodes[i]
        by_index = {gu.gpu.index: gu for gu in nu.gpus}
        for grant in h.assignment.gpus:
            gu = by_index.get(grant.index)
            if gu is None or pod_key not in gu.grants:
                continue
            del gu.grants[pod_key]
            if grant.whole:
                gu.whole_holder = None
            elif grant.mig is not None:
                gu.mig_holder.pop(grant.mig, None)
            else:
                gu.used_mib -= grant.vram_mib
            left = gu.tenants.get(h.pod.tenant, 0) - 1
            if left > 0:
                gu.tenants[h.pod.tenant] = left
            else:
                gu.tenants.pop(h.pod.tenant, None)
        nu.cpu_used -= h.pod.cpu_milli
        nu.mem_used -= h.pod.memory_mib
        return h

    def release(self, pod_key: str) -> Holder | None:
        """Free what a pod holds; returns the holder (None when it held nothing)."""
        h = self._drop(pod_key)
        if h is not None and h.assignment.node in self._index:
            self._refresh(self._index[h.assignment.node])
        return h

    def copy(self) -> ClusterState:
        """An independent copy (what-if runs, preemption simulation)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------- summaries
    def stranded_mib(self) -> int:
        """VRAM on GPUs in use that no pod holds and no new pod can get (whole GPUs, MIG leftovers)."""
        return sum(nu.stranded_mib() for nu in self._nodes)

    def node_stranded_mib(self, name: str) -> int:
        """`stranded_mib` of one node."""
        return self.usage(name).stranded_mib()

    def gpus_used(self) -> int:
        return int((self._present & ~self._idle).sum())


def oversized(gu: GpuUsage, grant: GpuGrant) -> str | None:
    """Why a grant is larger than the unit it names, or names a MIG instance the GPU does not have (None: it is
    neither). Checked for every record, forced ones included: no pod runs with more VRAM than its MIG instance
    or GPU has, so such a grant is not reality but a mistake or a forgery, and booking it would misstate the unit."""
    if grant.mig is not None:
        inst = gu.gpu.instance(grant.mig)
        if inst is None:
            return f"no MIG instance {grant.mig} on this GPU"
        if grant.vram_mib > inst.memory_mib:
            return f"grant of {grant.vram_mib} MiB is more than MIG instance {grant.mig} has ({inst.memory_mib} MiB)"
        return None
    if grant.vram_mib > gu.gpu.memory_mib:
        return f"grant of {grant.vram_mib} MiB is more than the GPU has ({gu.gpu.memory_mib} MiB)"
    return None
