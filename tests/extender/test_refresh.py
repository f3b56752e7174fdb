"""The policy refresher (extender/refresh.py) and the default policy's live mode (FragDual.go_live): a verb
never re-solves the LP nor rebuilds the mix on a large state, it uses the last finished ones; what the refresher
swaps in scores exactly as a synchronous rebuild from scratch would; small states and copies stay synchronous."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_extender import BENCH_NAMESPACE, make_node
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.refresh import Refresher
from extender.store import Store
from packing import fit
from packing.catalog import load_catalog
from packing.model import Isolation, PodDemand
from packing.place import schedule_one
from packing.policies import get_policy
from packing.policies.frag_dual import FragDual
from packing.policies.mix import PodShape
from packing.state import ClusterState

CATALOG = load_catalog()
VRAM = [4096, 8192, 14336, 20000, 30720]
ISOLATION = [Isolation.NONE, Isolation.NONE, Isolation.PROCESS, Isolation.HARDWARE]


def make_store(nodes: int) -> Store:
    return Store.from_objects([make_node(k) for k in range(nodes)] + [BENCH_NAMESPACE], CATALOG)


def pods(seed: int, count: int, tenants: int = 3) -> Iterator[PodDemand]:
    rng = random.Random(seed)
    for j in range(count):
        yield PodDemand(key=f"bench/p{j}", vram_mib=rng.choice(VRAM), tenant=f"team-{j % tenants}",
                        isolation=rng.choice(ISOLATION), uid=f"u{j}", cpu_milli=2000)


def live(store: Store, min_rows: int = 1, **params: object) -> tuple[FragDual, Refresher]:
    policy = get_policy("vramfit", **params)
    assert isinstance(policy, FragDual)
    refresher = Refresher(store, policy, threaded=False)
    policy.go_live(refresher.wake, min_rows=min_rows)
    return policy, refresher


def scores(state: ClusterState, policy: FragDual, pod: PodDemand) -> np.ndarray:
    """The scores on the nodes the pod fits now (`Policy.score` ignores the others: a live policy may hold a stale
    value there, one it never asks for again, where a rebuilt one holds none), -inf elsewhere."""
    now = fit.feasible(state, pod, policy.whole_gpu).now
    return np.where(now, np.asarray(policy.score(state, pod, now)), -np.inf)


def from_scratch(policy: FragDual) -> FragDual:
    """A synchronous copy with no arrays, table or cached scores, the same mix and LP solution. A re-solve the
    live policy has not been asked for yet (it is asked for by the next single-GPU score, and the verbs use the
    last solution until the refresher's is in) is not the copy's to do: it keeps the solution too."""
    twin = policy.fork()
    assert isinstance(twin, FragDual) and twin._arrays is None and not twin._live_rows
    twin._since_solve = 0
    return twin


def test_a_due_resolve_waits_for_the_refresher_and_the_verbs_keep_the_last_solution() -> None:
    store = make_store(30)
    policy, refresher = live(store, resolve=8)
    state = store.state
    stream = pods(1, 40)
    for pod in stream:
        schedule_one(state, pod, policy)
        if policy._dual is not None and policy._since_solve >= 8:
            break
    solved = policy._dual
    assert solved is not None and policy.refresh_due()
    for pod in list(stream)[:5]:
        schedule_one(state, pod, policy)
        assert policy._dual is solved  # no verb re-solved it
    refresher.run_once()
    assert not policy.refresh_due() and policy._dual is not solved
    assert policy._since_solve == 0
    want = policy._solve(state)
    assert want is not None and np.array_equal(policy._dual.val, want.val)


def test_a_due_mix_rebuild_leaves_the_arrays_in_use_until_it_is_swapped_in() -> None:
    store = make_store(30)
    policy, refresher = live(store)
    state = store.state
    # One tenant: the first placement of a tenant re-resolves the arrays in the verb (its tenant id appears).
    stream = list(pods(2, 12, tenants=1))
    for pod in stream[:3]:  # the first mix is built in the verb (nothing older to use), the second refreshed
        schedule_one(state, pod, policy)
        refresher.run_once()
    arrays, mix = policy._arrays, policy.current_mix()
    assert arrays is not None and not policy.refresh_due()
    schedule_one(state, stream[3], policy)  # the fourth pod is a refresh point
    assert "mix" in policy._due and policy._arrays is arrays and policy.current_mix() == mix
    refresher.run_once()
    assert not policy.refresh_due()
    assert {s for s, _ in policy.current_mix()} == {PodShape.of(p) for p in stream[:4]}
    if policy.current_mix() != mix:
        assert policy._arrays is not arrays


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(3, 60), st.integers(0, 40))
def test_what_the_refresher_swaps_in_scores_as_a_rebuild_from_scratch(seed: int, arrivals: int,
                                                                      moved_at: int) -> None:
    """Scores after a refresh equal a from-scratch copy's, also when pods are placed between its steps."""
    store = make_store(25)
    policy, refresher = live(store, resolve=16)
    state = store.state
    stream = list(pods(seed, arrivals + 20))
    for pod in stream[:arrivals]:
        schedule_one(state, pod, policy)
    extra = iter(stream[arrivals:])
    with store.lock:
        steps = policy.refresh_steps(state)
        for k, _ in enumerate(steps):
            if k == moved_at:  # a pod placed while the rebuild is half done: its row is rescored after
                schedule_one(state, next(extra), policy)
    twin = from_scratch(policy)
    for pod in stream[arrivals:arrivals + 6]:
        assert np.array_equal(scores(state, policy, pod), scores(state, twin, pod))


def test_small_states_and_copies_compute_synchronously() -> None:
    store = make_store(12)
    policy, refresher = live(store, min_rows=1000, resolve=4)  # 12 nodes: below the live threshold
    sync = get_policy("vramfit", resolve=4)
    state, twin_state = store.state, make_store(12).state
    for pod in pods(3, 30):
        a = schedule_one(state, pod, policy)
        b = schedule_one(twin_state, pod, sync)
        assert (a.node, a.assignment) == (b.node, b.assignment)
    assert not policy.refresh_due()
    copy = policy.fork()
    assert isinstance(copy, FragDual) and copy._wake is None and not copy._live_rows


def test_the_refresher_thread_does_the_work_due_and_survives_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(30)
    policy = get_policy("vramfit", resolve=4)
    assert isinstance(policy, FragDual)
    refresher = Refresher(store, policy)
    policy.go_live(refresher.wake, min_rows=1)
    try:
        for pod in pods(4, 20):
            with store.lock:
                schedule_one(store.state, pod, policy)
        assert refresher.wait_idle(30) and not policy.refresh_due()
        calls = threading.Event()

        def broken(state: ClusterState) -> Iterator[bool]:
            calls.set()
            raise RuntimeError("boom")
            yield True  # pragma: no cover

        monkeypatch.setattr(policy, "refresh_steps", broken)
        with store.lock:
            policy._want("lp")
        assert calls.wait(30)
        assert refresher.refreshes.labels("failed")._value.get() == 1
        monkeypatch.undo()
        policy._due.clear()
        with store.lock:
            policy._want("lp")
        assert refresher.wait_idle(30)
    finally:
        refresher.stop()


def test_the_live_app_has_a_refresher_for_a_policy_that_defers() -> None:
    store = make_store(4)
    app = create_app(Settings(policy="vramfit"), store, MemoryBinder())
    assert app.state.services.refresher is not None
    plain = create_app(Settings(policy="best-fit"), make_store(4), MemoryBinder())
    assert plain.state.services.refresher is None


def test_woken_on_the_serving_loop_the_steps_run_there_between_its_callbacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(30)
    policy = get_policy("vramfit", resolve=4)
    assert isinstance(policy, FragDual)
    refresher = Refresher(store, policy)
    policy.go_live(refresher.wake, min_rows=1)
    locked_on: set[int] = set()  # threads that ran the steps needing the store's lock
    aside_on: set[int] = set()  # and the others (the LP solve)
    steps = policy.refresh_steps

    def spied(state: ClusterState) -> Iterator[bool]:
        needs_lock = True
        for locked in steps(state):
            (locked_on if needs_lock else aside_on).add(threading.get_ident())
            needs_lock = locked
            yield locked

    monkeypatch.setattr(policy, "refresh_steps", spied)

    async def serve() -> bool:
        for pod in pods(5, 20):
            with store.lock:  # as filter and prioritize run: on the loop, under the store's lock
                schedule_one(store.state, pod, policy)
            await asyncio.sleep(0.001)
        for _ in range(4000):
            if refresher.wait_idle(0):
                return True
            await asyncio.sleep(0.005)
        return False

    assert asyncio.run(serve())
    loop_thread = threading.get_ident()
    assert not policy.refresh_due() and locked_on == {loop_thread} and refresher._thread is None
    assert aside_on and loop_thread not in aside_on  # the LP was solved (resolve=4) in a worker thread


class SlowSteps:
    """A deferring policy whose refresh is 8 steps of 10 ms; a request reaches the loop's socket during step 2."""

    def __init__(self, sender: socket.socket) -> None:
        self.sender = sender
        self.done = 0
        self.due = False

    def go_live(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def refresh_due(self) -> bool:
        return self.due

    def refresh_steps(self, state: object) -> Iterator[bool]:
        self.due = False
        for j in range(8):
            if j == 2:
                self.sender.send(b"x")
            time.sleep(0.01)  # CPU-bound work holds the loop as long
            self.done += 1
            yield True


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvicorn serves on uvloop where it is installed
def test_a_request_arriving_during_a_step_waits_for_that_step_and_at_most_one_more(loop: str) -> None:
    run = asyncio.run if loop == "asyncio" else pytest.importorskip("uvloop").run
    reader, sender = socket.socketpair()
    reader.setblocking(False)
    policy = SlowSteps(sender)
    refresher = Refresher(make_store(2), policy)
    seen: list[int] = []

    async def serve() -> bool:
        running = asyncio.get_running_loop()

        async def request() -> None:  # the verb: what a server's protocol starts when the request is read
            seen.append(policy.done)

        def readable() -> None:
            reader.recv(16)
            running.remove_reader(reader)
            running.create_task(request())

        running.add_reader(reader, readable)
        policy.due = True
        policy.wake()
        for _ in range(400):
            if refresher.wait_idle(0) and seen:
                return True
            await asyncio.sleep(0.005)
        return False

    try:
        assert run(serve())
    finally:
        reader.close()
        sender.close()
    assert policy.done == 8 and seen == [4]  # steps 0-2, then step 3 (scheduled before the request was read)
