"""Allocate a pod's ResourceClaims: the node by the live policy's score, the devices by best fit, every unit
booked through `ClusterState.allocate` (which enforces isolation, tenancy and capacity for DRA units as for any
other), so a device is never over-committed and two tenants never share one.

Each allocated device is one holder in the state, keyed `claim:<namespace>/<claim>|<request>|<device>`: a claim may
take two instances of one GPU, which one holder could not hold; the prefix keeps it apart from any pod's key. A pod's claims all land on one node (the pod runs
there); a claim another pod already holds fixes that node."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from packing import cycle, fit
from packing.dra.capacity import memory_of
from packing.dra.eligibility import DeviceFit, RequestError
from packing.dra.index import EligibleIndex
from packing.dra.nodes import DraNode
from packing.dra.objects import Claim, Constraint, DeviceId, ExactRequest, Request
from packing.k8s.quantity import bytes_to_mib
from packing.model import Assignment, GpuGrant, Isolation, PodDemand
from packing.modes import WHOLE_GPU
from packing.modes.combine import combination_problem
from packing.policies.base import Policy
from packing.state import ClusterState, PlacementError

REFINE_NODES = 8  # the policy's best nodes compared by what the pod's devices would strand there
MAX_NODES_TRIED = 256  # ranked nodes tried before the pod is reported unallocated (a failed try is cheap)


HOLDER_PREFIX = "claim:"  # no pod key has a colon (namespace names are DNS labels)


def holder_key(claim_key: str, request: str, device: DeviceId) -> str:
    """One allocated device's holder: rebuilt the same from the claim's allocation after a restart."""
    return f"{HOLDER_PREFIX}{claim_key}|{request}|{device}"


def claim_of_holder(key: str) -> str | None:
    """The claim key of a DRA holder key; None for a pod's own key."""
    return key[len(HOLDER_PREFIX):].split("|", 1)[0] if key.startswith(HOLDER_PREFIX) else None


@dataclass(frozen=True)
class PodClaims:
    """A gated pod and the claims it waits for (those of managed classes not yet allocated)."""

    key: str
    uid: str
    tenant: str
    isolation: Isolation
    claims: tuple[Claim, ...]
    node: str | None = None  # the node its claims already allocated bind it to
    priority: int = 0
    created: float = 0.0
    cpu_milli: int = 0  # the pod's own requests: a node without room for them is not offered
    memory_mib: int = 0
    gpu_per_process: bool = False  # `vramfit.io/gpu-per-process`: each process picks its own device
    # The claim keys each container uses (`resources.claims`): one process sees all of a container's devices,
    # so those must be of one kind. Empty: every claim counts as one container's (the strict reading).
    containers: tuple[frozenset[str], ...] = ()


@dataclass(frozen=True)
class Pick:
    """One device given to one request of a claim."""

    request: str  # the result's request name (`<request>/<subrequest>` for firstAvailable)
    fit: DeviceFit
    holder: str


@dataclass(frozen=True)
class ClaimPicks:
    claim: Claim
    node: str
    picks: tuple[Pick, ...]


@dataclass(frozen=True)
class PodAllocation:
    pod: str
    node: str
    claims: tuple[ClaimPicks, ...]


@dataclass(frozen=True)
class Unallocated:
    pod: str
    reason: str


@dataclass
class Ledger:
    """Capacity consumed on shareable devices, every capacity (the state books memory and clients only)."""

    used: dict[DeviceId, dict[str, Fraction]] = field(default_factory=dict)
    by_holder: dict[str, tuple[DeviceId, dict[str, Fraction]]] = field(default_factory=dict)

    def room(self, fit_: DeviceFit) -> bool:
        assert fit_.consumed is not None
        used = self.used.get(fit_.device.id, {})
        return all(used.get(k, 0) + v <= fit_.device.capacity[k].value for k, v in fit_.consumed.items())

    def take(self, holder: str, device: DeviceId, consumed: dict[str, Fraction]) -> None:
        used = self.used.setdefault(device, {})
        for k, v in consumed.items():
            used[k] = used.get(k, 0) + v
        self.by_holder[holder] = (device, consumed)

    def give_back(self, holder: str) -> None:
        found = self.by_holder.pop(holder, None)
        if found is None:
            return
        used = self.used.get(found[0], {})
        for k, v in found[1].items():
            used[k] = used.get(k, 0) - v


