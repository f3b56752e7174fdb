"""`vramfit inspect`'s per-pod usage (issue 31 item 4): booked, used and peak per pod from the node agent's
`vramfit.io/pod-usage`, per container/GPU where a pod has several, over-booking flagged, unmapped processes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.apiserver import FakeApiServer
from hypothesis import given
from hypothesis import strategies as st

from packing.k8s.pod_usage import NodeUsageReport, PodUsage
from vramfit.cli import main
from vramfit.inspect_usage import pod_figures

FIX = Path(__file__).parents[1] / "fixtures" / "usage"
CLUSTER = FIX / "cluster.yaml"
GiB, MiB = 1 << 30, 1 << 20


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cluster_with(tmp_path: Path, edit: Any) -> str:
    doc = yaml.safe_load(CLUSTER.read_text())
    ann = doc["items"][0]["metadata"]["annotations"]
    usage = json.loads(ann["vramfit.io/pod-usage"])
    edit(usage)
    ann["vramfit.io/pod-usage"] = usage if isinstance(usage, str) else json.dumps(usage)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def row(out: str, start: str) -> list[str]:
    return next(line for line in out.splitlines() if line.strip().startswith(start)).split()


def test_snapshot_shows_booked_used_and_peak_per_pod_and_unmapped(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "inspect", "--snapshot", str(CLUSTER))
    assert code == 0
    assert "Per-pod VRAM use" in out and "node h100-mps (sampled 2026-12-06T07:00:00Z, every 5 s)" in out
    assert row(out, "team-a/chat-0") == ["team-a/chat-0", "main", "GPU-11111111-0000-0000-0000-000000000000", "mps",
                                         "61440", "MiB", "18432", "MiB", "20480", "MiB"]
    # Two containers on one unit: the booking counted once, the peaks added; main's use is unknown, so the
    # pod's is too (never 0), and each entry is listed under it.
    assert row(out, "team-a/chat-1") == ["team-a/chat-1", "(2", "entries)", "61440", "MiB", "unknown", "23552", "MiB"]
    assert row(out, "main") == ["main", "GPU-22222222-0000-0000-0000-000000000000", "mps", "61440", "MiB", "unknown",
                                "22528", "MiB"]
    assert row(out, "sidecar")[-4:] == ["1024", "MiB", "1024", "MiB"]
    assert "unmapped: pid 4242 on GPU-11111111-0000-0000-0000-000000000000: 512 MiB (no pod cgroup)" in out
    assert "OVER" not in out


def test_a_pod_over_its_booking_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def over(usage: dict[str, Any]) -> None:
        usage["pods"][0].update(used_bytes=62 * GiB, peak_bytes=62 * GiB, over=True)

    code, out, _ = cli(capsys, "inspect", "--snapshot", cluster_with(tmp_path, over))
    assert code == 0
    assert row(out, "team-a/chat-0")[-5:] == ["OVER", "booking", "by", "2048", "MiB"]
    assert "OVER" not in " ".join(row(out, "team-a/chat-1"))
    code, out, _ = cli(capsys, "inspect", "--snapshot", cluster_with(tmp_path, over), "--format", "html")
    assert code == 0 and '<tr class="over"><td>team-a/chat-0</td>' in out and out.count('class="over"') == 1


def test_a_pod_vramfit_did_not_book_shows_no_booking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def foreign(usage: dict[str, Any]) -> None:
        usage["pods"].append({**usage["pods"][0], "pod": "legacy-0", "namespace": "team-x", "uid": "u9",
                              "booked_bytes": None, "used_bytes": 3 * GiB, "peak_bytes": None})

    code, out, _ = cli(capsys, "inspect", "--snapshot", cluster_with(tmp_path, foreign))
    assert code == 0
    assert row(out, "team-x/legacy-0")[4:] == ["-", "3072", "MiB", "unknown"]


def test_html_view_has_the_usage_table_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def odd(usage: dict[str, Any]) -> None:
        usage["unmapped"][0]["why"] = "<no pod cgroup>"

    code, out, _ = cli(capsys, "inspect", "--snapshot", cluster_with(tmp_path, odd), "--format", "html")
    assert code == 0
    assert "<h2>Per-pod VRAM use</h2>" in out and "<th>BOOKED</th><th>USED</th><th>PEAK</th>" in out
    assert "<td>unknown</td>" in out and "&lt;no pod cgroup&gt;" in out and "<no pod cgroup>" not in out
    assert out.index("Per-pod VRAM use") < out.index("</body>")


def test_a_bad_usage_annotation_is_a_warning_naming_node_and_field(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def bad(usage: dict[str, Any]) -> None:
        usage["pods"][0]["used_bytes"] = -1

    code, out, err = cli(capsys, "inspect", "--snapshot", cluster_with(tmp_path, bad))
    assert code == 0 and "h100-mps" in out and "Per-pod VRAM use" not in out
    assert "node h100-mps" in err and "pods[0].used_bytes" in err


def test_no_usage_annotation_no_section(capsys: pytest.CaptureFixture[str]) -> None:
    from vramfit.demo import DEMO_CLUSTER

    code, out, _ = cli(capsys, "inspect", "--snapshot", str(DEMO_CLUSTER))
    assert code == 0 and "Per-pod VRAM use" not in out


def test_live_view_reads_the_nodes_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = yaml.safe_load(CLUSTER.read_text())["items"]
    nodes = [copy.deepcopy(o) for o in items if o["kind"] == "Node"]
    for n in nodes:
        n["status"]["allocatable"]["vramfit.io/gpu"] = "8"
    fake = FakeApiServer(nodes=nodes, pods=[o for o in items if o["kind"] == "Pod"]).start()
    try:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
               "clusters": [{"name": "c", "cluster": {"server": fake.url}}],
               "users": [{"name": "u", "user": {"token": "t"}}],
               "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        code, out, err = cli(capsys, "inspect", "--kubeconfig", str(path))
    finally:
        fake.stop()
    assert code == 0, err
    assert "Per-pod VRAM use" in out and row(out, "team-a/chat-0")[4:6] == ["61440", "MiB"]


_bytes = st.one_of(st.none(), st.integers(min_value=0, max_value=1 << 40))


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["main", "side"]),
                          st.sampled_from(["GPU-0", "GPU-1"]), _bytes, _bytes, _bytes), max_size=8))
def test_per_pod_totals_never_turn_unknown_into_zero(entries: list[tuple[Any, ...]]) -> None:
    report = NodeUsageReport("2026-12-06T07:00:00Z", 5, tuple(
        PodUsage("ns", pod, "", c, g, "timeslice", used, peak, booked, False)
        for pod, c, g, used, peak, booked in entries))
    for f in pod_figures(report):
        used = [u.used_bytes for u in f.entries]
        assert (f.used_bytes is None) == (None in used)
        if f.used_bytes is not None:
            assert f.used_bytes == sum(u for u in used if u is not None)
        assert f.over_bytes >= 0
        if f.booked_bytes is not None and f.over_bytes == 0:
            # Within the booking on every unit it has one for.
            for g in {u.gpu_uuid for u in f.entries}:
                on = [u for u in f.entries if u.gpu_uuid == g]
                booked = [u.booked_bytes for u in on if u.booked_bytes is not None]
                assert not booked or sum(u.used_bytes or 0 for u in on) <= max(booked)
