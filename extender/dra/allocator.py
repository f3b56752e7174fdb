"""The leader's DRA allocator: gated pods are the queue. Each round takes the pods waiting at the gate
`vramfit.io/allocate` (the oldest first, at most `dra_batch_max_pods`), plans them together through the core's
queue planner, allocates each pod's claims with the live policy (`packing.dra.allocate`), books the devices
in the store's state at once (so nothing is handed out twice while the writes are on their way), writes
(`extender.dra.writer`) and removes the gate. A pod it cannot place keeps its gate and says why.

It also keeps allocations honest: a claim vramfit allocated that no live pod uses and nothing reserves is
deallocated (its pod was deleted before it was bound, or its devices are gone)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from extender.dra.pending import Job, pending_jobs, stale_claims
from extender.dra.writer import ClaimWriter, WriteFailed
from extender.store import Store
from packing.dra.allocate import Allocator, PodAllocation, PodClaims, Unallocated
from packing.dra.results import allocation_json
from packing.planning.dra_batch import plan_claims
from packing.policies import Policy

log = logging.getLogger("vramfit.dra")

PLAN_BUDGET_S = 0.1  # the queue plan of one round (under the store's lock: the verbs wait that long at most)
RETRY_S = 2.0  # a round at least this often while pods wait
WRITERS = 8  # pods written at once: three API calls each, so a burst of 200 is not 600 calls in a row


@dataclass
class RoundResult:
    allocated: list[str] = field(default_factory=list)  # pod keys ungated
    waiting: dict[str, str] = field(default_factory=dict)  # pod key -> why
    released: list[str] = field(default_factory=list)  # claim keys deallocated


@dataclass
class DraAllocator:
    store: Store
    writer: ClaimWriter
    policy: Policy
    serving: Callable[[], bool] = lambda: True
    window_s: float = 0.05
    max_pods: int = 200
    said: dict[str, str] = field(default_factory=dict)  # pod UID -> the reason last said (Event + condition)
    allocated_total: int = 0  # pods whose claims were allocated and gate removed
    failed_total: int = 0  # rounds in which a pod could not be allocated (or its writes failed)
    latencies: list[float] = field(default_factory=list)  # seconds from a pod's first sight to its ungating
    _seen: dict[str, float] = field(default_factory=dict)
    _count: threading.Lock = field(default_factory=threading.Lock)

    def run(self, stop: threading.Event) -> None:
        """Rounds while `stop` is not set: after a DRA change — slices, classes, claims, templates, a pod with claims
        (`DraBook.version`) — then `window_s` more, so a burst is one batch; and every `RETRY_S` for pods still
        waiting (a node may have freed up in ways no event shows here). Other pods' events wake nothing."""
        seen = -1
        while not stop.is_set():
            with self.store.changed:
                if self._version() == seen:
                    self.store.changed.wait(RETRY_S)
            if stop.wait(self.window_s) or not self.serving() or not self.store.ready:
                continue
            book = self.store.dra
            if self._version() == seen and not (book is not None and (book.waiting or book.inflight)):
                continue  # nothing changed and nobody waits: no round (a scan of every pod under the lock)
            seen = self._version()
            try:
                self.round()
            except Exception:  # a round must never end the allocator; the next one starts from the API's truth
                log.exception("DRA allocation round failed")

    def _version(self) -> int:
        return self.store.dra.version if self.store.dra is not None else -1

    # ------------------------------------------------------------------ one round
    def round(self) -> RoundResult:
        out = RoundResult()
        with self.store.lock:
            (jobs, waits), stale = pending_jobs(self.store, self.max_pods), stale_claims(self.store)
            now = time.monotonic()
            for j in jobs:
                self._seen.setdefault(j.pod_uid, now)
            prefer = plan_claims(self._allocator(), [j.claims for j in jobs if j.claims is not None], PLAN_BUDGET_S)
        decided = self._decide(jobs, prefer)
        with self.store.lock:
            waiting = dict(waits)
            waiting.update((j.pod_key, r.reason) for j, r in decided if isinstance(r, Unallocated))
            assert self.store.dra is not None
            self.store.dra.waiting = waiting
            live = {j.pod_uid for j in jobs} | {str((self.store.pod_object(k) or {}).get("metadata", {}).get("uid"))
                                                for k in waits}
            for uid in [u for u in self._seen if u not in live]:
                del self._seen[uid]  # deleted, or scheduled by others
        for claim_obj in stale:
            self._release(claim_obj, out)
        for key, why in waits.items():
            pod = self.store.pod_object(key)
            if pod is not None:
                self._say_pod(pod, key, why, out)
        for job, result in decided:
            if isinstance(result, Unallocated):
                self._say(job, result.reason, out)
        # Pods' writes in parallel (each pod's own in order); pods that only wait for a claim another pod of this
        # round allocates are ungated after those writes.
        first = [(j, r) for j, r in decided if isinstance(r, PodAllocation)]
        then = [(j, r) for j, r in decided if r is None]
        for batch in (first, then):
            with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="dra-write") as pool:
                list(pool.map(lambda jr: self._write(jr[0], jr[1], out), batch))  # type: ignore[arg-type]
        return out

    def _allocator(self) -> Allocator:
        """An allocator on the store's state and the book's current inventory (lock held)."""
        book = self.store.dra
        assert book is not None and book.index is not None
        return Allocator(self.store.state, book.inventory.nodes, book.index, self.policy, book.ledger)

    def _decide(self, jobs: list[Job], prefer: dict[str, str]) -> list[tuple[Job, PodAllocation | Unallocated | None]]:
        """Allocate every job's claims on the store's state, one pod per hold of the store's lock (the verbs of
        device-plugin pods wait at most one pod's decision); None: nothing to allocate, only ungate."""
        out: list[tuple[Job, PodAllocation | Unallocated | None]] = []
        for job in jobs:
            with self.store.lock:
                book = self.store.dra
                assert book is not None
                claims = _less_decided(job.claims, book.inflight)  # a claim two pods share is allocated once
                if claims is None or not claims.claims:
                    out.append((job, None))
                    continue
                result = self._allocator().allocate(claims, prefer.get(claims.key))
                if isinstance(result, PodAllocation):
                    for cp in result.claims:
                        book.mark_booked(cp.claim.ref.key, tuple(p.holder for p in cp.picks), cp.node)
            out.append((job, result))
        return out

    # ------------------------------------------------------------------ writes
    def _write(self, job: Job, result: PodAllocation | None, out: RoundResult) -> None:
        written: set[str] = set()
        try:
            for cp in result.claims if result is not None else ():
                book = self.store.dra
                assert book is not None
                with self.store.lock:
                    obj = book.claim_objs.get(cp.claim.ref.key)
                    allocation = allocation_json(cp, book.classes)
                if obj is None:
                    raise WriteFailed(404, f"claim {cp.claim.ref.key} is gone")
                stored = self.writer.protect(obj)
                self.writer.allocate(stored, allocation)
                written.add(cp.claim.ref.key)
            self._ungate(job)
        except WriteFailed as err:
            self._undo(result, written)
            log.info("pod %s: allocation not written (%s); it is tried again", job.pod_key, err)
            with self._count:
                self.failed_total += 1
            return
        with self._count:  # writers run in parallel
            started = self._seen.pop(job.pod_uid, None)
            if started is not None:
                self.latencies.append(time.monotonic() - started)
            self.said.pop(job.pod_uid, None)
            self.allocated_total += 1
            out.allocated.append(job.pod_key)

    def _ungate(self, job: Job) -> None:
        if not job.gated:
            return
        try:
            self.writer.ungate(job.pod)
        except WriteFailed as err:
            if err.code != 409:
                raise
            ns, name = job.pod_key.split("/", 1)
            self.writer.ungate(self.writer.read_pod(ns, name))  # its status moved on: remove the gate from now's

    def _undo(self, result: PodAllocation | None, written: set[str]) -> None:
        """Unbook the claims whose allocation was not written (the written ones are real: the watch books them)."""
        book = self.store.dra
        if result is None or book is None:
            return
        with self.store.lock:
            for cp in result.claims:
                if cp.claim.ref.key not in written:
                    book.unbook(cp.claim.ref.key, self.store.state)

    def _say(self, job: Job, reason: str, out: RoundResult) -> None:
        self.failed_total += 1
        self._say_pod(job.pod, job.pod_key, reason, out)

    def _say_pod(self, pod: dict[str, Any], key: str, reason: str, out: RoundResult) -> None:
        """An Event and a pod condition, once per reason: the pod keeps its gate and says why."""
        out.waiting[key] = reason
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if self.said.get(uid) == reason:
            return
        self.said[uid] = reason
        self.writer.say_waiting(pod, reason)
        self.writer.set_condition(pod, reason)

    def _release(self, claim_obj: dict[str, Any], out: RoundResult) -> None:
        meta = claim_obj.get("metadata") or {}
        try:
            self.writer.deallocate(claim_obj)
        except WriteFailed as err:
            log.info("claim %s/%s not deallocated: %s", meta.get("namespace"), meta.get("name"), err)
            return
        out.released.append(f"{meta.get('namespace')}/{meta.get('name')}")


