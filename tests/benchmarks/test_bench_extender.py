"""bench_extender: the floor arm (benchmarks/floor_extender.py) and the ratios to it, the shortlist's placement check;
--plan: the paired comparison it reports, and that its repack runs really follow the plan."""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import bench_extender as be
from benchmarks import floor_extender as floor
from benchmarks.local_server import LocalServer
from extender import wire
from extender.app import uvicorn_options


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


# ---- the floor extender -------------------------------------------------------------------------------------

POD = be.make_pod(0, random.Random(1))
NODES = [be.make_node(k) for k in range(3)]
NAMES = [n["metadata"]["name"] for n in NODES]


def _post(url: str, path: str, body: bytes) -> tuple[int, Any, str | None]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, orjson.loads(resp.read()), resp.getheader("server-timing")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def floor_url() -> Any:
    with LocalServer(floor.app, **uvicorn_options()) as server:
        yield server.url


def test_floor_filter_passes_every_node_in_the_form_it_was_asked(floor_url: str) -> None:
    items = [{k: v for k, v in n.items() if k != "kind"} for n in NODES]
    by_names = be._args_body(orjson.dumps(POD), None, orjson.dumps(NAMES))
    by_nodes = be._args_body(orjson.dumps(POD), items, b"")
    for body, form in ((by_names, "names"), (by_nodes, "nodes")):
        wire.ExtenderArgs.model_validate_json(body)  # the request is kube-scheduler's ExtenderArgs
        status, out, timing = _post(floor_url, f"{be.PREFIX}/filter", body)
        assert status == 200
        result = wire.ExtenderFilterResult.model_validate(out)
        assert result.Error == "" and result.FailedNodes == {} and result.FailedAndUnresolvableNodes == {}
        if form == "names":
            assert result.NodeNames == NAMES and out["Nodes"] is None
        else:
            assert out["NodeNames"] is None and out["Nodes"]["items"] == items
        assert timing is not None and re.fullmatch(r"floor;dur=[0-9.]+", timing)


def test_floor_prioritize_scores_every_node_five_and_bind_answers_no_error(floor_url: str) -> None:
    items = [{k: v for k, v in n.items() if k != "kind"} for n in NODES]
    for body in (be._args_body(orjson.dumps(POD), None, orjson.dumps(NAMES)),
                 be._args_body(orjson.dumps(POD), items, b"")):
        status, out, _ = _post(floor_url, "/prioritize", body)
        assert status == 200
        hosts = [wire.HostPriority.model_validate(h) for h in out]
        assert [(h.Host, h.Score) for h in hosts] == [(n, floor.FLOOR_SCORE) for n in NAMES]
    bind = {"PodName": "p", "PodNamespace": "bench", "PodUID": "u", "Node": NAMES[0]}
    status, out, _ = _post(floor_url, f"{be.PREFIX}/bind", orjson.dumps(bind))
    assert status == 200 and wire.ExtenderBindingResult.model_validate(out).Error == ""


def test_floor_refuses_what_is_not_extender_args_naming_the_field(floor_url: str) -> None:
    status, out, _ = _post(floor_url, "/filter", b"{not json")
    assert status == 400 and out["Error"].startswith("filter: body is not JSON")
    status, out, _ = _post(floor_url, "/prioritize", orjson.dumps({"Pod": {}, "NodeNames": ["a", 3]}))
    assert status == 400 and "ExtenderArgs.NodeNames" in out["Error"]
    status, out, _ = _post(floor_url, "/filter", orjson.dumps({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}))
    assert status == 400 and "ExtenderArgs.Nodes.items[0].metadata.name" in out["Error"]
    status, out, _ = _post(floor_url, "/bind", orjson.dumps({"PodName": "p"}))
    assert status == 400 and "ExtenderBindingArgs.PodNamespace" in out["Error"]
    status, out, _ = _post(floor_url, "/vramfit/preempt", b"{}")
    assert status == 404


