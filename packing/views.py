"""The state's numpy views: one row per node, one column per GPU slot, refreshed from the books on every
change of a node, so scoring reads arrays and never walks objects. `ClusterState` is a `StateViews`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from packing.model import Gpu, Isolation
from packing.modes import MODE_CODE, MODES, UNLIMITED, ModeRules, mode_rules
from packing.usage import NodeUsage, gpu_model_allowed


def mode_table(fact: Callable[[ModeRules], bool]) -> np.ndarray:
    """[modes + 1] bool: `fact` of each mode, indexed by the `mode` array's codes; the extra last entry
    (code -1) is "no GPU here" and always False."""
    return np.array([fact(mode_rules(m)) for m in MODES] + [False], dtype=bool)


INSTANCED_CODE = mode_table(lambda r: r.instanced)  # grants name a hardware instance (MIG)
TAKES_WHOLE_CODE = mode_table(lambda r: r.takes_whole)  # a grant takes the whole GPU (exclusive)
SHARED_CODE = mode_table(lambda r: r.shared)  # one failure domain: one tenant per GPU
# Per isolation level: the modes it may use.
ALLOWED_CODE: dict[Isolation, np.ndarray] = {iso: mode_table(partial(ModeRules.admits, isolation=iso))
                                            for iso in Isolation}
MAX_MIG_INSTANCES = 8  # 7 on the 7-way parts, 4 on A30/RTX PRO; padded to 8



class StateViews:
    """The arrays and the ids they hold (tenants, GPU kinds); `_refresh(i)` rewrites row i from `_nodes[i]`."""

    _nodes: list[NodeUsage]

    def __init__(self, max_gpus: int = 8) -> None:
        self._nodes = []
        self._tenant_ids: dict[str, int] = {}
        self._gpu_kinds: dict[tuple[str, str], int] = {}  # (model, product) -> id, for model filters
        self._kind_gpus: list[Gpu] = []  # one representative GPU per kind id
        self._kinds_cache: dict[tuple[frozenset[str] | None, int], np.ndarray] = {}
        self._mig_fit_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._g = -(-max(max_gpus, 1) // 8) * 8  # multiples of 8: see row_count
        self._alloc_arrays(0)

    # ----------------------------------------------------------------- arrays
    _present: np.ndarray
    _vram: np.ndarray
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
    _pooled: np.ndarray
    _cpu_free: np.ndarray
    _cpu_cap: np.ndarray
    _host_mem_free: np.ndarray
    _host_mem_cap: np.ndarray
    _version: np.ndarray
    _node_free: np.ndarray

    # name -> (per-GPU?, dtype, fill). One list drives allocation, growth and the public views, so a new
    # array can never be forgotten when the state grows.
    _ARRAYS: dict[str, tuple[str, type, int]] = {
        "present": ("gpu", bool, 0), "vram": ("gpu", np.int64, 0), "mode": ("gpu", np.int8, -1),
        "unit_max": ("gpu", np.int64, 0), "unit_cap": ("gpu", np.int64, 0), "pool_free": ("gpu", np.int64, 0),
        "slots_free": ("gpu", np.int64, 0), "tenant": ("gpu", np.int32, -1), "idle": ("gpu", bool, 0),
        "kind": ("gpu", np.int32, -1), "mig_free": ("mig", np.int64, 0), "shared": ("gpu", bool, 0),
        "open": ("gpu", bool, 0), "pooled": ("gpu", bool, 0), "cpu_free": ("node", np.int64, 0), "cpu_cap": ("node", np.int64, 0),
        "host_mem_free": ("node", np.int64, 0), "host_mem_cap": ("node", np.int64, 0), "version": ("node", np.int64, 0),
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
    def vram(self) -> np.ndarray:
        """VRAM per GPU, MiB"""
        return self._vram[: len(self._nodes)]

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
    def pooled(self) -> np.ndarray:
        """pods draw VRAM from one pool (`ModeRules.pooled`: time-slicing, pinned MPS)"""
        return self._pooled[: len(self._nodes)]

    @property
    def cpu_free(self) -> np.ndarray:
        """free CPU millicores"""
        return self._cpu_free[: len(self._nodes)]

    @property
    def cpu_cap(self) -> np.ndarray:
        """allocatable CPU millicores"""
        return self._cpu_cap[: len(self._nodes)]

    @property
    def host_mem_free(self) -> np.ndarray:
        """free host memory per node, MiB (UNLIMITED when untracked)"""
        return self._host_mem_free[: len(self._nodes)]

    @property
    def host_mem_cap(self) -> np.ndarray:
        """allocatable host memory per node, MiB"""
        return self._host_mem_cap[: len(self._nodes)]

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
        for arr in (self._vram, self._unit_max, self._unit_cap, self._pool_free, self._slots_free):
            arr[i] = 0
        self._idle[i] = False
        self._shared[i] = False
        self._open[i] = False
        self._pooled[i] = False
        self._mig_free[i] = 0
        for j, gu in enumerate(nu.gpus):
            g = gu.gpu
            self._present[i, j] = True
            self._vram[i, j] = g.memory_mib
            self._mode[i, j] = MODE_CODE[g.mode]
            self._unit_max[i, j] = gu.unit_max()
            self._unit_cap[i, j] = gu.unit_cap()
            self._pool_free[i, j] = gu.pool_free()
            self._slots_free[i, j] = gu.slots_free()
            t = gu.tenant()
            self._tenant[i, j] = -1 if t is None else self.tenant_id(t)
            self._shared[i, j] = gu.rules.shared
            self._open[i, j] = t is None
            self._pooled[i, j] = gu.rules.pooled(gu)
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
        self._host_mem_cap[i] = mcap
        self._host_mem_free[i] = mcap - nu.mem_used
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