def dra_enabled(api: kclient.ApiClient, setting: object) -> bool:
    """DRA allocation on? `auto`: when the API server serves resource.k8s.io/v1 (Kubernetes >= 1.34), said once."""
    if setting is not True and setting != "auto":
        return False
    try:
        kclient.ResourceV1Api(api).get_api_resources(_request_timeout=5)
    except (ApiException, OSError, ValueError) as exc:
        status = getattr(exc, "status", None)
        if setting is True:
            log.warning("dra: true, but resource.k8s.io/v1 answered %s: DRA allocation stays on", status or exc)
            return True
        log.warning("DRA allocation off: the API server does not serve resource.k8s.io/v1 (%s); Kubernetes >= 1.34 "
                    "has it", status or exc)
        return False
    log.info("DRA allocation on: resource.k8s.io/v1 is served")
    return True


def _less_decided(claims: PodClaims | None, inflight: dict[str, str]) -> PodClaims | None:
    """The pod's claims less those allocated since its job was read (by an earlier pod of this round), the node
    they fix carried over."""
    if claims is None:
        return None
    fixed = {inflight[c.ref.key] for c in claims.claims if c.ref.key in inflight}
    if not fixed:
        return claims
    rest = tuple(c for c in claims.claims if c.ref.key not in inflight)
    node = claims.node or next(iter(fixed))
    return replace(claims, claims=rest, node=node)