@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 50)), min_size=1, max_size=40))
def test_top_of_is_the_highest_score_first_name(pairs: list[tuple[int, int]]) -> None:
    scores = [{"Host": f"n{h:02d}", "Score": s} for s, h in pairs]
    top, ties = be.top_of(scores)
    high = max(s for s, _ in pairs)
    assert top == min(f"n{h:02d}" for s, h in pairs if s == high)
    assert ties == sum(s == high for s, _ in pairs)
    assert be.top_of(list(reversed(scores))) == (top, ties)  # the answer's order does not matter


# ---- the floor arm in bench_extender ------------------------------------------------------------------------

def test_usage_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert be.main(["--nodes", "5000,ten", "--no-write"]) == 2
    assert "--nodes '5000,ten'" in capsys.readouterr().err
    assert be.main(["--plan", "--nodes", "100,200", "--no-write"]) == 2
    assert "--plan runs one cluster size" in capsys.readouterr().err
    assert be.main(["--policy", "vramfit,floor", "--no-write"]) == 2
    assert "'floor' is the floor" in capsys.readouterr().err
    assert be.main(["--shortlist", "0", "--no-write"]) == 2
    assert "at least 1" in capsys.readouterr().err
    monkeypatch.setattr(be, "default_shortlist", lambda: None)  # an extender without the key
    assert be.main(["--shortlist", "8", "--no-write"]) == 2
    assert "no config key shortlist_k" in capsys.readouterr().err


def test_a_tiny_run_writes_every_figure_as_a_ratio_to_the_floor(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(be, "RESULTS", tmp_path)
    args = ["--nodes", "60,100", "--cycles", "5", "--warmup", "1", "--full-nodes", "0", "--policy", "best-fit",
            "--out-stem", "floor_tiny"]
    if be.default_shortlist() is not None:
        args += ["--shortlist", "8"]
    assert be.main(args) == 0
    report = json.loads((tmp_path / "floor_tiny.json").read_text())
    runs = report["runs"]
    arms = [r for r in runs if r["policy"] != be.FLOOR]
    floors = [r for r in runs if r["policy"] == be.FLOOR]
    assert len(arms) == len(floors) == 2 * (2 if "--shortlist" in args else 1)
    for arm, fl in zip(runs[::2], runs[1::2], strict=True):  # each arm, then its floor
        assert fl["policy"] == be.FLOOR and fl["floor_of"] == arm["arm"] and fl["nodes"] == arm["nodes"]
        x = arm["vs_floor"]
        assert x["cycles_per_s"] == pytest.approx(arm["cycles_per_s"] / fl["cycles_per_s"], rel=0.02)
        for verb in ("filter", "prioritize", "bind", be.FP):
            for q in ("p50", "p99"):
                assert x[verb][q] == pytest.approx(arm[verb][f"{q}_ms"] / fl[verb][f"{q}_ms"], rel=0.02)
        assert x["prioritize"]["in_server_p99"] == pytest.approx(
            arm["prioritize"]["in_server"]["p99_ms"] / fl["prioritize"]["in_server"]["p99_ms"], rel=0.02)
        assert len(arm["tops"]) == 6 and all(t in {f"gpu-node-{k:05d}" for k in range(arm["nodes"])}
                                             for t in arm["tops"])
        assert fl["outcomes"]["bound"] == 5 and set(fl["tops"]) == {"gpu-node-00000"}  # all tie: the first name
    assert [e["arm"] for e in report["slope"]] == list(dict.fromkeys(a["arm"] for a in arms))
    assert all([p["nodes"] for p in e["points"]] == [60, 100] and "floor_growth" in e for e in report["slope"])
    if "--shortlist" in args:
        checks = report["placement"]
        assert [(c["nodes"], c["shortlist"], c["cycles"]) for c in checks] == [(60, 8, 6), (100, 8, 6)]
        assert all(c["differ"] == 0 for c in checks)  # the shortlist keeps the node prioritize ranks first
        for run in report["checks"]:  # the check run: both tops of every cycle kept
            assert len(run["tops"]) == len(run["check_tops"]) == 6 and run["shortlist"] == 8
    text = (tmp_path / "floor_tiny.md").read_text()
    assert "## Against the floor" in text and "### Issue 30's targets" in text
