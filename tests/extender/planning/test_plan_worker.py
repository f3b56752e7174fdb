"""Issue 13: the queue planner solves in a worker process of its own (extender/planning/worker.py), kept up to date by
state deltas (packing.planning.working_copy). No wall-clock asserts: waits are on conditions with timeouts."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from queue_objects import A100, CATALOG, T4, node, pod, wait_for
from solver_fixtures import options, planned_node, random_cluster, random_pending

from extender.planning.planner import Planner
from extender.store import Store
from packing.planning.queue_plan import QueuedPod, plan_queue
from packing.planning.working_copy import HOLDERS_PER_ROW, DeltaSource, RowBooks, WorkingCopy, apply_delta
from packing.state import ClusterState
from packing.views import StateViews


def story() -> Store:
    """The issue's trap: the flexible pod, first in the queue, must leave the T4 to the T4-only pod."""
    return Store.from_objects([node("t4-node", T4), node("a100-a", A100), node("a100-b", A100),
                               pod("flex", models=f"{T4},{A100}"),
                               pod("t4-only", models=T4, created="2026-05-04T10:00:05Z")], CATALOG)


@pytest.fixture
def planners() -> Iterator[Callable[..., Planner]]:
    made: list[Planner] = []

    def make(store: Store, **kwargs: Any) -> Planner:
        p = Planner(store, budget_s=5.0, min_interval_s=0.0, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def alive(pid: int) -> bool:
    """Whether a child with this pid exists, zombie included (a reaped one is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def same_copy(copy: ClusterState, state: ClusterState) -> None:
    assert copy.node_names == state.node_names
    n = len(state)
    for name in StateViews._ARRAYS:
        assert np.array_equal(getattr(copy, "_" + name)[:n], getattr(state, "_" + name)[:n]), name
    assert copy._holders == state._holders
    for a, b in zip(copy._nodes, state._nodes, strict=True):
        assert a is not b
        assert [(g.grants, g.tenants, g.mig_holder, g.used_mib, g.whole_holder) for g in a.gpus] == \
            [(g.grants, g.tenants, g.mig_holder, g.used_mib, g.whole_holder) for g in b.gpus]
        assert (a.cpu_used, a.mem_used, a.node) == (b.cpu_used, b.mem_used, b.node)


# ---- the working copy's deltas ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_a_copy_taken_in_pieces_catches_rows_that_moved_meanwhile(seed: int) -> None:
    state = random_cluster(seed, n_nodes=7, max_gpus=3, n_existing=3)
    source = DeltaSource()
    first = source.delta(state, 0, max_rows=2)
    assert first.reset is not None and not first.complete and first.rows.tolist() == [0, 1]
    books = apply_delta(None, first.copied())
    pending = iter(random_pending(seed, 6))
    while True:  # between two pieces the state moves: a row already sent changes, a holder comes and goes
        p = next(pending, None)
        if p is not None:
            for asg in options(state, p):
                state.allocate(p, asg)
                break
        delta = source.delta(state, 0, max_rows=2)
        books = apply_delta(books, delta.copied())
        if delta.complete:
            break
    same_copy(books, state)
    key = next(iter(state._holders))
    state.release(key)
    delta = source.delta(state, 0)
    assert delta.reset is None and delta.complete and key in delta.dropped and delta.rows.size == 1
    same_copy(apply_delta(books, delta.copied()), state)


def test_a_node_swapped_for_another_resets_the_copy_though_the_count_stays() -> None:
    """One node leaves and another comes: as many rows as before, and the caller's node-set version is the same
    (a bare state, no store to count), yet rows mean other nodes now, so the next delta is a full copy."""
    state = random_cluster(3, n_nodes=4, max_gpus=2, n_existing=2)
    source = DeltaSource()
    books = apply_delta(None, source.delta(state, 0).copied())
    assert source.delta(state, 0).reset is None  # nothing moved: no reset
    gone = state.node_names[1]
    new = replace(state.node(gone), name="brand-new")
    state.remove_node(gone)
    state.upsert_node(new)
    assert len(state) == 4
    delta = source.delta(state, 0)
    assert delta.reset is not None and delta.reset[0] == state.node_names and delta.complete
    books = apply_delta(books, delta.copied())
    same_copy(books, state)


@pytest.mark.parametrize("seed", range(3))
def test_a_row_the_copy_has_sends_its_books_and_a_node_described_anew_sends_all(seed: int) -> None:
    """After the first copy a moved row carries only its books (RowBooks); a node re-described in place
    (upsert_node: another label, more CPU) carries its whole usage once, so the copy sees the new description.
    Through a pickle, as the worker receives it."""
    state = random_cluster(seed, n_nodes=5, max_gpus=3, n_existing=2)
    source = DeltaSource()
    books = apply_delta(None, pickle.loads(pickle.dumps(source.delta(state, 0))))
    placed = 0
    for p in random_pending(seed, 8):
        for asg in options(state, p):
            state.allocate(p, asg)
            placed += 1
            break
    assert placed
    delta = source.delta(state, 0)
    assert delta.rows.size and all(isinstance(u, RowBooks) for u in delta.usage)
    books = apply_delta(books, pickle.loads(pickle.dumps(delta)))
    same_copy(books, state)
    name = state.node_names[2]
    state.upsert_node(replace(state.node(name), labels={**state.node(name).labels, "tier": "gold"}))
    delta = source.delta(state, 0)
    assert delta.reset is None and delta.rows.tolist() == [2] and not isinstance(delta.usage[0], RowBooks)
    books = apply_delta(books, pickle.loads(pickle.dumps(delta)))
    same_copy(books, state)
    assert books.node(name).labels["tier"] == "gold"
    key = next(iter(state._holders))
    state.release(key)  # and books again after it
    delta = source.delta(state, 0)
    assert all(isinstance(u, RowBooks) for u in delta.usage)
    same_copy(apply_delta(books, pickle.loads(pickle.dumps(delta))), state)


def test_many_holders_come_in_pieces_too() -> None:
    # A first copy of a busy cluster: more holders than one piece may carry (HOLDERS_PER_ROW per row).
    state = random_cluster(11, n_nodes=6, max_gpus=3, n_existing=0)
    for p in random_pending(11, 60):
        for asg in options(state, p):
            state.allocate(p, asg)
            break
    held = len(state._holders)
    assert held > 2 * HOLDERS_PER_ROW
    source = DeltaSource()
    books, pieces = None, []
    while True:
        delta = source.delta(state, 0, max_rows=1)
        assert len(delta.holders) <= HOLDERS_PER_ROW
        pieces.append(delta)
        books = apply_delta(books, delta.copied())
        if delta.complete:
            break
    assert len(pieces) >= -(-held // HOLDERS_PER_ROW)  # the holders alone need this many pieces
    assert sum(len(d.holders) for d in pieces) == held  # each sent once
    same_copy(books, state)


def test_a_confirmed_binding_reaches_the_copy_though_no_row_moves() -> None:
    """confirm() replaces a reserved holder without moving its row: the holder journal still carries it."""
    state = random_cluster(5, n_nodes=3, max_gpus=3, n_existing=0)
    p = next(iter(random_pending(5, 1)))
    asg = next(iter(options(state, p)))
    state.allocate(p, asg, reserved=True)
    source = DeltaSource()
    books = apply_delta(None, source.delta(state, 0).copied())
    assert books._holders[p.key].reserved
    before = state.version.copy()
    state.confirm(p.key)
    assert np.array_equal(state.version, before)
    delta = source.delta(state, 0)
    assert delta.rows.size == 0 and list(delta.holders) == [p.key]
    books = apply_delta(books, delta.copied())
    assert not books._holders[p.key].reserved
    same_copy(books, state)


@pytest.mark.parametrize("seed", range(3))
def test_a_reader_the_journal_left_behind_compares_every_holder(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many changes between two deltas trim the journal past the reader: it falls back to a full comparison."""
    monkeypatch.setattr("packing.state.HOLDER_LOG_MIN", 2)
    state = random_cluster(seed, n_nodes=5, max_gpus=3, n_existing=2)
    source = DeltaSource()
    books = apply_delta(None, source.delta(state, 0).copied())
    at = source._log_at
    for rnd in range(4):  # churn: pods come and go, more journal entries than twice the holders
        for p in random_pending(seed + rnd, 12):
            for asg in options(state, p):
                state.allocate(p, asg)
                break
        for key in list(state._holders)[: 3 if rnd == 3 else None]:
            state.release(key)
    assert state.holder_changes_since(at)[0] is None  # trimmed past the reader
    books = apply_delta(books, source.delta(state, 0).copied())
    same_copy(books, state)


def test_a_delta_taken_whole_is_the_copy_at_once() -> None:
    state = random_cluster(3, n_nodes=4, max_gpus=3, n_existing=3)
    source = DeltaSource()

    def sync(books: WorkingCopy | None, node_set_version: int) -> WorkingCopy:
        return apply_delta(books, source.delta(state, node_set_version).copied())

    books = sync(None, 0)
    same_copy(books, state)
    for p in random_pending(3, 3):
        for asg in options(state, p):
            state.allocate(p, asg)
            break
    books = sync(books, 0)
    same_copy(books, state)
    same_copy(sync(books, 1), state)  # the node set moved: a new copy


# ---- the worker process -------------------------------------------------------------------------------

def test_the_worker_plans_as_plan_queue_does_in_process(planners: Callable[..., Planner]) -> None:
    store = story()
    queue = [QueuedPod(e.pod, e.created) for e in store.queued()]
    direct = plan_queue(store.state, queue, time_limit_s=5.0)
    planner = planners(store)
    plan = planner.plan_now()
    assert planner.worker_pid is not None and planner.worker_pid != os.getpid()
    assert planner.errors == 0 and planner.solves == 1
    assert dict(plan.assignments) == dict(direct.assignments)
    assert (plan.status, plan.placed, plan.queue_size) == (direct.status, direct.placed, 2) == ("optimal", 2, 2)
    threaded = planners(story(), worker="thread").plan_now()
    assert dict(threaded.assignments) == dict(plan.assignments) and threaded.status == plan.status


def test_the_plan_scores_with_a_fork_of_the_live_policy(planners: Callable[..., Planner]) -> None:
    from packing.policies import get_policy

    store = story()
    live = get_policy("vramfit")
    for e in store.queued():
        live.observe(e.pod)
    learnt = dict(live._counts)  # type: ignore[attr-defined]
    queue = [QueuedPod(e.pod, e.created) for e in store.queued()]
    direct = plan_queue(store.state, queue, time_limit_s=5.0, policy=live)
    for worker in ("process", "thread"):
        plan = planners(store, policy=live, worker=worker).plan_now()
        assert dict(plan.assignments) == dict(direct.assignments) and plan.placed == 2
    assert dict(live._counts) == learnt  # type: ignore[attr-defined]  # the plan's passes learnt on forks


def test_a_delta_reaches_the_worker(planners: Callable[..., Planner]) -> None:
    store = story()
    planner = planners(store)
    first = planner.plan_now()
    pid = planner.worker_pid
    flex_node = planned_node(first, "default/flex")
    assert flex_node in ("a100-a", "a100-b")
    # A pod outside the plan takes the A100 the flexible pod was planned on; the worker sees it in the delta.
    store.apply("pods", "ADDED", {k: v for k, v in pod("intruder", node_name=flex_node,
                                                          assignment={"gpus": [{"index": 0, "vram_mib": 8000}]}).items() if k != "kind"})
    assert store.state.holder("default/intruder") is not None and planner.changed()
    second = planner.plan_now()
    assert planner.worker_pid == pid and planner.errors == 0  # the same worker, told only what moved
    other = ({"a100-a", "a100-b"} - {flex_node}).pop()
    assert planned_node(second, "default/flex") == other and planned_node(second, "default/t4-only") == "t4-node"
    assert not planner.changed()


def test_a_killed_worker_counts_an_error_and_the_next_round_starts_another(
        planners: Callable[..., Planner]) -> None:
    store = story()
    planner = planners(store).start()
    wait_for(lambda: planner.plan is not None and planner.plan.placed == 2)
    plan, pid = planner.plan, planner.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(c.pid == pid for c in mp.active_children()))  # reaped: it has died
    store.apply("pods", "ADDED", {k: v for k, v in pod("late", created="2026-05-04T10:01:00Z").items()
                                  if k != "kind"})
    wait_for(lambda: planner.errors == 1)
    assert planner.plan is plan  # the last plan stays published
    wait_for(lambda: planner.plan is not plan and planner.plan.queue_size == 3)
    assert planner.worker_pid not in (None, pid) and planner.errors == 1
    assert planned_node(planner.plan, "default/t4-only") == "t4-node"


