"""kube-scheduler's own DRA allocation, emulated: the baseline vramfit's allocator is measured against.

Devices (dra.md §6; kubernetes/dynamic-resource-allocation `structured/internal/incubating/
allocator_incubating.go` `allocateOne`/`allocateDevice`, `pools_incubating.go` `sortPoolsByID`/
`sortSlicesByName`): per candidate node, pools sorted by driver then pool name, each pool's slices by name,
devices in the order the slice lists them; claims in order, requests in order, a request's next device searched
after the one just taken, backtracking on failure; the first complete solution wins; no device scoring.
Eligibility (class and request selectors, taints, capacity requests, KEP-5075 consumption) is vramfit's own
rule (`packing.dra.eligibility.device_fit`, `packing.dra.capacity.consumption`): one rule, one place. In use: an
exclusive device once; a shareable device while its consumed capacity fits; counters of a partitionable device
charged when it is taken (a shareable one only by its first share, as upstream skips the check then).

Nodes: the default profile scores nodes by NodeResourcesFit (LeastAllocated, cpu and memory, weight 1) and
NodeResourcesBalancedAllocation (weight 1); neither sees DRA devices, and pods without a request count 100m CPU
and 200 MiB (schedutil's non-zero defaults). Among the nodes with the highest total, kube-scheduler's
`selectHost` picks uniformly at random; a seeded RNG does that here (lowest name would pack toward one end of
the cluster, which upstream does not). `percentageOfNodesToScore` is taken as 100 % (every feasible node
scored). Bookings go to this module's own `FirstFitLedger`, never to vramfit's state.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from packing.dra.allocate import Pick, _constraints_hold
from packing.dra.eligibility import DeviceFit, RequestError, SelectorCache, device_fit, request_selectors
from packing.dra.objects import Claim, Device, DeviceClass, DeviceId, ExactRequest, Request
from packing.dra.parse import slice_devices

DEFAULT_CPU_MILLI = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_MIB = 200  # schedutil.DefaultMemoryRequest (200 MB), in MiB
MAX_STEPS = 100_000  # backtracking steps per node before giving up (upstream has only the context's timeout)


@dataclass
class FirstFitLedger:
    """What first fit has handed out: exclusive devices, consumed capacity of shared ones, counters used."""

    exclusive: set[DeviceId] = field(default_factory=set)
    consumed: dict[DeviceId, dict[str, Fraction]] = field(default_factory=dict)
    counters: dict[tuple[str, str, str], dict[str, Fraction]] = field(default_factory=dict)

    def free(self, fit: DeviceFit, sets: Mapping[str, Mapping[str, Fraction]]) -> bool:
        dev = fit.device
        if dev.id in self.exclusive:
            return False
        used = self.consumed.get(dev.id)
        if fit.consumed is not None:
            if used is not None and any(used.get(k, 0) + v > dev.capacity[k].value for k, v in fit.consumed.items()):
                return False
            if used:
                return True  # counters were charged by the first share
        elif used:
            return False
        return self._counters_free(dev, sets)

    def _counters_free(self, dev: Device, sets: Mapping[str, Mapping[str, Fraction]]) -> bool:
        for use in dev.consumes:
            have = sets.get(use.counter_set, {})
            used = self.counters.get((dev.id.driver, dev.id.pool, use.counter_set), {})
            if any(used.get(k, 0) + v > have.get(k, 0) for k, v in use.counters):
                return False
        return True

    def take(self, fit: DeviceFit) -> None:
        dev = fit.device
        first = not self.consumed.get(dev.id)
        if fit.consumed is None:
            self.exclusive.add(dev.id)
        else:
            used = self.consumed.setdefault(dev.id, {})
            for k, v in fit.consumed.items():
                used[k] = used.get(k, 0) + v
        if fit.consumed is None or first:
            self._charge(dev, 1)

    def give_back(self, fit: DeviceFit) -> None:
        dev = fit.device
        if fit.consumed is None:
            self.exclusive.discard(dev.id)
            self._charge(dev, -1)
            return
        used = self.consumed.get(dev.id, {})
        for k, v in fit.consumed.items():
            used[k] = used.get(k, 0) - v
        if not any(used.values()):
            self.consumed.pop(dev.id, None)
            self._charge(dev, -1)

    def _charge(self, dev: Device, sign: int) -> None:
        for use in dev.consumes:
            c = self.counters.setdefault((dev.id.driver, dev.id.pool, use.counter_set), {})
            for k, v in use.counters:
                c[k] = c.get(k, 0) + sign * v


@dataclass(frozen=True)
class NodeDevices:
    """One node's devices in first fit's search order, and its pools' counter sets."""

    devices: tuple[Device, ...]
    counter_sets: dict[tuple[str, str], dict[str, dict[str, Fraction]]]  # (driver, pool) -> set -> counters


