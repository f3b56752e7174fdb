"""`vramfit whatif` and `vramfit demo` end to end, through the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vramfit.cli import main
from vramfit.demo import DEMO_CLUSTER, DEMO_PODS


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_whatif_json_on_the_demo_files(capsys) -> None:
    code, out, _ = run_cli(capsys, "whatif", "--snapshot", str(DEMO_CLUSTER), "--pods", str(DEMO_PODS),
                           "--format", "json")
    assert code == 0
    doc = json.loads(out)
    s = doc["summary"]
    assert s["placed"] + s["unplaced"] == len(doc["placements"]) == 16
    assert set(s) >= {"placed", "unplaced", "gpus_used", "stranded_vram_mib"}
    by_pod = {p["pod"]: p for p in doc["placements"]}
    seventy = by_pod["team-e/llm-70b-fp16"]
    assert seventy["node"] is None and "never fits" in seventy["reason"]
    ddp = by_pod["team-c/ddp-train-2gpu"]
    assert ddp["node"] and len({g["index"] for g in ddp["gpus"]}) == 2
    # The running notebook keeps its instance: nobody else is given 3g.40gb@0 on GPU 0 of a100-mig-a.
    for p in doc["placements"]:
        if p["node"] == "a100-mig-a":
            assert {"index": 0, "mig": "3g.40gb@0"} not in [{"index": g["index"], "mig": g["mig"]} for g in p["gpus"]]


def test_vramfit_beats_whole_gpu_on_the_demo(capsys) -> None:
    code, out, _ = run_cli(capsys, "demo", "--format", "json")
    assert code == 0
    runs = json.loads(out)
    whole, ours = runs["whole-gpu"]["summary"], runs["vramfit"]["summary"]
    assert ours["placed"] > whole["placed"]
    assert ours["stranded_vram_mib"] < whole["stranded_vram_mib"]
    # The honest baseline: as many placed, but only by over-committing replicas and mixing tenants.
    stock = runs["device-plugin"]["summary"]
    assert ours["placed"] >= stock["placed"] and ours["gpus_used"] <= stock["gpus_used"]
    assert stock["over_commits"] > 0 and stock["tenant_mixes"] > 0
    assert ours["over_commits"] == ours["tenant_mixes"] == 0
    code, out, _ = run_cli(capsys, "demo")
    assert code == 0 and "pods placed" in out and "WHY PENDING" in out


def test_readme_shows_the_demo_summary_it_prints(capsys) -> None:
    # The README quotes the demo's summary; it must stay what the command prints.
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code, out, _ = run_cli(capsys, "demo")
    assert code == 0
    summary = out.splitlines()[2:10]
    assert summary[0].split() == ["whole-gpu", "device-plugin", "vramfit"]
    assert "\n".join(summary) in readme


def write(tmp_path: Path, name: str, docs) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs) if isinstance(docs, list) else docs)
    return str(path)


def test_bad_files_name_file_object_and_field(tmp_path, capsys) -> None:
    cluster = write(tmp_path, "cluster.yaml", [{"kind": "Node", "metadata": {"name": "n1", "annotations": {
        "vramfit.io/gpus": json.dumps([{"index": 0, "product": "NVIDIA-A100-SXM4-80GB", "mode": "sliced"}])}}}])
    pods = write(tmp_path, "pods.yaml", [{"kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                                      "annotations": {"vramfit.io/vram": "1Gi"}},
                                          "spec": {"containers": []}}])
    code, _, err = run_cli(capsys, "whatif", "--snapshot", cluster, "--pods", pods)
    assert code == 2 and "cluster.yaml" in err and "node n1" in err and "mode" in err

    good_cluster = str(DEMO_CLUSTER)
    bad_pods = write(tmp_path, "bad-pods.yaml", [{"kind": "Pod", "metadata": {
        "name": "p", "namespace": "ns", "annotations": {"vramfit.io/vram": "1Gi", "vramfit.io/gpus": "many"}}}])
    code, _, err = run_cli(capsys, "whatif", "--snapshot", good_cluster, "--pods", bad_pods)
    assert code == 2 and "bad-pods.yaml" in err and "pod ns/p" in err and "vramfit.io/gpus" in err

    not_yaml = write(tmp_path, "broken.yaml", "kind: Pod\n  metadata: [\n")
    code, _, err = run_cli(capsys, "whatif", "--snapshot", not_yaml, "--pods", bad_pods)
    assert code == 2 and "broken.yaml" in err and "line" in err

    code, _, err = run_cli(capsys, "whatif", "--snapshot", str(tmp_path / "missing.yaml"), "--pods", bad_pods)
    assert code == 2 and "missing.yaml: no such file" in err

    code, _, err = run_cli(capsys, "whatif", "--snapshot", good_cluster, "--pods", str(DEMO_PODS),
                           "--policy", "nope")
    assert code == 2 and "--policy" in err and "best-fit" in err


def test_policies_command_lists_the_registry(capsys) -> None:
    code, out, _ = run_cli(capsys, "policies")
    assert code == 0
    for name in ("whole-gpu", "first-fit", "best-fit", "spread", "vramfit"):
        assert name in out


def test_help_works(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["whatif", "--help"])
    assert exit_info.value.code == 0
    assert "--snapshot" in capsys.readouterr().out


def test_every_registered_policy_places_on_every_mode() -> None:
    """One registry used everywhere: no policy may leave a feasible pod unplaced because its own unit
    choice does not know a mode (the trace policies know only pooled milli-GPUs)."""
    from packing.catalog import load_catalog
    from packing.policies import policy_names
    from vramfit.whatif import load_cluster, load_pending, simulate

    catalog = load_catalog()
    for name in policy_names():
        state, _ = load_cluster(str(DEMO_CLUSTER), catalog)
        doc = simulate(state, load_pending(str(DEMO_PODS)), name)
        unplaced = [p for p in doc["placements"] if p["node"] is None]
        expected = 6 if name == "whole-gpu" else 1  # whole GPUs run out; the 70B pod never fits
        assert len(unplaced) == expected, (name, [p["pod"] for p in unplaced])
        for p in unplaced:
            assert "full now" in p["reason"] or "never fits" in p["reason"]
