"""Issue 13: `plan_cpus` gives the planner's worker CPUs of its own and moves the server's threads to the others
(extender/planning/cpus.py). Affinity is real here (Linux): the tests read it back from the kernel and restore it."""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest
from queue_objects import A100, CATALOG, T4, node, pod, wait_for

from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import ConfigError, Settings, load_settings
from extender.planning.cpus import allowed_cpus, pin_this_process, split_cpus
from extender.planning.planner import Planner
from extender.store import Store

CPUS = sorted(allowed_cpus())
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to give the worker one of its own")


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """Every thread of the test process back on the CPUs it had."""
    before = set(os.sched_getaffinity(0))
    yield
    pin_this_process(before)


def test_split_gives_the_worker_the_highest_cpus_and_the_server_the_rest() -> None:
    assert split_cpus(1, range(4)) == (frozenset({3}), frozenset({0, 1, 2}))
    assert split_cpus(2, {8, 2, 5, 11}) == (frozenset({8, 11}), frozenset({2, 5}))  # a cpuset: numbers as they are


@pytest.mark.parametrize(("count", "allowed", "says"), [
    (2, range(2), "2 of the 2 CPUs this process may use (0, 1) would leave none to the server"),
    (1, {7}, "1 of the 1 CPUs this process may use (7) would leave none"),
    (0, range(2), "0 pins nothing"),
])
def test_split_refuses_what_the_cpus_cannot_give(count: int, allowed: Collection[int], says: str) -> None:
    with pytest.raises(ValueError, match="plan_cpus") as err:
        split_cpus(count, allowed)
    assert says in str(err.value)


@two_cpus
def test_pinning_moves_every_thread_and_threads_started_later_follow(restore_affinity: None) -> None:
    started = threading.Event()
    done = threading.Event()
    seen: dict[str, set[int]] = {}

    def before() -> None:
        started.set()
        done.wait(30)
        seen["before"] = set(os.sched_getaffinity(0))

    t = threading.Thread(target=before)
    t.start()
    started.wait(30)
    pin_this_process({CPUS[0]})
    later = threading.Thread(target=lambda: seen.setdefault("later", set(os.sched_getaffinity(0))))
    later.start()
    later.join(30)
    done.set()
    t.join(30)
    assert seen == {"before": {CPUS[0]}, "later": {CPUS[0]}}
    assert set(os.sched_getaffinity(0)) == {CPUS[0]}


@two_cpus
def test_the_worker_runs_on_its_cpus_and_the_server_on_the_others(restore_affinity: None) -> None:
    store = Store.from_objects([node("t4-node", T4), node("a100-a", A100),
                                pod("flex", models=f"{T4},{A100}"),
                                pod("t4-only", models=T4, created="2026-05-04T10:00:05Z")], CATALOG)
    mine = CPUS[-1]
    planner = Planner(store, budget_s=5.0, min_interval_s=0.0, cpus=1).start()
    try:
        wait_for(lambda: planner.plan is not None)
        pid = planner.worker_pid
        assert pid is not None and planner.errors == 0 and planner.plan.placed == 2
        assert os.sched_getaffinity(pid) == {mine}  # read back from the kernel
        rest = set(CPUS) - {mine}
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        assert all(os.sched_getaffinity(t) == rest for t in tids)  # the planner's thread included
    finally:
        planner.stop()


def test_bad_plan_cpus_fail_at_start_up_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "vramfit.yaml"
    cfg.write_text("plan_cpus: -1\n")
    with pytest.raises(ConfigError, match="plan_cpus: Input should be greater than or equal to 0"):
        load_settings(cfg)
    store = Store.from_objects([node("a100-a", A100)], CATALOG)
    with pytest.raises(ConfigError, match=f"plan_cpus: {len(CPUS)} of the {len(CPUS)} CPUs .* leave none"):
        create_app(Settings(plan_cpus=len(CPUS)), store, MemoryBinder())
    assert create_app(Settings(planning=False, plan_cpus=len(CPUS)), store, MemoryBinder()) is not None
