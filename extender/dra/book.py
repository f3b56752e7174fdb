"""The store's DRA part: the watched ResourceSlices, DeviceClasses, ResourceClaims and templates, the DRA nodes
they make in the store's one `ClusterState` (beside device-plugin nodes), and every allocated claim booked there.

All methods run under the store's lock (`Store.replace` / `apply` call them). The books are rebuilt from the
claims' allocations on every list, so a restart or a failover loses nothing: what is allocated is in the API."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packing.catalog import Catalog
from packing.dra.allocate import Ledger, claim_of_holder
from packing.dra.books import book_claim
from packing.dra.index import EligibleIndex
from packing.dra.nodes import DraInventory, combine, dra_inventory, with_host
from packing.dra.objects import Claim, DeviceClass
from packing.dra.parse import claim as parse_claim
from packing.dra.parse import device_class
from packing.k8s.inventory import node_from_k8s
from packing.k8s.trust import Tenancy
from packing.model import InputError, Node
from packing.state import ClusterState

log = logging.getLogger("vramfit.dra")


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass
class DraBook:
    catalog: Catalog
    managed: frozenset[str]  # the DeviceClasses vramfit allocates
    warn: Callable[[str], None] = log.warning
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    class_objs: dict[str, dict[str, Any]] = field(default_factory=dict)
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    claim_objs: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    inventory: DraInventory = field(default_factory=lambda: DraInventory({}, {}, (), ()))
    ledger: Ledger = field(default_factory=Ledger)
    booked: dict[str, tuple[str, ...]] = field(default_factory=dict)  # claim key -> its holders in the state
    inflight: dict[str, str] = field(default_factory=dict)  # claim key -> node: allocated, not yet seen written
    index: EligibleIndex | None = None
    _per_node: dict[str, DraInventory] = field(default_factory=dict)  # each node's own slices read
    waiting: dict[str, str] = field(default_factory=dict)  # pod key -> why it keeps its gate (the allocator's)
    version: int = 0  # bumped when devices, classes or claims change: the allocator's wake-up

    def classes_of(self, namespace: str, entry: Any) -> frozenset[str] | None:
        """The DeviceClasses a pod's `spec.resourceClaims` entry asks for; None: its claim or template is not
        known yet (the webhook's `ClassLookup`)."""
        if entry.get("resourceClaimName"):
            c = self.claims.get(f"{namespace}/{entry['resourceClaimName']}")
            return None if c is None else frozenset(a.device_class for r in c.requests for a in r.alternatives)
        template = self.templates.get(f"{namespace}/{entry.get('resourceClaimTemplateName')}")
        if template is None:
            return None
        requests = ((((template.get("spec") or {}).get("spec") or {}).get("devices") or {}).get("requests") or ())
        return frozenset(str(x.get("deviceClassName")) for r in requests
                         for x in [r.get("exactly") or {}, *(r.get("firstAvailable") or ())] if x.get("deviceClassName"))

    def owns(self, node: str) -> bool:
        return node in self.inventory.nodes

    # ---- events ----------------------------------------------------------------------------------
    def replace(self, kind: str, items: list[dict[str, Any]], state: ClusterState, hosts: dict[str, dict[str, Any]],
                tenancy: Tenancy) -> None:
        table = self._table(kind)
        table.clear()
        for obj in items:
            table[_key(obj)] = obj
        self._after(kind, state, hosts, tenancy, full=True)

    def apply(self, kind: str, event_type: str, obj: dict[str, Any], state: ClusterState,
              hosts: dict[str, dict[str, Any]], tenancy: Tenancy) -> None:
        table = self._table(kind)
        old = table.pop(_key(obj), None)
        if event_type != "DELETED":
            table[_key(obj)] = obj
        nodes = {str(((o or {}).get("spec") or {}).get("nodeName") or "") for o in (old, obj)}
        for node in sorted(nodes) if kind == "resourceslices" else [None]:
            self._after(kind, state, hosts, tenancy, full=False, changed=_key(obj), node=node)

    def _table(self, kind: str) -> dict[str, dict[str, Any]]:
        return {"resourceslices": self.slices, "deviceclasses": self.class_objs, "resourceclaims": self.claim_objs,
                "resourceclaimtemplates": self.templates}[kind]

    def _after(self, kind: str, state: ClusterState, hosts: dict[str, dict[str, Any]], tenancy: Tenancy, *,
               full: bool, changed: str | None = None, node: str | None = None) -> None:
        self.version += 1
        if kind == "resourceslices":
            self._rebuild_nodes(state, hosts, tenancy, None if full else {node or ""})
        elif kind == "deviceclasses":
            self._read_classes()
        elif kind == "resourceclaims":
            if full:
                self._read_claims(list(self.claim_objs))
            elif changed is not None:
                self._read_claims([changed])
            self.book(state, tenancy, only=None if full else changed)

    # ---- devices ---------------------------------------------------------------------------------
    def _rebuild_nodes(self, state: ClusterState, hosts: dict[str, dict[str, Any]], tenancy: Tenancy,
                       dirty: set[str] | None = None) -> None:
        """Re-read the nodes whose slices changed (`dirty`; None: all) and put them in the state."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for obj in self.slices.values():
            by_node.setdefault(str((obj.get("spec") or {}).get("nodeName") or ""), []).append(obj)
        names = set(by_node) - {""} if dirty is None else dirty
        if dirty is None:
            self._per_node.clear()
        for name in names:
            if name in by_node:
                self._per_node[name] = dra_inventory(by_node[name], self.catalog)
            else:
                self._per_node.pop(name, None)
        before = set(self.inventory.nodes)
        self.inventory = combine(self._per_node.values(), unplaced=len(by_node.get("", ())))
        for problem in (p for name in names if name in self._per_node for p in self._per_node[name].problems):
            self.warn(problem)
        if self.index is None:
            self.index = EligibleIndex(self.inventory, self.classes)
        else:
            self.index.rebase(self.inventory, self.classes)
        for name in sorted(before - set(self.inventory.nodes)):
            if state.has_node(name):
                self._drop_holders(state.remove_node(name))
        for name in sorted(names & set(self.inventory.nodes)):
            self.sync_host(name, state, hosts.get(name))
        self.book(state, tenancy)

    def sync_host(self, name: str, state: ClusterState, host_obj: dict[str, Any] | None) -> None:
        """Put DRA node `name` in the state with its Node object's host side (CPU, memory, labels)."""
        node = with_host(self.inventory.nodes[name].node, self._host(host_obj))
        if state.has_node(name) and state.node(name) == node:
            return
        self._drop_holders(state.upsert_node(node))

    def _host(self, obj: dict[str, Any] | None) -> Node | None:
        if obj is None:
            return None
        try:
            return node_from_k8s(dict(obj), self.catalog)
        except InputError:
            return None  # its GPU labels say something odd; DRA's devices are what counts here

    def _drop_holders(self, holders: list[Any]) -> None:
        """Holders a node change dropped: their claims are booked again on the next `book`."""
        for h in holders:
            claim = claim_of_holder(h.pod.key)
            if claim is not None:
                self.unbook(claim, None)

    # ---- classes and claims ----------------------------------------------------------------------
    def _read_classes(self) -> None:
        classes: dict[str, DeviceClass] = {}
        for obj in self.class_objs.values():
            try:
                c = device_class(obj)
            except InputError as err:
                self.warn(str(err))
                continue
            classes[c.name] = c
        self.classes = classes
        if self.index is not None:
            self.index.rebase(self.inventory, classes)

    def _read_claims(self, keys: list[str]) -> None:
        for key in keys:
            obj = self.claim_objs.get(key)
            if obj is None:
                self.claims.pop(key, None)
                continue
            try:
                self.claims[key] = parse_claim(obj)
            except InputError as err:
                self.warn(str(err))
                self.claims.pop(key, None)

    def book(self, state: ClusterState, tenancy: Tenancy, only: str | None = None) -> None:
        """Book every allocated claim not booked yet; unbook claims deleted or deallocated (lock held)."""
        keys = [only] if only is not None else sorted(set(self.booked) | set(self.claims))
        for key in keys:
            c = self.claims.get(key)
            if c is None or c.allocation is None:
                if key in self.booked and key not in self.inflight:
                    self.unbook(key, state)
                continue
            self.inflight.pop(key, None)
            if self.booked.get(key) and all(state.holder(h) is not None for h in self.booked[key]):
                continue  # (an empty booking is tried again: its devices may have been listed since)
            self.unbook(key, state)
            done = book_claim(state, self.inventory, self.ledger, c, tenancy.of(c.ref.namespace).tenant)
            for problem in done.problems:
                self.warn(f"claim {key}: {problem}")
            self.booked[key] = done.holders

    def mark_booked(self, claim_key: str, holders: tuple[str, ...], node: str) -> None:
        """The allocator booked these holders for a claim it is writing (its allocation is not watched yet)."""
        self.booked[claim_key] = holders
        self.inflight[claim_key] = node

    def unbook(self, key: str, state: ClusterState | None) -> None:
        self.inflight.pop(key, None)
        for h in self.booked.pop(key, ()):
            if state is not None:
                state.release(h)
            self.ledger.give_back(h)

    def view(self) -> dict[str, Any]:
        """The DRA part of /state: nodes, pools not complete yet, claims allocated, pods waiting and why."""
        return {
            "nodes": sorted(self.inventory.nodes),
            "managed_classes": sorted(self.managed),
            "incomplete_pools": list(self.inventory.incomplete),
            "problems": list(self.inventory.problems)[-50:],
            "claims_allocated": sum(1 for c in self.claims.values() if c.allocation is not None),
            "claims_being_written": sorted(self.inflight),
            "waiting": dict(sorted(self.waiting.items())),
        }