def test_stop_leaves_no_live_child(planners: Callable[..., Planner]) -> None:
    planner = planners(story()).start()
    wait_for(lambda: planner.plan is not None)
    pid = planner.worker_pid
    assert pid is not None and alive(pid)
    planner.stop()
    assert not planner.running and planner.worker_pid is None
    assert not alive(pid)  # joined: neither running nor a zombie
    assert all(c.pid != pid for c in mp.active_children())


def test_a_roomy_plan_is_checked_again_on_the_live_state_without_a_solve(planners: Callable[..., Planner]) -> None:
    """Room for the whole queue: the plan leaves it to the online policy. While the rows that moved since cannot
    have used the room up, a round only checks that again (no delta, no solve) and publishes the plan for today's
    queue; a queue the moved rows may have crowded out plans afresh."""
    nodes = [node(f"a100-{i}", A100) for i in range(4)]
    store = Store.from_objects([*nodes, pod("p0"), pod("p1", created="2026-05-04T10:00:01Z")], CATALOG)
    planner = planners(store, worker="thread")
    first = planner.plan_now()
    assert first.status == "roomy" and first.online == {"default/p0", "default/p1"} and planner.solves == 1
    store.apply("pods", "ADDED", {k: v for k, v in pod("p2", created="2026-05-04T10:00:02Z").items() if k != "kind"})
    # A pod outside the queue takes an A100: one row moved; 3 pods, each with more nodes than pods ahead of it.
    store.apply("pods", "ADDED", {k: v for k, v in pod("run", node_name="a100-0",
                                                          assignment={"gpus": [{"index": 0, "vram_mib": 8000}]}
                                                          ).items() if k != "kind"})
    assert planner.changed()
    again = planner.plan_now()
    assert (planner.solves, planner.rechecks) == (1, 1) and not planner.changed()
    assert again.status == "roomy" and again.online == {"default/p0", "default/p1", "default/p2"}
    assert again.placed == 3 and again.room == first.room and planner.to_json()["rechecks"] == 1
    # A newcomer of a shape the counts never saw (another size) has its nodes counted now, still no solve.
    store.apply("pods", "DELETED", {k: v for k, v in pod("p2").items() if k != "kind"})
    store.apply("pods", "ADDED", {k: v for k, v in pod("big", 30000, created="2026-05-04T10:00:04Z").items()
                                  if k != "kind"})
    fresh = planner.plan_now()
    assert (planner.solves, planner.rechecks) == (1, 2) and fresh.status == "roomy" and "default/big" in fresh.online
    assert fresh.room is not None and len(fresh.room) == 2 and set(first.room) < set(fresh.room)
    # A 4th queued pod has 3 ahead of it and 3 free A100s: not roomy, planned in full.
    store.apply("pods", "ADDED", {k: v for k, v in pod("p3", created="2026-05-04T10:00:05Z").items() if k != "kind"})
    third = planner.plan_now()
    assert (planner.solves, planner.rechecks) == (2, 2) and third.status != "roomy" and third.placed == 3