@dataclass
class Allocator:
    """Places gated pods' claims on `state` (mutated: each placed device is booked) with `policy`."""

    state: ClusterState
    nodes: dict[str, DraNode]
    index: EligibleIndex
    policy: Policy
    ledger: Ledger = field(default_factory=Ledger)
    _rows_for: list[str] | None = field(default=None, repr=False)
    _rows_epoch: int = field(default=-1, repr=False)
    _rows_cache: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    def allocate(self, pod: PodClaims, prefer: str | None = None) -> PodAllocation | Unallocated:
        """Place the pod's claims: on `prefer` (a queue plan's node) when it takes them, else on the policy's
        ranking of the nodes that could."""
        wanted = self.wanted(pod)
        if isinstance(wanted, Unallocated):
            return wanted
        if prefer is not None and self.state.has_node(prefer) and prefer in self.nodes:
            got = self._on_node(pod, prefer, wanted)
            if isinstance(got, PodAllocation):
                return got
        tried: list[str] = []
        ranked = self._refined(pod, [n for n in self._ranked(pod, wanted) if n != prefer], wanted)
        for node in ranked:
            got = self._on_node(pod, node, wanted)
            if isinstance(got, PodAllocation):
                return got
            tried.append(f"{node}: {got}")
        if not tried:
            return Unallocated(pod.key, self._why_no_node(pod, wanted))
        return Unallocated(pod.key, f"no node takes every claim ({'; '.join(tried[:3])})")

    def wanted(self, pod: PodClaims) -> list[tuple[Claim, Request, list]] | Unallocated:
        """Each request of the pod's claims with its alternatives' eligible devices; Unallocated when one cannot
        be judged (unknown class, bad selector) or there is none."""
        try:
            wanted = [(c, r, [(alt, self.index.eligible(alt)) for alt in r.alternatives])
                      for c in pod.claims for r in c.requests]
        except RequestError as err:
            return Unallocated(pod.key, str(err))
        return wanted or Unallocated(pod.key, "no request to allocate")

    # ------------------------------------------------------------------ nodes
    def _ranked(self, pod: PodClaims, wanted: Sequence[tuple[Claim, Request, list]]) -> list[str]:
        mask = self._candidate_mask(pod, wanted)
        mask &= (self.state.cpu_free >= pod.cpu_milli) & (self.state.host_mem_free >= pod.memory_mib)
        probe = self.probe(pod, wanted)
        now = fit.feasible(self.state, probe, self.policy.whole_gpu).now & mask
        # The core's quick filter cannot read every DRA unit (a whole partitionable GPU): what it passes first,
        # then the rest of the candidates.
        self.policy.observe(probe)
        ranked = cycle.rank(self.state, probe, self.policy, now)[:MAX_NODES_TRIED].tolist()
        rest = np.flatnonzero(mask & ~now)[:max(0, MAX_NODES_TRIED - len(ranked))].tolist()
        return [self.state.node_at(i).name for i in ranked + rest]

    def _candidate_mask(self, pod: PodClaims, wanted: Sequence[tuple[Claim, Request, list]]) -> np.ndarray:
        """[N] over the state's rows: nodes where every request has enough eligible devices (any alternative)."""
        out = np.ones(len(self.state), dtype=bool)
        for _claim, _req, alts in wanted:
            here = np.zeros(len(self.state), dtype=bool)
            for alt, elig in alts:
                need = 1 if alt.all_devices else alt.count
                rows = self._rows(elig.per_node.table_nodes)
                enough = elig.per_node.counts >= max(need, 1)
                here[rows[enough & (rows >= 0)]] = True
            out &= here
        if pod.node is not None:
            only = np.zeros(len(self.state), dtype=bool)
            if self.state.has_node(pod.node):
                only[self.state.index_of(pod.node)] = True
            out &= only
        return out

    def _rows(self, table_nodes: list[str]) -> np.ndarray:
        """The state's row of each of the index's nodes (-1: not in the state), cached while neither changes."""
        if self._rows_for is not table_nodes or self._rows_epoch != self.state.rows_epoch:
            self._rows_cache = np.fromiter((self.state.index_of(n) if self.state.has_node(n) else -1
                                            for n in table_nodes), dtype=np.int64, count=len(table_nodes))
            self._rows_for, self._rows_epoch = table_nodes, self.state.rows_epoch
        return self._rows_cache

    def probe(self, pod: PodClaims, wanted: Sequence[tuple[Claim, Request, list]]) -> PodDemand:
        """The demand the policy ranks nodes by: as many GPUs as the pod's claims ask devices, each the smallest
        device it asks (exact for the common pod whose devices are alike), in its tenant and isolation."""
        sizes, count = [], 0
        for _c, _r, alts in wanted:
            alt, elig = alts[0]
            sizes.append(_asked_mib(alt) or elig.min_mib)
            count += 1 if alt.all_devices else alt.count
        return PodDemand(key=pod.key, vram_mib=max(1, min(sizes, default=1)), gpu_count=max(1, count),
                         tenant=pod.tenant, isolation=pod.isolation, uid=pod.uid, priority=pod.priority,
                         cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)

    def _why_no_node(self, pod: PodClaims, wanted: Sequence[tuple[Claim, Request, list]]) -> str:
        if pod.node is not None:
            return f"its claims already allocated bind it to node {pod.node}, which lacks devices for the rest"
        for claim, req, alts in wanted:
            if not any(elig.per_node for _alt, elig in alts):
                return f"claim {claim.ref.key} request {req.name}: no device in the cluster matches its class and selectors"
        return "no node has devices for all of its requests"

    # ------------------------------------------------------------------ one node
    def _on_node(self, pod: PodClaims, node: str, wanted: Sequence[tuple[Claim, Request, list]]
                 ) -> PodAllocation | str:
        """Every claim of the pod on `node`, or why not (nothing stays booked then)."""
        done: list[Pick] = []
        picks: dict[str, tuple[Pick, ...]] = {}
        for claim in pod.claims:
            reqs = [(r, alts) for c, r, alts in wanted if c is claim]
            got = _ClaimSearch(self, pod, node, claim, reqs, done).run()
            if isinstance(got, str):
                self._undo([p.holder for p in done])
                return f"claim {claim.ref.key}: {got}"
            done.extend(got)
            picks[claim.ref.key] = tuple(got)
        claims = tuple(ClaimPicks(c, node, picks.get(c.ref.key, ())) for c in pod.claims)
        return PodAllocation(pod.key, node, claims)

    def _book(self, node: str, pick: Pick, demand: PodDemand, grant: GpuGrant) -> str | None:
        """Book one device; why not, when it cannot be."""
        fit_ = pick.fit
        if fit_.consumed is not None and not self.ledger.room(fit_):
            return f"{fit_.device.id.device}: its capacity is consumed by other claims"
        try:
            self.state.allocate(demand, Assignment(node, (grant,)))
        except PlacementError as err:
            return f"{fit_.device.id.device}: {str(err).split(': ', 1)[-1]}"
        if fit_.consumed is not None:
            self.ledger.take(demand.key, fit_.device.id, fit_.consumed)
        return None

    def _options(self, pod: PodClaims, node: str, claim: Claim, alt: ExactRequest, fits: Sequence[DeviceFit]
                 ) -> list[tuple[DeviceFit, PodDemand, GpuGrant]]:
        return [option for _key, option in self._scored(pod, node, claim, alt, fits)]

    def _scored(self, pod: PodClaims, node: str, claim: Claim, alt: ExactRequest, fits: Sequence[DeviceFit]
                ) -> list[tuple[tuple[int, int, int, int, int, str], tuple[DeviceFit, PodDemand, GpuGrant]]]:
        """Every eligible device as (key, (fit, holder demand, grant)), best first: least VRAM stranded (a unit taken
        whole strands what the request does not use; a share strands nothing while others may join), a GPU that
        could be partitioned taken whole last (it could have held several MIG pods), the fullest share, GPUs in use
        before idle ones (an idle GPU stays whole for a pod that needs one)."""
        dnode = self.nodes[node]
        usage = self.state.usage(node)
        asked = _asked_mib(alt)
        scored = []
        for fit_ in fits:
            unit = dnode.units[fit_.device.id]
            gu = usage.gpus[unit.gpu]
            inst = gu.gpu.instance(unit.mig) if unit.mig else None
            vram = _booked_mib(alt, fit_, gu.gpu.memory_mib, inst)
            demand = PodDemand(key=holder_key(claim.ref.key, alt.name, fit_.device.id), vram_mib=vram, gpu_count=1,
                               tenant=pod.tenant, isolation=pod.isolation, uid=pod.uid, priority=pod.priority)
            grant = GpuGrant(unit.gpu, vram, mig=unit.mig, whole=unit.whole)
            if fit_.consumed is not None:
                stranded, pool = 0, gu.gpu.memory_mib - gu.used_mib - vram
            else:
                stranded, pool = (inst.memory_mib if inst is not None else gu.gpu.memory_mib) - (asked or vram), 0
            scored.append(((stranded, int(unit.whole), pool, 0 if gu.grants else 1, unit.gpu, fit_.device.id.device),
                           (fit_, demand, grant)))
        scored.sort(key=lambda s: s[0])
        return scored

    def _node_cost(self, pod: PodClaims, node: str, wanted: Sequence[tuple[Claim, Request, list]]) -> int | None:
        """Partitionable GPUs the pod's best devices would take whole on the node now; None when a request has no
        device free there."""
        usage = self.state.usage(node)
        whole = 0
        for claim, _req, alts in wanted:
            alt, elig = alts[0]
            best = next((key for key, (fit_, demand, grant) in
                         self._scored(pod, node, claim, alt, elig.per_node.get(node, ()))
                         if (fit_.consumed is None or self.ledger.room(fit_))
                         and self.state.grant_problem(demand, usage.gpus[grant.index], grant) is None), None)
            if best is None:
                return None
            whole += best[1] * (1 if alt.all_devices else alt.count)
        return whole

    def _refined(self, pod: PodClaims, order: list[str], wanted: Sequence[tuple[Claim, Request, list]]) -> list[str]:
        """The policy's first `REFINE_NODES` nodes, those where the pod would take a partitionable GPU whole (the
        policy's probe sees room for MIG pods there, which the whole device then takes) and those it cannot use
        after the others, the policy's order otherwise. Measured: `python -m benchmarks dra --parts a`
        (benchmarks/results/dra.md); ordering by VRAM stranded as well placed fewer pods on the trace scenario."""
        head = order[:REFINE_NODES]
        costs = {n: self._node_cost(pod, n, wanted) for n in head}
        head.sort(key=lambda n: (costs[n] is None, costs[n] or 0))
        return head + order[REFINE_NODES:]

    def _undo(self, holders: Iterable[str]) -> None:
        for h in holders:
            self.state.release(h)
            self.ledger.give_back(h)

    def release_claim(self, claim_key: str) -> None:
        """Drop every device a claim holds from the books."""
        self._undo([h.pod.key for h in self.state.holders() if claim_of_holder(h.pod.key) == claim_key])


