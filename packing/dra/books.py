"""Allocations already written into claims, booked into the state: whoever wrote them (vramfit, kube-scheduler,
another allocator), every allocated device is used, shares by what they consume. This is how the books are
rebuilt after a restart or a failover: from the claims, never from memory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packing.dra.allocate import Ledger, holder_key
from packing.dra.capacity import memory_of
from packing.dra.nodes import DraInventory
from packing.dra.objects import Claim, ResultDevice
from packing.k8s.quantity import bytes_to_mib
from packing.model import Assignment, GpuGrant, Isolation, PodDemand
from packing.state import ClusterState, PlacementError


@dataclass(frozen=True)
class Booked:
    claim: str
    holders: tuple[str, ...]
    problems: tuple[str, ...]  # results not booked: device gone, or a unit booked twice


def _memory(result: ResultDevice) -> int | None:
    if result.consumed is None:
        return None
    mem = memory_of(result.consumed)
    return max(1, bytes_to_mib(mem)) if mem is not None else 1


def book_claim(state: ClusterState, inventory: DraInventory, ledger: Ledger, claim: Claim, tenant: str,
               isolation: Isolation = Isolation.NONE) -> Booked:
    """Book every result of `claim`'s allocation (forced: what is allocated is reality; a unit is still never
    booked twice). Results on devices vramfit does not read (another driver, a pool gone) are skipped."""
    if claim.allocation is None:
        return Booked(claim.ref.key, (), ())
    holders: list[str] = []
    problems: list[str] = []
    for r in claim.allocation.results:
        node = inventory.node_of(r.device)
        dnode = inventory.nodes.get(node or "")
        unit = dnode.units.get(r.device) if dnode is not None else None
        if unit is None or dnode is None or not state.has_node(dnode.node.name):
            continue
        gpu = dnode.node.gpus[unit.gpu]
        inst = gpu.instance(unit.mig) if unit.mig else None
        vram = _memory(r) or (inst.memory_mib if inst is not None else gpu.memory_mib)
        key = holder_key(claim.ref.key, r.request, r.device)
        demand = PodDemand(key=key, vram_mib=vram, gpu_count=1, tenant=tenant, isolation=isolation, uid=claim.uid)
        try:
            state.allocate(demand, Assignment(dnode.node.name, (GpuGrant(unit.gpu, vram, unit.mig, unit.whole),)),
                           force=True)
        except PlacementError as err:
            problems.append(str(err))
            continue
        if r.consumed is not None:
            ledger.take(key, r.device, dict(r.consumed))
        holders.append(key)
    return Booked(claim.ref.key, tuple(holders), tuple(problems))


def book_claims(state: ClusterState, inventory: DraInventory, ledger: Ledger, claims: Iterable[tuple[Claim, str]]
                ) -> list[Booked]:
    """Book many (claim, tenant) pairs."""
    return [book_claim(state, inventory, ledger, c, t) for c, t in claims]
