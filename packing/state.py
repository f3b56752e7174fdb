"""Cluster state: who holds which GPU unit, with exact accounting and numpy views for fast scoring.

`allocate` is the single place where every placement rule is enforced; filter, what-if, benchmark and
the extender's bind all end here, so an invalid placement can never enter the state whatever chose it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from packing.model import (
    ALLOWED_MODES,
    Assignment,
    Gpu,
    GpuGrant,
    Holder,
    MigInstance,
    Mode,
    Node,
    PodDemand,
)
from packing.modes import UNLIMITED, ModeRules, rules_for

MODE_CODE: dict[Mode, int] = {Mode.EXCLUSIVE: 0, Mode.MIG: 1, Mode.MPS: 2, Mode.TIMESLICE: 3}
MAX_MIG_INSTANCES = 8  # 7 on the 7-way parts, 4 on A30/RTX PRO; padded to 8  # stands for "not tracked" (CPU/memory of a node, replicas of time-slicing)


class PlacementError(ValueError):
    """An allocation that would break a rule; the state is left unchanged."""


@dataclass
class GpuUsage:
    """Mutable occupancy of one physical GPU: the books. What they mean (how many may join, the largest
    grant, the free pool, stranded VRAM) is the GPU's sharing mode's to say: `rules` (`packing.modes`)."""

    gpu: Gpu
    grants: dict[str, GpuGrant] = field(default_factory=dict)  # pod key -> grant on this GPU
    tenants: dict[str, int] = field(default_factory=dict)  # tenant -> pods (shared modes)
    mig_holder: dict[str, str] = field(default_factory=dict)  # instance ref -> pod key
    used_mib: int = 0
    whole_holder: str | None = None
    rules: ModeRules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rules = rules_for(self.gpu)

    @property
    def pods(self) -> int:
        return len(self.grants)

    def share_mib(self) -> int:
        """MPS with replicas: the device plugin's equal per-client limit, floor(total / replicas)."""
        assert self.gpu.replicas
        return self.gpu.memory_mib // self.gpu.replicas

    def max_pods(self) -> int:
        return self.rules.max_pods(self)

    def free_instances(self) -> list[MigInstance]:
        return [i for i in self.gpu.mig if i.ref not in self.mig_holder]

    def unit_max(self) -> int:
        """Largest VRAM a new pod could get on this GPU now (tenancy aside)."""
        return 0 if self.whole_holder is not None else self.rules.unit_max(self)

    def unit_cap(self) -> int:
        """Largest VRAM one pod could ever get on this GPU (it empty)."""
        return self.rules.unit_cap(self)

    def pool_free(self) -> int:
        return 0 if self.whole_holder is not None else self.rules.pool_free(self)

    def slots_free(self) -> int:
        return 0 if self.whole_holder is not None else self.rules.slots_free(self)

    def tenant(self) -> str | None:
        """The tenant that owns the failure domain of a shared GPU (None when free or not shared)."""
        if self.rules.shared and self.tenants:
            return next(iter(self.tenants))
        return None

    def stranded_mib(self) -> int:
        """VRAM on this GPU, if in use, that no pod holds and no new pod can get."""
        if not self.grants:
            return 0
        if self.whole_holder is not None:  # a whole-GPU grant on a shared or MIG GPU: the rest is its
            return self.gpu.memory_mib - sum(x.vram_mib for x in self.grants.values())
        return self.rules.stranded_mib(self)


@dataclass
class NodeUsage:
    node: Node
    gpus: list[GpuUsage]
    cpu_used: int = 0
    mem_used: int = 0

    def stranded_mib(self) -> int:
        return sum(gu.stranded_mib() for gu in self.gpus)


