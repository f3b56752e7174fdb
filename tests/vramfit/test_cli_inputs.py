"""No silent bad input: every snapshot reader (whatif, demo, serve --snapshot) checks a file the same way,
through `kubeio.files.load_snapshot`; each message names the file once and the item that is bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vramfit.cli import main
from vramfit.demo import DEMO_PODS


def gpus(*modes: str) -> str:
    return json.dumps([{"index": i, "product": "NVIDIA-H100-80GB-HBM3", "mode": m} for i, m in enumerate(modes)])


def node(name: str, annotation: str | None = None, **extra: object) -> dict:
    """A node the node agent serves (it advertises vramfit.io/gpu), unless `status` says otherwise."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"vramfit.io/gpus": annotation or gpus("exclusive", "exclusive")}},
            "status": {"allocatable": {"vramfit.io/gpu": "16"}}, **extra}


def running_pod(name: str, node_name: str, gpu: int = 0, **extra: object) -> dict:
    assignment = json.dumps({"gpus": [{"index": gpu, "mig": None, "vram_mib": 81559}]})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "annotations": {"vramfit.io/vram": "81559",
                                                                          "vramfit.io/assignment": assignment}},
            "spec": {"nodeName": node_name, "containers": [{"name": "c"}]}, "status": {"phase": "Running"},
            **extra}


def write(tmp_path: Path, name: str, docs: list | str) -> str:
    path = tmp_path / name
    path.write_text(docs if isinstance(docs, str) else yaml.safe_dump_all(docs))
    return str(path)


def whatif(capsys: pytest.CaptureFixture[str], snapshot: str, *flags: str) -> tuple[int, str, str]:
    code = main(["whatif", "--snapshot", snapshot, "--pods", str(DEMO_PODS), "--format", "json", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def serve(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, snapshot: str) -> tuple[int, str]:
    """`vramfit serve --snapshot` up to the point it would listen (the listener is stubbed out)."""
    import extender.cli
    import extender.listeners

    served: list[object] = []
    monkeypatch.setattr(extender.listeners, "serve", lambda asgi, *a, **k: served.append(asgi) or True)
    monkeypatch.setattr(extender.cli, "freeze_heap_when_ready", lambda *a: None)  # no gc.freeze() in pytest
    code = main(["serve", "--snapshot", snapshot, "--port", "0"])
    _, err = capsys.readouterr()
    assert (code == 0) == bool(served)
    return code, err


def messages(err: str, prefix: str) -> list[str]:
    return [ln.removeprefix(prefix) for ln in err.splitlines() if ln.startswith(prefix)]


def test_an_empty_file_is_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("", "\n---\n# nothing\n"):
        path = write(tmp_path, "empty.yaml", text)
        code, out, err = whatif(capsys, path)
        assert code == 2 and out == ""
        assert err.count(path) == 1 and "empty" in err


def test_no_node_is_exit_2_and_says_what_was_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "deploy.yaml", [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}])
    code, out, err = whatif(capsys, path)
    assert code == 2 and out == ""
    assert err.count(path) == 1 and "no Node objects" in err and "deployment web" in err
    # A node misspelled as `kind: Nod`, alone in its file: nothing is left to answer about.
    path = write(tmp_path, "nod.yaml", [dict(node("n1"), kind="Nod")])
    code, _, err = whatif(capsys, path)
    assert code == 2 and "no Node objects" in err and "nod n1" in err


def test_unread_kinds_are_warnings_naming_file_and_item(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "mixed.yaml", [node("n1"), dict(node("n2"), kind="Nod"),
                                          {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}])
    code, out, err = whatif(capsys, path)
    assert code == 0
    warnings = json.loads(out)["warnings"]
    nod = next(w for w in warnings if "'Nod'" in w)
    assert nod.startswith(f"{path}: document 2 (nod n2):") and "did you mean Node?" in nod and nod.count(path) == 1
    svc = next(w for w in warnings if "'Service'" in w)
    assert svc.startswith(f"{path}: document 3 (service svc):") and "ignored" in svc
    # The table format prints the same warnings on stderr.
    code = main(["whatif", "--snapshot", path, "--pods", str(DEMO_PODS)])
    err = capsys.readouterr().err
    assert code == 0 and messages(err, "warning: ") == warnings