def _asked_mib(alt: ExactRequest) -> int:
    """The memory a request asks, MiB (0: none asked)."""
    asked = memory_of(alt.capacity)
    return bytes_to_mib(asked) if asked is not None else 0


def _booked_mib(alt: ExactRequest, fit_: DeviceFit, gpu_mib: int, instance: object) -> int:
    """VRAM the books hold for one device: a share's consumed memory; a whole device's or instance's memory."""
    if fit_.consumed is not None:
        mem = memory_of(fit_.consumed)
        return max(1, bytes_to_mib(mem)) if mem is not None else 1
    inst_mib = getattr(instance, "memory_mib", None)
    return int(inst_mib) if inst_mib is not None else gpu_mib


def _named(request: str, names: tuple[str, ...]) -> bool:
    """A constraint's `requests` name a request or one subrequest (`<request>/<subrequest>`); empty: all."""
    return not names or request in names or request.split("/")[0] in names


def _constraints_hold(constraints: tuple[Constraint, ...], request: str, fit_: DeviceFit,
                      taken: list[Pick]) -> bool:
    for c in constraints:
        if not _named(request, c.requests):
            continue
        others = [p for p in taken if _named(p.request, c.requests)]
        if c.match_attribute is not None:
            mine = fit_.device.attribute(c.match_attribute)
            if mine is None or any(p.fit.device.attribute(c.match_attribute) != mine for p in others):
                return False
        if c.distinct_attribute is not None:
            mine = fit_.device.attribute(c.distinct_attribute)
            if mine is None or any(p.fit.device.attribute(c.distinct_attribute) == mine for p in others):
                return False
    return True



