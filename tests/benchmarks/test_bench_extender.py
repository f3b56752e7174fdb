"""bench_extender --plan: the paired comparison it reports, and that its repack runs really follow the plan."""

from __future__ import annotations

import math
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import bench_extender as be


def test_median_ci_is_the_sign_test_interval() -> None:
    # n = 20: P(X <= 5) = 0.021 <= 0.025 < P(X <= 6), so the 6th smallest .. 6th largest value.
    assert be.median_ci([float(i) for i in range(20)]) == (5.0, 14.0)
    # n = 8: P(X = 0) = 0.004 but P(X <= 1) = 0.035: only min .. max has 95 %.
    assert be.median_ci([3.0, 1.0, 2.0, 8.0, 5.0, 4.0, 7.0, 6.0]) == (1.0, 8.0)
    assert be.median_ci([2.5]) == (2.5, 2.5)


@given(st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=60))
def test_median_ci_holds_the_median_and_covers_its_level(values: list[float]) -> None:
    lo, hi = be.median_ci(values)
    v = sorted(values)
    n = len(v)
    mid = (v[(n - 1) // 2] + v[n // 2]) / 2
    assert lo <= mid <= hi
    i = v.index(lo)  # rank of the lower end: the binomial mass outside [i, n-1-i] is at most 5 %
    if i > 0:
        outside = 2 * sum(math.comb(n, j) for j in range(i)) / 2 ** n
        assert outside <= 0.05 + 1e-12


def _run(rnd: int, planning: bool, worker: str | None, filt: float, prio: float) -> dict:
    return {"round": rnd, "planning": planning, "plan_worker": worker, "filter": {"p99_ms": filt},
            "prioritize": {"p99_ms": prio}, be.FP: {"p99_ms": filt + prio}}


def test_paired_verdict_follows_the_margin() -> None:
    runs = []
    for r in range(10):
        runs += [_run(r, False, None, 4.0, 10.0),
                 _run(r, True, "process", 4.0 + (0.05 if r % 2 else -0.05), 10.0 + (0.1 if r % 2 else -0.1)),
                 _run(r, True, "thread", 6.0, 20.0)]  # 2 ms / 10 ms worse in every round
    out = be.paired(runs)
    assert out["on (process)"]["filter"]["no_worse"] and out["on (process)"]["prioritize"]["no_worse"]
    assert out["on (process)"]["prioritize"]["worse"] == 5 and out["on (process)"]["prioritize"]["better"] == 5
    assert out["on (process)"]["prioritize"]["margin_ms"] == pytest.approx(0.5)
    thread = out["on (thread)"]
    assert not thread["filter"]["no_worse"] and not thread[be.FP]["no_worse"]
    assert thread["prioritize"]["median_ms"] == pytest.approx(10.0) and thread["prioritize"]["worse"] == 10


def test_unknown_worker_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert be.main(["--plan", "--plan-workers", "process+fast", "--no-write"]) == 2
    assert "process+fast" in capsys.readouterr().err


def test_repack_runs_bind_every_queued_pod_by_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # A roomy cluster: without repack the plan books no units (the online policy places the whole queue); with
    # it every queued pod is bound on its planned units, so the timed verbs really follow a plan.
    assert be.main(["--plan", "--nodes", "30", "--cycles", "12", "--warmup", "2", "--pending", "8",
                    "--plan-workers", "thread,thread+repack", "--no-write"]) == 0
    text = capsys.readouterr().out
    binds = dict(re.findall(r"on \(([a-z+]+)\): .*binds (\d+) by plan", text))
    assert binds == {"thread": "0", "thread+repack": "8"}
    assert "Paired by round" in text


def test_refill_keeps_the_queue_as_long_as_it_started(capsys: pytest.CaptureFixture[str]) -> None:
    # Without --refill the queued pods are bound one by one and the queue drains; with it the pod `pending`
    # cycles ahead joins after each timed cycle, so `pending` pods are still queued at the end.
    args = ["--plan", "--nodes", "30", "--cycles", "10", "--warmup", "2", "--pending", "6", "--plan-workers", "thread",
            "--no-write"]
    assert be.main(args) == 0
    assert re.findall(r"(\d+) pods queued at the end", capsys.readouterr().out) == ["0"]
    assert be.main([*args, "--refill"]) == 0
    text = capsys.readouterr().out
    assert re.findall(r"(\d+) pods queued at the end", text) == ["6"]
    assert "stays 6 long" in text


def pinned_small_run(workers: str, capsys: pytest.CaptureFixture[str]) -> str:
    """A tiny --plan run with --plan-cpus 1 and these --plan-workers; its printed report. Skips on one CPU;
    main() pins this process (as it pins the bench's client), so the mask is put back after."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    try:
        assert be.main(["--plan", "--nodes", "30", "--cycles", "6", "--warmup", "2", "--pending", "4",
                        "--plan-workers", workers, "--plan-cpus", "1", "--no-write"]) == 0
        return capsys.readouterr().out
    finally:
        os.sched_setaffinity(0, cpus)


def test_plan_cpus_pins_and_too_many_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    assert be.main(["--plan", "--plan-cpus", str(len(cpus)), "--no-write"]) == 2
    assert "would leave none to the server" in capsys.readouterr().err
    text = pinned_small_run("process", capsys)
    assert f"the planner's worker on CPU [{cpus[-1]}], the client and every server on {cpus[:-1]}" in text
    assert re.search(r"on \(process\): first plan .* 0 errors", text)


def test_the_hog_arm_runs_beside_off_on_the_workers_cpus(capsys: pytest.CaptureFixture[str]) -> None:
    """`hog`: planning off with a stand-in for the worker on its CPUs; paired with off like the planning kinds,
    and it needs --plan-cpus (the CPUs it runs on)."""
    assert be.main(["--plan", "--plan-workers", "hog", "--no-write"]) == 2
    assert "needs --plan-cpus" in capsys.readouterr().err
    assert be.main(["--plan", "--plan-workers", "hog+repack", "--no-write"]) == 2
    text = pinned_small_run("hog", capsys)
    assert re.search(r"\| 0 \| off \+ hog \|", text)  # its own row in the round table
    assert re.search(r"\| off \+ hog \| filter \| 1 \|", text)  # and paired with off
    assert not re.search(r"off \+ hog: first plan", text)  # no planner ran
