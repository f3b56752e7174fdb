"""The readable view: `GET /` in headless Chromium (Debian's package) and `vramfit inspect` in the terminal."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from benchmarks.local_server import LocalServer
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.store import Store
from kubeio.files import read_yaml_documents
from packing.catalog import load_catalog
from vramfit.inspect import kubectl_main

DATA = Path(__file__).resolve().parents[2] / "vramfit" / "data"
CATALOG = load_catalog()
NODES = ("a100-mig-a", "a100-mig-b", "h100-mps", "t4-timeslice")


def demo_store() -> Store:
    """The demo cluster with the demo queue as pending pods."""
    objs = read_yaml_documents(str(DATA / "demo-cluster.yaml")) + read_yaml_documents(str(DATA / "demo-pods.yaml"))
    return Store.from_objects(objs, CATALOG)


def chromium_args(chromium: str, profile: str) -> list[str]:
    # Flags that keep Chromium off the network this machine does not have (see the env notes).
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}"]


def test_the_page_renders_every_node_unit_and_pending_pod_in_chromium() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    store = demo_store()
    with LocalServer(create_app(Settings(), store, MemoryBinder())) as server, \
            tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([*chromium_args(chromium, profile), "--dump-dom", f"{server.url}/"],
                             capture_output=True, text=True, timeout=120).stdout
    for name in NODES:
        assert f'data-node="{name}"' in dom
    assert 'data-holder="team-c/research-notebook-0"' in dom  # a MIG instance and its holder
    assert "grid-column:5 / span 4" in dom  # 3g.40gb@4 drawn at its slice position
    assert "Pending" in dom and "team-a/llm-7b-fp16-1" in dom  # the queue, with its reasons
    assert "fits" in dom


def test_the_page_is_plain_html_without_external_assets() -> None:
    with LocalServer(create_app(Settings(), demo_store(), MemoryBinder())) as server:
        import httpx

        r = httpx.get(f"{server.url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "http://" not in r.text and "https://" not in r.text and "<script" not in r.text


def test_kubectl_vramfit_prints_the_same_view_from_a_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_main(["--snapshot", str(DATA / "demo-cluster.yaml")]) == 0
    out = capsys.readouterr().out
    for name in NODES:
        assert out.count(f"\n{name}  ") + out.startswith(f"{name}  ") == 1
    assert "3g.40gb@0" in out and "team-c/research-notebook-0 (team-c)" in out


def test_inspect_names_a_bad_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert kubectl_main(["--snapshot", str(empty)]) == 2
    assert str(empty) in capsys.readouterr().err