class ClusterState:
    """All nodes, all holders. Mutated only through upsert_node / remove_node / allocate / release."""

    def __init__(self, nodes: Iterable[Node] = (), relax_tenancy: bool = False, max_gpus: int = 8) -> None:
        self.relax_tenancy = relax_tenancy
        self._nodes: list[NodeUsage] = []
        self._index: dict[str, int] = {}
        self._holders: dict[str, Holder] = {}
        self._tenant_ids: dict[str, int] = {}
        self._gpu_kinds: dict[tuple[str, str], int] = {}  # (model, product) -> id, for model filters
        self._kind_gpus: list[Gpu] = []  # one representative GPU per kind id
        self._kinds_cache: dict[tuple[frozenset[str] | None, int], np.ndarray] = {}
        self._mig_fit_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._g = -(-max(max_gpus, 1) // 8) * 8  # multiples of 8: see row_count
        self._alloc_arrays(0)
        for n in nodes:
            self.upsert_node(n)

    # ----------------------------------------------------------------- arrays
    _present: np.ndarray
    _mem: np.ndarray
    _mode: np.ndarray
    _unit_max: np.ndarray
    _unit_cap: np.ndarray
    _pool_free: np.ndarray
    _slots_free: np.ndarray
    _tenant: np.ndarray
    _idle: np.ndarray
    _kind: np.ndarray
    _mig_free: np.ndarray
    _shared: np.ndarray
    _open: np.ndarray
    _cpu_free: np.ndarray
    _cpu_cap: np.ndarray
    _memfree: np.ndarray
    _memcap: np.ndarray
    _version: np.ndarray
    _node_free: np.ndarray

    # name -> (per-GPU?, dtype, fill). One list drives allocation, growth and the public views, so a new
    # array can never be forgotten when the state grows.
    _ARRAYS: dict[str, tuple[str, type, int]] = {
        "present": ("gpu", bool, 0), "mem": ("gpu", np.int64, 0), "mode": ("gpu", np.int8, -1),
        "unit_max": ("gpu", np.int64, 0), "unit_cap": ("gpu", np.int64, 0), "pool_free": ("gpu", np.int64, 0),
        "slots_free": ("gpu", np.int64, 0), "tenant": ("gpu", np.int32, -1), "idle": ("gpu", bool, 0),
        "kind": ("gpu", np.int32, -1), "mig_free": ("mig", np.int64, 0), "shared": ("gpu", bool, 0),
        "open": ("gpu", bool, 0), "cpu_free": ("node", np.int64, 0), "cpu_cap": ("node", np.int64, 0),
        "memfree": ("node", np.int64, 0), "memcap": ("node", np.int64, 0), "version": ("node", np.int64, 0),
        "node_free": ("node", np.int64, 0),
    }

    def _alloc_arrays(self, n: int) -> None:
        for name, (per, dtype, fill) in self._ARRAYS.items():
            shape = {"gpu": (n, self._g), "mig": (n, self._g, MAX_MIG_INSTANCES), "node": (n,)}[per]
            setattr(self, "_" + name, np.full(shape, fill, dtype=dtype))

    def _grow(self, rows: int, cols: int) -> None:
        old = {k: getattr(self, "_" + k) for k in self._ARRAYS}
        n_old = old["present"].shape[0]
        g_old = self._g
        self._g = max(self._g, -(-cols // 8) * 8)  # multiples of 8: rows of bools pack into uint64 words
        self._alloc_arrays(max(rows, n_old))
        for k, arr in old.items():
            target = getattr(self, "_" + k)
            if arr.ndim == 3:
                target[:n_old, :g_old, :] = arr
            elif arr.ndim == 2:
                target[:n_old, :g_old] = arr
            else:
                target[:n_old] = arr

    # Public views, sliced to the live rows (capacity rows beyond them are scratch).
    @property
    def present(self) -> np.ndarray:
        """GPU slot holds a GPU"""
        return self._present[: len(self._nodes)]

    @property
    def mem(self) -> np.ndarray:
        """total MiB per GPU"""
        return self._mem[: len(self._nodes)]

    @property
    def mode(self) -> np.ndarray:
        """MODE_CODE per GPU (-1: none)"""
        return self._mode[: len(self._nodes)]

    @property
    def unit_max(self) -> np.ndarray:
        """largest VRAM one new pod could get now"""
        return self._unit_max[: len(self._nodes)]

    @property
    def unit_cap(self) -> np.ndarray:
        """largest VRAM one pod could ever get"""
        return self._unit_cap[: len(self._nodes)]

    @property
    def pool_free(self) -> np.ndarray:
        """free VRAM per GPU"""
        return self._pool_free[: len(self._nodes)]

    @property
    def slots_free(self) -> np.ndarray:
        """pods that can still join"""
        return self._slots_free[: len(self._nodes)]

    @property
    def tenant(self) -> np.ndarray:
        """tenant id owning a shared GPU (-1: none)"""
        return self._tenant[: len(self._nodes)]

    @property
    def idle(self) -> np.ndarray:
        """nobody on the GPU"""
        return self._idle[: len(self._nodes)]

    @property
    def kind(self) -> np.ndarray:
        """GPU kind id (model filters)"""
        return self._kind[: len(self._nodes)]

    @property
    def mig_free(self) -> np.ndarray:
        """[N,G,8] sizes of free MIG instances"""
        return self._mig_free[: len(self._nodes)]

    @property
    def shared(self) -> np.ndarray:
        """MPS or time-sliced GPU"""
        return self._shared[: len(self._nodes)]

    @property
    def open(self) -> np.ndarray:
        """any tenant may join"""
        return self._open[: len(self._nodes)]

    @property
    def cpu_free(self) -> np.ndarray:
        """free CPU millicores"""
        return self._cpu_free[: len(self._nodes)]

    @property
    def cpu_cap(self) -> np.ndarray:
        """allocatable CPU millicores"""
        return self._cpu_cap[: len(self._nodes)]

    @property
    def memfree(self) -> np.ndarray:
        """free memory MiB"""
        return self._memfree[: len(self._nodes)]

    @property
    def memcap(self) -> np.ndarray:
        """allocatable memory MiB"""
        return self._memcap[: len(self._nodes)]

    @property
    def version(self) -> np.ndarray:
        """bumped on every change of the node"""
        return self._version[: len(self._nodes)]

    @property
    def node_free(self) -> np.ndarray:
        """free VRAM per node"""
        return self._node_free[: len(self._nodes)]

    def tenant_id(self, tenant: str) -> int:
        """Stable small integer per tenant (numpy views hold ids, not strings)."""
        tid = self._tenant_ids.get(tenant)
        if tid is None:
            tid = self._tenant_ids[tenant] = len(self._tenant_ids)
        return tid

    def known_tenant_id(self, tenant: str) -> int:
        """Id of a tenant, or -2 when no GPU has ever held it (matches nothing)."""
        return self._tenant_ids.get(tenant, -2)

    def allowed_kinds(self, models: frozenset[str] | None) -> np.ndarray:
        """Boolean per kind id: may a pod with this model list use GPUs of that kind."""
        key = (models, len(self._kind_gpus))
        hit = self._kinds_cache.get(key)
        if hit is None:
            hit = np.array([gpu_model_allowed(g, models) for g in self._kind_gpus] + [False], dtype=bool)
            self._kinds_cache[key] = hit
        return hit

    def _refresh(self, i: int) -> None:
        nu = self._nodes[i]
        self._present[i] = False
        self._mode[i] = -1
        self._tenant[i] = -1
        self._kind[i] = -1
        for arr in (self._mem, self._unit_max, self._unit_cap, self._pool_free, self._slots_free):
            arr[i] = 0
        self._idle[i] = False
        self._shared[i] = False
        self._open[i] = False
        self._mig_free[i] = 0
        for j, gu in enumerate(nu.gpus):
            g = gu.gpu
            self._present[i, j] = True
            self._mem[i, j] = g.memory_mib
            self._mode[i, j] = MODE_CODE[g.mode]
            self._unit_max[i, j] = gu.unit_max()
            self._unit_cap[i, j] = gu.unit_cap()
            self._pool_free[i, j] = gu.pool_free()
            self._slots_free[i, j] = gu.slots_free()
            t = gu.tenant()
            self._tenant[i, j] = -1 if t is None else self.tenant_id(t)
            self._shared[i, j] = gu.rules.shared
            self._open[i, j] = t is None
            self._idle[i, j] = not gu.grants
            if gu.whole_holder is None:
                sizes = gu.rules.free_instance_sizes(gu)[:MAX_MIG_INSTANCES]
                if sizes:
                    self._mig_free[i, j, : len(sizes)] = sizes
            key = ((g.model or "").lower(), g.product.lower())
            kid = self._gpu_kinds.get(key)
            if kid is None:
                kid = self._gpu_kinds[key] = len(self._gpu_kinds)
                self._kind_gpus.append(g)
            self._kind[i, j] = kid
        cap = nu.node.cpu_milli if nu.node.cpu_milli is not None else UNLIMITED
        mcap = nu.node.memory_mib if nu.node.memory_mib is not None else UNLIMITED
        self._cpu_cap[i] = cap
        self._cpu_free[i] = cap - nu.cpu_used
        self._memcap[i] = mcap
        self._memfree[i] = mcap - nu.mem_used
        self._node_free[i] = int(self._pool_free[i].sum())
        self._version[i] += 1

    def mig_smallest_fit(self, vram_mib: int) -> np.ndarray:
        """[N, G] memory of the smallest free MIG instance >= vram_mib (0 where none / not MIG).

        Cached per VRAM size and refreshed only for nodes whose version moved: pod shapes repeat, and
        a placement changes one node, so the steady-state cost is a version compare.
        """
        n = len(self._nodes)
        versions = self._version[:n]
        hit = self._mig_fit_cache.get(vram_mib)
        if hit is not None and hit[0].shape == (n, self._g):
            table, seen = hit
            stale = np.flatnonzero(seen != versions)
        else:
            table = np.zeros((n, self._g), dtype=np.int64)
            stale = np.arange(n)
            if len(self._mig_fit_cache) >= 256:
                self._mig_fit_cache.pop(next(iter(self._mig_fit_cache)))
        if stale.size:
            sizes = self._mig_free[stale] if stale.size < n else self._mig_free[:n]
            best = np.where(sizes >= vram_mib, sizes, np.iinfo(np.int64).max).min(axis=2)
            table[stale] = np.where(best == np.iinfo(np.int64).max, 0, best)
        self._mig_fit_cache[vram_mib] = (table, versions.copy())
        return table

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
        if i != last:
            self._refresh(i)
        self._present[last] = False
        self._version[last] += 1
        return gone

    # ---------------------------------------------------------------- holders
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
            problem = self._double_booking(pod, gu, grant) if force else self.grant_problem(pod, gu, grant)
            if problem:
                raise PlacementError(f"{pod.key} on {nu.node.name} GPU {grant.index}: {problem}")

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
        if g.mode not in ALLOWED_MODES[pod.isolation]:
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
        self._refresh(i)
        return holder

    def confirm(self, pod_key: str) -> Holder | None:
        """A reserved holder's Binding succeeded: it now simply holds its units."""
        h = self._holders.get(pod_key)
        if h is not None and h.reserved:
            h = Holder(h.pod, h.assignment, reserved=False)
            self._holders[pod_key] = h
        return h

    def _drop(self, pod_key: str) -> Holder | None:
        h = self._holders.pop(pod_key, None)
        if h is None:
            return None
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
    def gpu_usage(self, node_name: str, index: int) -> GpuUsage:
        for gu in self.usage(node_name).gpus:
            if gu.gpu.index == index:
                return gu
        raise KeyError(f"{node_name} has no GPU {index}")

    def stranded_mib(self) -> int:
        """VRAM on GPUs in use that no pod holds and no new pod can get (whole GPUs, MIG leftovers)."""
        return sum(nu.stranded_mib() for nu in self._nodes)

    def node_stranded_mib(self, name: str) -> int:
        """`stranded_mib` of one node."""
        return self.usage(name).stranded_mib()

    def gpus_used(self) -> int:
        return int((self._present & ~self._idle).sum())


def row_count(mask: np.ndarray) -> np.ndarray:
    """Per-row count of True in an [N, G] bool array (G a multiple of 8, as in the state's views).

    Eight bools are eight bytes of 0/1, so a popcount of each 64-bit word counts them: several times
    faster than count_nonzero(axis=1) on the hot path.
    """
    if mask.ndim == 2 and mask.shape[1] % 8 == 0 and mask.flags.c_contiguous and mask.dtype == np.bool_:
        words = mask.view(np.uint64)
        counts = np.bitwise_count(words)
        return counts[:, 0] if counts.shape[1] == 1 else counts.sum(axis=1)
    return np.count_nonzero(mask, axis=1)


def gpu_model_allowed(gpu: Gpu, models: frozenset[str] | None) -> bool:
    """A pod's `vramfit.io/gpu-models` list matches the catalog model name or the GFD product string."""
    if not models:
        return True
    names = {(gpu.model or "").lower(), gpu.product.lower()}
    base = gpu.product.lower()
    for suffix in ("-shared",):
        if base.endswith(suffix):
            names.add(base[: -len(suffix)])
    if "-mig-" in base:
        names.add(base.split("-mig-")[0])
    names.discard("")
    return bool(names & models)