def search_order(slices: Iterable[Mapping[str, Any]]) -> dict[str, NodeDevices]:
    """Node -> devices as upstream walks them: newest complete generation of each node-local pool, pools by
    (driver, pool), slices by name, devices as listed."""
    pools: dict[tuple[str, str], list[tuple[str, int, int, str | None, tuple[Device, ...], dict]]] = {}
    for obj in slices:
        driver, pool, gen, count, node, devices, counters = slice_devices(obj)
        pools.setdefault((driver, pool), []).append((str(obj["metadata"]["name"]), gen, count, node, devices,
                                                     counters))
    per_node: dict[str, tuple[list[Device], dict[tuple[str, str], dict[str, dict[str, Fraction]]]]] = {}
    for (driver, pool), got in sorted(pools.items()):
        newest = max(g[1] for g in got)
        current = sorted((g for g in got if g[1] == newest), key=lambda g: g[0])
        node = current[0][3]
        if node is None or len(current) < current[0][2]:
            continue  # not node-local, or incomplete: upstream allocates nothing from it
        devs, sets = per_node.setdefault(node, ([], {}))
        for _name, _gen, _count, _node, devices, counters in current:
            devs.extend(devices)
            sets.setdefault((driver, pool), {}).update(counters)
    return {n: NodeDevices(tuple(d), s) for n, (d, s) in sorted(per_node.items())}


@dataclass(frozen=True)
class FirstFitPick:
    claim: str
    request: str
    fit: DeviceFit


@dataclass
class FirstFit:
    """Places pods' claims as kube-scheduler would: `place(claims, cpu, mem)` -> (node, picks) or None."""

    nodes: dict[str, NodeDevices]
    classes: dict[str, DeviceClass]
    host_cpu: dict[str, int]  # allocatable CPU (milli) per node
    host_mem: dict[str, int | None]  # allocatable memory (MiB) per node; None: not scored or filtered
    seed: int = 0
    ledger: FirstFitLedger = field(default_factory=FirstFitLedger)
    cache: SelectorCache = field(default_factory=SelectorCache)
    _fits: dict[tuple[object, ...], dict[DeviceId, DeviceFit | None]] = field(default_factory=dict)
    _failed: dict[tuple[str, object], int] = field(default_factory=dict)  # (node, claims' shape) -> node version
    _version: dict[str, int] = field(default_factory=dict)  # bumped whenever first fit books on the node

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.names = sorted(set(self.nodes) | set(self.host_cpu))
        self.cpu_alloc = np.array([self.host_cpu.get(n, 0) for n in self.names], dtype=np.float64)
        mem = [self.host_mem.get(n) for n in self.names]
        self.has_mem = np.array([m is not None for m in mem])
        self.mem_alloc = np.array([m or 0 for m in mem], dtype=np.float64)
        self.cpu_req = np.zeros(len(self.names))  # requests as filtered
        self.mem_req = np.zeros(len(self.names))
        self.cpu_score_req = np.zeros(len(self.names))  # requests with the non-zero defaults, as scored
        self.mem_score_req = np.zeros(len(self.names))

    # ------------------------------------------------------------------ nodes
    def scores(self, cpu: int, mem: int) -> np.ndarray:
        """NodeResourcesFit LeastAllocated + BalancedAllocation per node (integers, as kube-scheduler's)."""
        c = self.cpu_score_req + (cpu or DEFAULT_CPU_MILLI)
        m = self.mem_score_req + (mem or DEFAULT_MEMORY_MIB)
        with np.errstate(divide="ignore", invalid="ignore"):
            fc = np.where(self.cpu_alloc > 0, c / self.cpu_alloc, 1.0)
            fm = np.where(self.mem_alloc > 0, m / self.mem_alloc, 1.0)
        least_c = np.floor(np.clip(1 - fc, 0, 1) * 100)
        least_m = np.floor(np.clip(1 - fm, 0, 1) * 100)
        least = np.where(self.has_mem, np.floor((least_c + least_m) / 2), least_c)
        balanced = np.where(self.has_mem, np.floor((1 - np.abs(np.minimum(fc, 1) - np.minimum(fm, 1)) / 2) * 100),
                            100.0)
        return least + balanced

    def _order(self, cpu: int, mem: int) -> list[int]:
        fits = (self.cpu_alloc - self.cpu_req >= cpu) & (~self.has_mem | (self.mem_alloc - self.mem_req >= mem))
        score = self.scores(cpu, mem)
        idx = np.flatnonzero(fits)
        tie = np.array([self.rng.random() for _ in range(len(idx))])
        return [int(i) for i in idx[np.lexsort((tie, -score[idx]))]]

    def place(self, claims: Sequence[Claim], cpu: int = 0, mem: int = 0) -> tuple[str, list[FirstFitPick]] | None:
        """The node and devices kube-scheduler would give a pod with these claims; booked. None: unschedulable."""
        shape = _shape(claims)
        for i in self._order(cpu, mem):
            name = self.names[i]
            # The search is a pure function of the node's bookings: a shape that failed on an unchanged node fails.
            if self._failed.get((name, shape)) == self._version.get(name, 0):
                continue
            picks = self.allocate_on(name, claims) if claims else []
            if picks is None:
                self._failed[(name, shape)] = self._version.get(name, 0)
                continue
            for p in picks:
                self.ledger.take(p.fit)
            self._version[name] = self._version.get(name, 0) + 1
            self._book_host(i, cpu, mem, 1)
            return name, picks
        return None

    def _book_host(self, i: int, cpu: int, mem: int, sign: int) -> None:
        self.cpu_req[i] += sign * cpu
        self.mem_req[i] += sign * mem
        self.cpu_score_req[i] += sign * (cpu or DEFAULT_CPU_MILLI)
        self.mem_score_req[i] += sign * (mem or DEFAULT_MEMORY_MIB)

    # ------------------------------------------------------------------ devices on one node
    def _fit(self, req: ExactRequest, dev: Device) -> DeviceFit | None:
        selectors = request_selectors(req, self.classes)
        key = (selectors, tuple(sorted(req.capacity.items())))
        per = self._fits.setdefault(key, {})
        if dev.id not in per:
            per[dev.id] = device_fit(req, dev, selectors, self.cache)
        return per[dev.id]

    def allocate_on(self, node: str, claims: Sequence[Claim]) -> list[FirstFitPick] | None:
        """Upstream's search on one node: the first complete solution, or None. Nothing is booked."""
        nd = self.nodes.get(node)
        if nd is None:
            return None
        todo = [(c, r) for c in claims for r in c.requests]
        steps = [0]
        try:
            return _Search(self, nd, todo, steps).run()
        except RequestError:
            return None