def test_items_of_a_list_are_named_by_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                "items": [node("n1"), {"kind": "ConfigMap", "metadata": {"name": "cm"}}]}))
    code, out, _ = whatif(capsys, str(path))
    assert code == 0
    assert any(w.startswith(f"{path}: items[1] (configmap cm):") for w in json.loads(out)["warnings"])
    path.write_text(json.dumps({"kind": "List", "items": [node("n1"), {"metadata": {"name": "x"}}]}))
    code, _, err = whatif(capsys, str(path))
    assert code == 2 and f"{path}: items[1]: field kind: missing" in err
    path.write_text(json.dumps({"kind": "List", "items": [node("n1"), {"kind": "Pod", "spec": {}}]}))
    code, _, err = whatif(capsys, str(path))
    assert code == 2 and f"{path}: items[1] (Pod): field metadata.name: missing" in err and err.count(str(path)) == 1


def test_a_pod_on_an_unknown_node_is_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "orphan.yaml", [node("n1"), running_pod("held", "n1"), running_pod("typo", "n-1")])
    code, out, _ = whatif(capsys, path)
    assert code == 0
    warnings = json.loads(out)["warnings"]
    orphan = [w for w in warnings if "pod ns/typo" in w]
    assert len(orphan) == 1 and "spec.nodeName 'n-1'" in orphan[0] and "document 3" in orphan[0]
    assert orphan[0].count(path) == 1
    assert not any("pod ns/held" in w for w in warnings)


def test_unknown_top_level_fields_are_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "fields.yaml", [node("n1", specs={"unschedulable": True}),
                                           running_pod("p", "n1", annotations={"x": "y"})])
    code, out, _ = whatif(capsys, path)
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert any(w.startswith(f"{path}: document 1 (node n1): unknown top-level field specs") for w in warnings)
    assert any(w.startswith(f"{path}: document 2 (pod ns/p): unknown top-level field annotations") for w in warnings)


def test_a_clean_snapshot_has_no_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "clean.yaml", [node("n1"), running_pod("p", "n1")])
    code, out, _ = whatif(capsys, path)
    assert code == 0 and json.loads(out)["warnings"] == []
    code = main(["demo"])
    assert code == 0 and "warning" not in capsys.readouterr().err


def test_pods_file_of_other_kinds_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "clean.yaml", [node("n1")])
    pods = write(tmp_path, "pods.yaml", [{"kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                                      "annotations": {"vramfit.io/vram": "1Gi"}},
                                          "spec": {"containers": [{"name": "c"}]}},
                                         {"kind": "Job", "metadata": {"name": "j"}}])
    code = main(["whatif", "--snapshot", cluster, "--pods", pods, "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0 and f"{pods}: document 2 (job j): not a Pod (kind 'Job'): ignored" in json.loads(out)["warnings"]


BAD_ANNOTATION = """\
apiVersion: v1
kind: Node
metadata:
  name: gpu-bad
  annotations:
    vramfit.io/gpus: '[{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "sliced"}]'
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-good
  annotations:
    vramfit.io/gpus: '[{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "exclusive"}]'
"""


def test_serve_and_whatif_reject_the_same_bad_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "bad-annotation.yaml", BAD_ANNOTATION)
    code, _, err = whatif(capsys, path)
    assert code == 2 and "node gpu-bad" in err and "mode" in err and err.count(path) == 1
    serve_code, serve_err = serve(capsys, monkeypatch, path)
    assert serve_code == 2
    assert serve_err.removeprefix("vramfit serve: ") == err.removeprefix("vramfit whatif: ")


def test_serve_and_whatif_accept_and_warn_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "warned.yaml", [node("n1"), dict(node("n2"), kind="Nod"), running_pod("typo", "n-1")])
    code, out, _ = whatif(capsys, path)
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == 2
    serve_code, serve_err = serve(capsys, monkeypatch, path)
    assert serve_code == 0 and messages(serve_err, "vramfit serve: warning: ") == warnings
    for bad in ("", yaml.safe_dump({"kind": "Deployment", "metadata": {"name": "web"}})):
        path = write(tmp_path, "bad.yaml", bad)
        w_code, _, w_err = whatif(capsys, path)
        s_code, s_err = serve(capsys, monkeypatch, path)
        assert w_code == s_code == 2
        assert s_err.removeprefix("vramfit serve: ") == w_err.removeprefix("vramfit whatif: ")
