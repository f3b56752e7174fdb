"""The wheel, built from this tree as a user's `pip install` builds it: it holds the shipped packages and their
data, no benchmark and no trace, and its CLI works from the wheel alone (`vramfit demo`) and offers no bench."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("packing", "kubeio", "extender", "nodeagent", "vramfit")
# Not copied into the build: none is a source of the wheel, and a stale build/ or egg-info would leak into it.
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)  # the whole tree, benchmarks and traces included
    out = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (whl,) = out.glob("vramfit-*.whl")
    return whl


def test_the_wheel_holds_the_shipped_packages_and_no_benchmark_or_trace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == set(SHIPPED)
    assert not [n for n in names if n.startswith("benchmarks/") or "/benchmarks/" in n]
    assert not [n for n in names if n.endswith(".csv") or "trace" in n.rsplit("/", 1)[-1].lower()]
    # The data the shipped code reads comes along.
    assert any(n.startswith("packing/data/") for n in names) and any(n.startswith("vramfit/data/") for n in names)
    assert "nodeagent/api/deviceplugin_v1beta1.proto" in names


def test_the_wheels_cli_runs_the_demo_and_offers_no_bench(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # The unpacked wheel first on the path, outside the source tree, with the benchmarks made unimportable: what
    # runs is what a user's `pip install vramfit` gets (the dependencies come from this environment).
    script = f"""
import contextlib, io, sys
sys.path.insert(0, {str(site)!r})
sys.modules["benchmarks"] = None
import vramfit
assert vramfit.__file__.startswith({str(site)!r}), vramfit.__file__
from vramfit.cli import build_parser, main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["demo"]) == 0
print(build_parser().format_help())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    commands = done.stdout[done.stdout.index("COMMAND"):]
    assert "demo" in commands and "serve" in commands and "node" in commands
    assert "bench" not in commands