def _shape(claims: Sequence[Claim]) -> object:
    """What the search reads of a pod's claims (names aside)."""
    return tuple((tuple((a.device_class, a.selectors, tuple(sorted(a.capacity.items())), a.count, a.all_devices)
                        for r in c.requests for a in r.alternatives), c.constraints) for c in claims)


@dataclass
class _Search:
    ff: FirstFit
    nd: NodeDevices
    todo: list[tuple[Claim, Request]]
    steps: list[int]

    def run(self) -> list[FirstFitPick] | None:
        chosen: list[FirstFitPick] = []
        ok = self._request(0, chosen)
        for p in chosen:  # the search books tentatively; the caller books the solution
            self.ff.ledger.give_back(p.fit)
        return chosen if ok else None

    def _request(self, r: int, chosen: list[FirstFitPick]) -> bool:
        if r == len(self.todo):
            return True
        _claim, req = self.todo[r]
        for alt in req.alternatives:  # firstAvailable: subrequests in order
            need = self._count(alt)
            if need and self._device(r, alt, need, 0, chosen):
                return True
        return False

    def _count(self, alt: ExactRequest) -> int:
        if not alt.all_devices:
            return alt.count
        return sum(1 for d in self.nd.devices if self.ff._fit(alt, d) is not None)

    def _device(self, r: int, alt: ExactRequest, need: int, start: int, chosen: list[FirstFitPick]) -> bool:
        if need == 0:
            return self._request(r + 1, chosen)
        claim = self.todo[r][0]
        devices = self.nd.devices
        for j in range(start, len(devices)):
            self.steps[0] += 1
            if self.steps[0] > MAX_STEPS:
                return False
            fit = self.ff._fit(alt, devices[j])
            if fit is None or not self._free(fit) or not self._constraints(claim, alt, fit, chosen):
                continue
            self.ff.ledger.take(fit)  # tentatively, so later requests see it (upstream's allocatingDevices)
            chosen.append(FirstFitPick(claim.ref.key, alt.name, fit))
            if self._device(r, alt, need - 1, j + 1, chosen):
                return True
            chosen.pop()
            self.ff.ledger.give_back(fit)
        return False

    def _free(self, fit: DeviceFit) -> bool:
        dev = fit.device.id
        return self.ff.ledger.free(fit, self.nd.counter_sets.get((dev.driver, dev.pool), {}))

    @staticmethod
    def _constraints(claim: Claim, alt: ExactRequest, fit: DeviceFit, chosen: list[FirstFitPick]) -> bool:
        if not claim.constraints:
            return True
        mine = [Pick(p.request, p.fit, "") for p in chosen if p.claim == claim.ref.key]
        return _constraints_hold(claim.constraints, alt.name, fit, mine)