def test_a_recheck_the_queue_length_cannot_settle_reads_the_queue_order(planners: Callable[..., Planner]) -> None:
    """A T4-only pod fits one node, with three pods in the queue behind it: by the queue's length alone (3 pods
    could be ahead of it) the room is not enough, in the queue's order (it comes first) it is; a T4-only pod last
    in the queue is not roomy and is planned in full."""
    nodes = [*(node(f"a100-{i}", A100) for i in range(4)), node("t4-0", T4)]
    store = Store.from_objects([*nodes, pod("t", models=T4, created="2026-05-04T09:59:59Z"), pod("p0"),
                                pod("p1", created="2026-05-04T10:00:01Z")], CATALOG)
    planner = planners(store, worker="thread")
    first = planner.plan_now()
    assert first.status == "roomy" and planner.solves == 1
    store.apply("pods", "ADDED", {k: v for k, v in pod("p2", created="2026-05-04T10:00:02Z").items() if k != "kind"})
    again = planner.plan_now()
    assert (planner.solves, planner.rechecks) == (1, 1) and again.status == "roomy"
    assert again.online == {"default/t", "default/p0", "default/p1", "default/p2"} and again.queue_size == 4
    store.apply("pods", "ADDED", {k: v for k, v in pod("t-late", models=T4, created="2026-05-04T10:00:03Z").items()
                                  if k != "kind"})
    third = planner.plan_now()
    assert (planner.solves, planner.rechecks) == (2, 1) and third.status != "roomy"


