"""The pending queue's shape book (extender.queue.PendingQueue.shapes / ours / pending_keys): kept in step with its
entries through any sequence of watch events, drops and a change of scheduler names, as the planner's roomy
check (extender.planning.planner `_recheck`) reads it in place of the entries."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from queue_objects import T4, pod
from solver_fixtures import options as unit_options
from solver_fixtures import random_cluster, random_pending

from extender.queue import PendingQueue

NAMES = [f"p{i}" for i in range(6)]
OURS = frozenset({"vramfit-scheduler"})


def _obj(name: str, vram: int, t4: bool, scheduler: str, bound: bool) -> dict[str, Any]:
    obj = pod(name, vram, models=T4 if t4 else None, node_name="n0" if bound else None)
    obj["spec"]["schedulerName"] = scheduler
    return obj


event = st.one_of(
    st.tuples(st.just("observe"), st.sampled_from(NAMES), st.sampled_from([4000, 8000, 16000]), st.booleans(),
              st.sampled_from(["vramfit-scheduler", "default-scheduler"]), st.booleans()),
    st.tuples(st.just("drop"), st.sampled_from(NAMES)),
    st.tuples(st.just("schedulers"), st.sampled_from([None, OURS])),
)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(event, max_size=30))
def test_the_shape_book_matches_the_entries_after_any_events(events: list[tuple[Any, ...]]) -> None:
    q = PendingQueue()
    for ev in events:
        if ev[0] == "observe":
            _, name, vram, t4, scheduler, bound = ev
            q.observe(f"default/{name}", _obj(name, vram, t4, scheduler, bound))
        elif ev[0] == "drop":
            q.drop(f"default/{ev[1]}")
        else:
            q.schedulers = ev[1]
        ours = [e for e in q.entries.values() if q.schedulers is None or e.scheduler in q.schedulers]
        assert q.ours() == len(ours)
        book = q.shapes()
        assert set(book) == {e.pod.shape for e in ours}
        assert all(demand.shape == shape for shape, demand in book.items())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5))
def test_pending_keys_are_the_keys_read_returns(seed: int, n: int) -> None:
    """Pods holding units in the state (a snapshot-mode bind leaves the pod object unbound) are out of both."""
    state = random_cluster(seed, n_nodes=3, max_gpus=2, n_existing=0)
    q = PendingQueue()
    for i, p in enumerate(random_pending(seed, n)):
        key = f"default/q{i}"
        q.observe(key, _obj(f"q{i}", p.vram_mib, False, "vramfit-scheduler", False))
        if i % 2 == 0:
            held = q.entries[key].pod
            got = next(iter(unit_options(state, held)), None)
            if got is not None:
                state.allocate(held, got)
    assert q.pending_keys(state) == frozenset(e.pod.key for e in q.read(state))
    assert q.ours() == n  # the book counts the holders too (a bound for the roomy check)
