"""`vramfit whatif --usage PEAKS.csv` / `--usage-from-nodes` (issue 31 item 4): right-sizing by measured peaks.

Fixture (tests/fixtures/usage/): two MPS H100s, each held by a chat pod booked 60 GiB that peaks near 20 GiB, and
a pending pod asking 50 GiB that fits nowhere until they are right-sized.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kubeio.files import load_snapshot
from packing.model import Assignment, GpuGrant, PodDemand
from vramfit.cli import main
from vramfit.whatif import load_catalog_arg
from vramfit.whatif_usage import MIB, recommend_mib

FIX = Path(__file__).parents[1] / "fixtures" / "usage"
CLUSTER, PENDING, PEAKS = str(FIX / "cluster.yaml"), str(FIX / "pending.yaml"), str(FIX / "peaks.csv")
GiB = 1 << 30


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def whatif_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = cli(capsys, "whatif", "--snapshot", CLUSTER, "--format", "json", *argv)
    assert code == 0, err
    return json.loads(out)


def peaks_of(path: str) -> dict[str, int]:
    lines = Path(path).read_text().splitlines()[1:]
    return {pod: int(b) for pod, b in (ln.split(",") for ln in lines)}


def assert_rules_hold(doc: dict[str, Any]) -> None:
    """Every placement after right-sizing books again on the snapshot's cluster, through the one rule check
    (`ClusterState.allocate` raises on any broken rule and applies nothing partially)."""
    state = load_snapshot(CLUSTER, load_catalog_arg(None)).state
    for r in doc["placements_after_usage"]:
        if r["status"] == "running":
            state.release(r["pod"])
    for r in doc["placements_after_usage"]:
        if r["node"]:
            held = [h.pod for h in state.holders() if h.pod.key == r["pod"]]
            assert not held
            demand = PodDemand(key=r["pod"], vram_mib=r["vram_mib"], gpu_count=r["gpu_count"], tenant=r["tenant"])
            grants = tuple(GpuGrant(g["index"], g["vram_mib"], g["mig"]) for g in r["gpus"])
            state.allocate(demand, Assignment(r["node"], grants))


def test_right_sizing_places_the_pending_pod_and_keeps_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    doc = whatif_json(capsys, "--pods", PENDING, "--usage", PEAKS)
    u = doc["summary"]["usage"]
    assert u["margin_percent"] == 10 and u["source"] == PEAKS
    before, after = u["before"], u["after"]
    assert before["pods_placed"] == 2 and before["pending_placed"] == 0  # 50 GiB fits on no 60-GiB-booked GPU
    assert after["pods_placed"] == 3 >= before["pods_placed"] and after["pending_placed"] == 1
    assert after["booked_vram_mib"] < before["booked_vram_mib"] + 51200
    assert {"placements", "placements_after_usage", "recommendations"} <= set(doc)
    assert doc["placements"][0]["node"] is None  # the answer itself is unchanged: right-sizing sits beside it
    peaks = peaks_of(PEAKS)
    recs = {r["pod"]: r for r in doc["recommendations"]}
    assert set(recs) == set(peaks)
    for pod, r in recs.items():
        assert r["recommended_mib"] * MIB >= peaks[pod] * 1.1  # never below the peak plus margin
        assert r["recommended_mib"] == math.ceil(peaks[pod] * 1.1 / MIB)
        assert r["requested_mib"] == r["booked_mib"] == 61440 and r["status"] == "running"
        assert r["freed_mib"] == 61440 - r["recommended_mib"] and r["peak_bytes"] == peaks[pod]
    rows = {r["pod"]: r for r in doc["placements_after_usage"]}
    assert set(rows) == {*peaks, "team-a/embed-0"}
    assert all(r["node"] == "h100-mps" for r in rows.values())
    assert rows["team-a/chat-0"]["vram_mib"] == recs["team-a/chat-0"]["recommended_mib"]
    assert rows["team-a/embed-0"]["vram_mib"] == 51200  # not listed: keeps its request
    assert_rules_hold(doc)


def test_right_sizing_from_the_nodes_frees_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    doc = whatif_json(capsys, "--usage-from-nodes", "--margin", "20%")
    u = doc["summary"]["usage"]
    assert u["source"] == "vramfit.io/pod-usage" and u["margin_percent"] == 20
    assert u["before"]["gpus_used"] == 2 and u["after"]["gpus_used"] == 1  # both chat pods now share one GPU
    assert u["after"]["pods_placed"] == u["before"]["pods_placed"] == 2
    recs = {r["pod"]: r for r in doc["recommendations"]}
    # A pod's peak per GPU adds its containers' peaks on the unit (chat-1: main 22 GiB + sidecar 1 GiB).
    assert recs["team-a/chat-1"]["peak_bytes"] == 23 * GiB
    assert recs["team-a/chat-0"]["recommended_mib"] == math.ceil(20 * 1024 * 1.2)
    assert_rules_hold(doc)


def test_margin_is_a_percentage_with_or_without_the_sign(capsys: pytest.CaptureFixture[str]) -> None:
    a = whatif_json(capsys, "--usage", PEAKS, "--margin", "25")
    b = whatif_json(capsys, "--usage", PEAKS, "--margin", "25%")
    assert a["recommendations"] == b["recommendations"]
    zero = whatif_json(capsys, "--usage", PEAKS, "--margin", "0")
    assert {r["pod"]: r["recommended_mib"] for r in zero["recommendations"]} == {
        p: math.ceil(b / MIB) for p, b in peaks_of(PEAKS).items()}


@pytest.mark.parametrize("argv, words", [
    (("--usage", PEAKS, "--margin", "-5"), ("--margin", "negative")),
    (("--usage", PEAKS, "--margin", "ten"), ("--margin", "percentage")),
    (("--usage", PEAKS, "--usage-from-nodes"), ("--usage-from-nodes",)),
])
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], words: tuple[str, ...]) -> None:
    out, code = "", None  # type: tuple[str, Any]
    try:
        code, out, err = cli(capsys, "whatif", "--snapshot", CLUSTER, *argv)
    except SystemExit as exc:  # argparse's own usage errors (two flags of one exclusive group)
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and out == ""
    assert all(w in err for w in words), err


def test_margin_without_usage_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "whatif", "--snapshot", CLUSTER, "--pods", PENDING, "--margin", "10")
    assert code == 2 and "--margin" in err and "--usage" in err


@pytest.mark.parametrize("text, line, field", [
    ("team-a/chat-0,1000\n", 1, "header"),
    ("", 1, "header"),
    ("pod,bytes\nteam-a/chat-0,1000\n", 1, "header"),
    ("pod,peak_bytes\nteam-a/chat-0,1000\nteam-a/chat-1,lots\n", 3, "peak_bytes"),
    ("pod,peak_bytes\nteam-a/chat-0,-1\n", 2, "peak_bytes"),
    ("pod,peak_bytes\nteam-a/chat-0,nan\n", 2, "peak_bytes"),
    ("pod,peak_bytes\nteam-a/chat-0,\n", 2, "peak_bytes"),
    ("pod,peak_bytes\nchat-0,1000\n", 2, "pod"),
    ("pod,peak_bytes\nteam-a/chat-0,1000\n\nteam-a/chat-0,2000\n", 4, "pod"),
])
def test_bad_csv_exits_2_naming_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                    line: int, field: str) -> None:
    path = tmp_path / "peaks.csv"
    path.write_text(text)
    code, out, err = cli(capsys, "whatif", "--snapshot", CLUSTER, "--usage", str(path))
    assert code == 2 and out == ""
    assert f"{path}: line {line}: " in err and field in err, err


def test_unknown_pod_is_a_warning_and_columns_may_be_reordered(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "peaks.csv"
    path.write_text(f"node,peak_bytes,pod\nx,{8 * GiB},team-a/chat-0\nx,{GiB},team-z/gone\n")
    code, out, err = cli(capsys, "whatif", "--snapshot", CLUSTER, "--usage", str(path))
    assert code == 0
    assert f"{path} line 3: pod team-z/gone" in err and "ignored" in err
    assert "team-a/chat-0" in out and "team-z/gone" not in out
    doc = whatif_json(capsys, "--usage", str(path))
    assert [r["pod"] for r in doc["recommendations"]] == ["team-a/chat-0"]
    assert any("team-z/gone" in w for w in doc["warnings"])


def test_a_listed_pending_pod_is_right_sized_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "peaks.csv"
    path.write_text(f"pod,peak_bytes\nteam-a/embed-0,{10 * GiB}\n")
    doc = whatif_json(capsys, "--pods", PENDING, "--usage", str(path))
    (rec,) = doc["recommendations"]
    assert rec["status"] == "pending" and rec["booked_mib"] is None and rec["recommended_mib"] == 11264
    (row,) = doc["placements_after_usage"]
    assert row["node"] == "h100-mps" and row["vram_mib"] == 11264 and row["status"] == "pending"
    assert doc["summary"]["usage"]["after"]["pending_placed"] == 1


def test_table_shows_before_after_and_recommendations(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "whatif", "--snapshot", CLUSTER, "--pods", PENDING, "--usage", PEAKS, "--online")
    assert code == 0
    assert "== right-sized by measured peaks" in out and "margin 10%" in out
    assert "RECOMMENDED MiB" in out and "team-a/chat-0" in out
    pods_placed = next(line for line in out.splitlines() if line.startswith("pods placed"))
    assert pods_placed.split()[-2:] == ["2", "3"]


def _snapshot_with(tmp_path: Path, edit: Any) -> str:
    text = Path(CLUSTER).read_text()
    doc = yaml.safe_load(text)
    node = doc["items"][0]
    usage = json.loads(node["metadata"]["annotations"]["vramfit.io/pod-usage"])
    edit(usage)
    node["metadata"]["annotations"]["vramfit.io/pod-usage"] = json.dumps(usage)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_unknown_peak_from_the_nodes_is_not_right_sized(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def unknown(usage: dict[str, Any]) -> None:
        usage["pods"][1]["peak_bytes"] = None

    snap = _snapshot_with(tmp_path, unknown)
    code, out, err = cli(capsys, "whatif", "--snapshot", snap, "--usage-from-nodes", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert [r["pod"] for r in doc["recommendations"]] == ["team-a/chat-0"]
    assert any("team-a/chat-1" in w and "unknown" in w for w in doc["warnings"])


def test_bad_usage_annotation_exits_2_naming_file_node_and_field(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def bad(usage: dict[str, Any]) -> None:
        usage["period_s"] = -1

    snap = _snapshot_with(tmp_path, bad)
    code, _, err = cli(capsys, "whatif", "--snapshot", snap, "--usage-from-nodes")
    assert code == 2 and snap in err and "node h100-mps" in err and "period_s" in err


@given(peak=st.integers(min_value=0, max_value=1 << 42), margin=st.fractions(min_value=0, max_value=500))
def test_recommendation_is_the_least_whole_mib_at_or_above_peak_plus_margin(peak: int, margin: Any) -> None:
    rec = recommend_mib(peak, margin)
    target = peak * (1 + margin / 100)
    assert rec >= 1 and rec * MIB >= target >= peak
    assert rec == 1 or (rec - 1) * MIB < target


def test_a_pod_above_its_request_is_raised_and_one_that_fits_nowhere_stays(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "peaks.csv"
    path.write_text(f"pod,peak_bytes\nteam-a/chat-0,{64 * GiB}\nteam-a/chat-1,{100 * GiB}\n")
    doc = whatif_json(capsys, "--usage", str(path))
    recs = {r["pod"]: r for r in doc["recommendations"]}
    assert recs["team-a/chat-0"]["freed_mib"] < 0  # it needs more than it asked: the recommendation says so
    rows = {r["pod"]: r for r in doc["placements_after_usage"]}
    assert rows["team-a/chat-0"]["vram_mib"] == recs["team-a/chat-0"]["recommended_mib"]
    # 110 GiB fits no 80 GB GPU: the pod keeps its units and its old request, with a warning.
    kept = rows["team-a/chat-1"]
    assert kept["node"] == "h100-mps" and kept["vram_mib"] == 61440 and "kept where it runs" in kept["reason"]
    assert any("team-a/chat-1" in w and "fits nowhere" in w for w in doc["warnings"])
    assert doc["summary"]["usage"]["after"]["pods_placed"] == 2