def test_the_heap_is_frozen_after_each_full_copy_only(planners: Callable[..., Planner]) -> None:
    """`after_full_copy` (vramfit serve: freeze the heap) runs after a round that copied the whole state (the
    first, one after a new node joins), not after a round that sent only the rows that moved."""
    store = Store.from_objects([*(node(f"a100-{i}", A100) for i in range(2)), pod("p0"), pod("p1")], CATALOG)
    planner = planners(store, worker="thread")
    calls: list[int] = []
    planner.after_full_copy = lambda: calls.append(planner.solves)
    planner.plan_now()
    assert calls == [0]
    store.apply("pods", "ADDED", {k: v for k, v in pod("p2", created="2026-05-04T10:00:02Z").items() if k != "kind"})
    planner.plan_now()  # a crowded queue (3 pods, 2 GPUs): a delta round, no full copy
    assert planner.solves == 2 and calls == [0]
    store.apply("nodes", "ADDED", {k: v for k, v in node("a100-9", A100).items() if k != "kind"})
    planner.plan_now()
    assert calls == [0, 2]


def test_rows_moved_counts_rows_since_the_last_delta_and_none_once_the_node_set_changed() -> None:
    state = random_cluster(3, n_nodes=5, max_gpus=2, n_existing=0)
    source = DeltaSource()
    assert source.rows_moved(state, 0) is None  # nothing handed out yet
    source.delta(state, 0)
    assert source.rows_moved(state, 0) == 0
    p = random_pending(3, 1)[0]
    state.allocate(p, next(iter(options(state, p))))
    assert source.rows_moved(state, 0) == 1
    assert source.rows_moved(state, 1) is None  # another node set: the next delta starts over
