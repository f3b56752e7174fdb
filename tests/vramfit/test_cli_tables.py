"""`vramfit whatif` solver answers in the default table format: --optimal, --capacity, --repartition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramfit.cli import main
from vramfit.demo import DEMO_CLUSTER, DEMO_PODS

# Generous: the demo's questions are proven in about a second; a busy CI machine must not turn them unproven.
LIMIT = "20"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def whatif(capsys: pytest.CaptureFixture[str], *flags: str, pods: bool = True,
           pods_file: Path = DEMO_PODS) -> tuple[dict, str]:
    """The same question in JSON and in the table format."""
    base = ["whatif", "--snapshot", str(DEMO_CLUSTER), *(["--pods", str(pods_file)] if pods else []), *flags]
    code, out, err = run_cli(capsys, *base, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    code, table, err = run_cli(capsys, *base)
    assert code == 0, err
    return doc, table


def row(table: str, label: str) -> list[str]:
    """The cells of the first table line starting with `label`, after the label."""
    return rows(table, label)[0]


def rows(table: str, label: str) -> list[list[str]]:
    """The cells of every table line starting with `label`, after the label."""
    return [ln[len(label):].split() for ln in table.splitlines() if ln.startswith(label)]


@pytest.mark.parametrize(("flags", "answer"), [((), "queue plan"), (("--online",), "online")])
def test_optimal_table_shows_online_and_optimal_side_by_side(capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
                                                             answer: str) -> None:
    # The default answer is the extender's (queue planned, then followed); --online the online policy alone.
    doc, table = whatif(capsys, "--optimal", "--time-limit", LIMIT, *flags)
    c = doc["summary"]["online_vs_optimal"]
    assert c["planning"] == ("queue" if answer == "queue plan" else "off")
    assert f"== {answer} ({c['policy']}) vs optimal" in table and f"{answer} ({c['policy']})" in table
    assert row(table, "pods placed") == [str(c["online_placed"]), str(c["optimal_placed"])]
    assert row(table, "GPUs opened") == [str(c["online_gpus_opened"]), str(c["optimal_gpus_opened"])]
    assert row(table, "GPUs used") == [str(c["online_gpus_used"]), str(c["optimal_gpus_used"])]
    assert row(table, "stranded VRAM (MiB)") == [str(c["online_stranded_vram_mib"]), str(c["optimal_stranded_vram_mib"])]
    assert row(table, "placed-unit slack (MiB)") == ["-", str(c["optimal_placed_unit_slack_mib"])]
    # The solver's status and gap.
    s = doc["summary"]
    assert s["optimal"] is True and s["gap"] == 0
    assert "solver: proven optimal" in table
    for st in c["stages"]:
        assert f"{st['name']} {st['value']} ({st['status']}" in table
    # The footer says what each waste figure measures.
    assert "stranded VRAM: on every GPU in use" in table and "placed-unit slack: the solver's third objective" in table


def test_optimal_json_names_its_two_waste_figures(capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = whatif(capsys, "--optimal", "--time-limit", LIMIT)
    c = doc["summary"]["online_vs_optimal"]
    assert set(c["definitions"]) == {"stranded_vram_mib", "placed_unit_slack_mib"}
    names = [st["name"] for st in c["stages"]]
    assert names == ["placed", "gpus_opened", "placed_unit_slack_mib"]
    slack_stage = c["stages"][2]["value"]
    assert c["optimal_placed_unit_slack_mib"] == slack_stage
    # The cluster-wide figure is the summary's own definition: the online side equals the summary's.
    assert c["online_stranded_vram_mib"] == doc["summary"]["stranded_vram_mib"]
    # GPUs opened: idle before, in use after; the cluster had some in use already.
    assert c["online_gpus_opened"] < c["online_gpus_used"]


def test_capacity_runs_without_pods_and_shows_nodes_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    doc, table = whatif(capsys, "--capacity", "14Gi", pods=False)
    cap = doc["capacity"]
    assert cap["shape"]["vram_mib"] == 14336 and doc["placements"] == []
    assert cap["total"] == sum(cap["nodes"].values()) > 0
    assert "more pods of 14336 MiB" in table and "WHY PENDING" not in table
    for node, n in cap["nodes"].items():
        assert row(table, node) == [str(n)]
    assert row(table, "total") == [str(cap["total"])]
    assert row(table, "cluster:")[:3] == ["GPUs", "used", f"{doc['summary']['gpus_used']}/{doc['summary']['gpus_total']},"]


def test_capacity_after_repartition_is_a_second_column(capsys: pytest.CaptureFixture[str]) -> None:
    doc, table = whatif(capsys, "--capacity", "14Gi", "--repartition", pods=False)
    cap = doc["capacity"]
    after = cap["after_repartition"]
    assert "AFTER RE-PARTITION" in table and "plan" not in doc
    for node, n in cap["nodes"].items():
        assert row(table, node) == [str(n), str(after["nodes"][node])]
    assert row(table, "total") == [str(cap["total"]), str(after["total"])]


def test_capacity_reads_quantities_by_the_vram_rule(capsys: pytest.CaptureFixture[str]) -> None:
    # The pods' rule (packing.k8s.quantity.vram_to_mib): bare number = MiB, 14Gi = 14336, k = thousands of MiB.
    for raw, mib in (("14336", 14336), ("14Gi", 14336), ("14G", 13352), ("16k", 16000)):
        code, out, err = run_cli(capsys, "whatif", "--snapshot", str(DEMO_CLUSTER), "--capacity", raw,
                                 "--format", "json")
        assert code == 0, err
        assert json.loads(out)["capacity"]["shape"]["vram_mib"] == mib, raw
    code, _, err = run_cli(capsys, "whatif", "--snapshot", str(DEMO_CLUSTER), "--capacity", "lots")
    assert code == 2 and "--capacity" in err and "'lots'" in err


def test_repartition_table_shows_the_plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    # The JSON and the table come from two runs; CP-SAT with two workers may return either of two equally good
    # plans, so both runs are given the first run's plan (the solver is not what this test is about).
    import vramfit.whatif_solvers as ws

    solve, first = ws.plan_repartition, []

    def once(*args: object, **kwargs: object) -> object:
        if not first:
            first.append(solve(*args, **kwargs))  # type: ignore[arg-type]
        return first[0]

    monkeypatch.setattr(ws, "plan_repartition", once)
    # The demo's 70B model over two GPUs gains from a re-partition (two 7g.80gb instances) once it says each
    # of its processes picks its own GPU: a pod gets several MIG instances only then (packing.modes.combine).
    pods = tmp_path / "pods.yaml"
    pods.write_text(DEMO_PODS.read_text().replace(
        "    vramfit.io/vram: 72Gi\n", "    vramfit.io/vram: 72Gi\n    vramfit.io/gpu-per-process: 'true'\n"))
    doc, table = whatif(capsys, "--repartition", "--time-limit", LIMIT, pods_file=pods)
    assert len(first) == 1
    assert doc["plan"], "the demo's queue gains from a re-partition"
    r = doc["summary"]["repartition"]
    assert f"placed {r['placed']}, pending {r['unplaced']}, pods to drain {r['drained']}" in table
    assert "OLD LAYOUT" in table and "NEW LAYOUT" in table and "PODS TO DRAIN" in table
    for e in doc["plan"]:
        # A node may have several GPUs re-partitioned: the table line of this entry's GPU.
        cells = next(c for c in rows(table, e["node"]) if c[0] == str(e["gpu"]))
        assert cells[:3] == [str(e["gpu"]), ",".join(e["old_layout"]), ",".join(e["new_layout"])]
        assert cells[3] == (",".join(e["drain"]) or "-")
        assert e["new_layout"] == [f"{p['profile']}@{p['start']}" for p in e["layout"]]
    for node in doc["mig_parted"]:
        assert f"kubectl label node {node} nvidia.com/mig.config=" in table


def test_solver_flags_that_need_pods_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, named in ((["--optimal"], "--optimal"), (["--repartition"], "--repartition"), ([], "--pods")):
        code, out, err = run_cli(capsys, "whatif", "--snapshot", str(DEMO_CLUSTER), *flags)
        assert code == 2 and named in err and "--pods" in err and out == "", flags