SEARCH_BUDGET = 256  # devices tried per claim and node beyond the first choice (backtracking is rarely needed)


class _ClaimSearch:
    """One claim's requests on one node: each request's alternatives in order, its devices best first, and on a
    dead end (a constraint, a count) back to the last choice — as kube-scheduler's allocator backtracks —
    within `SEARCH_BUDGET` tries."""

    def __init__(self, alloc: Allocator, pod: PodClaims, node: str, claim: Claim,
                 reqs: list[tuple[Request, list]], prior: list[Pick]) -> None:
        self.alloc, self.pod, self.node, self.claim, self.reqs = alloc, pod, node, claim, reqs
        self.prior = prior  # the devices the pod's earlier claims got on this node
        self.budget = SEARCH_BUDGET
        self.taken: list[Pick] = []
        self.why: list[str] = []

    def run(self) -> list[Pick] | str:
        if self._request(0):
            return list(self.taken)
        self.alloc._undo([p.holder for p in self.taken])
        return "; ".join(dict.fromkeys(self.why[:3])) or "no device free"

    def _mixed(self, picks: list[Pick]) -> str | None:
        """Why one container may not hold these devices together (the core's hardware truths: one kind of unit);
        the devices are the new pick (last) and those of the claims a container uses beside this one."""
        mine = self.claim.ref.key
        groups: list[frozenset[str] | None] = [g for g in self.pod.containers if mine in g]
        if not self.pod.containers:
            groups = [None]
        for group in groups:
            seen = [p for p in picks if group is None or claim_of_holder(p.holder) in group]
            problem = self._kind_problem(seen)
            if problem is not None:
                return problem
        return None

    def _kind_problem(self, picks: list[Pick]) -> str | None:
        if len(picks) < 2:
            return None
        dnode = self.alloc.nodes[self.node]
        gpus = self.alloc.state.usage(self.node).gpus
        units = [dnode.units[p.fit.device.id] for p in picks]
        return combination_problem([WHOLE_GPU if u.whole else gpus[u.gpu].rules for u in units],
                                   self.pod.gpu_per_process)

    def _request(self, i: int) -> bool:
        if i == len(self.reqs):
            return True
        req, alts = self.reqs[i]
        for alt, elig in alts:
            fits = elig.per_node.get(self.node, ())
            need = len(fits) if alt.all_devices else alt.count
            if need == 0 or len(fits) < need:
                self.why.append(f"request {alt.name}: {len(fits)} eligible devices here, {need} needed")
                continue
            options = self.alloc._options(self.pod, self.node, self.claim, alt, fits)
            if self._devices(i, alt, options, 0, need):
                return True
        return False

    def _devices(self, i: int, alt: ExactRequest, options: list[tuple[DeviceFit, PodDemand, GpuGrant]],
                 start: int, need: int) -> bool:
        if need == 0:
            return self._request(i + 1)
        for k in range(start, len(options) - need + 1):
            if self.budget <= 0:
                return False
            fit_, demand, grant = options[k]
            pick = Pick(alt.name, fit_, demand.key)
            if not _constraints_hold(self.claim.constraints, alt.name, fit_, self.taken):
                continue
            mixed = self._mixed([*self.prior, *self.taken, pick])
            if mixed is not None:
                self.why.append(mixed)
                continue
            self.budget -= 1
            why = self.alloc._book(self.node, pick, demand, grant)
            if why is not None:
                self.why.append(why)
                continue
            self.taken.append(pick)
            if self._devices(i, alt, options, k + 1, need - 1):
                return True
            self.taken.pop()
            self.alloc._undo([pick.holder])
        return False
