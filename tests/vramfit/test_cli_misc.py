"""`vramfit --version`, a closed pipe, `serve --help`'s config keys, and what the bench extra carries (the bench
runs from the source tree as `python -m benchmarks`, not from `vramfit`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from vramfit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"vramfit {version('vramfit')}" == f"vramfit {pyproject}"


def _vramfit() -> list[str]:
    return [sys.executable, "-m", "vramfit.cli"]


def test_a_closed_pipe_ends_quietly() -> None:
    # As an operator types it: the reader stops after one line.
    cmd = " ".join(_vramfit()) + " demo --format json | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.stdout.strip() == "{" and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert done.returncode in (0, 141), done.stderr
    # And with the pipe certainly closed before the first write: exit 141, as a program killed by SIGPIPE.
    proc = subprocess.Popen(_vramfit() + ["demo", "--format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""


def test_serve_help_lists_every_config_key() -> None:
    from extender.cli import build_serve_parser
    from extender.config import Settings

    text = build_serve_parser().format_help()
    epilog = text[text.index("config keys"):]
    for name in Settings.model_fields:
        assert any(ln.startswith(f"  {name} (default ") for ln in epilog.splitlines()), name
    # Each documented key carries its meaning from the config module's docstring.
    assert "requests above this get HTTP 413" in epilog
    done = subprocess.run(_vramfit() + ["serve", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and all(f"  {name} (default " in done.stdout for name in Settings.model_fields)


def test_bench_only_dependencies_are_in_the_bench_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = " ".join(project["dependencies"])
    bench = " ".join(project["optional-dependencies"]["bench"])
    for name in ("matplotlib", "tqdm"):
        assert name not in deps and name in bench
    # Outside the benchmarks, nothing imports them.
    for pkg in ("packing", "kubeio", "extender", "nodeagent", "vramfit"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            assert "import matplotlib" not in text and "import tqdm" not in text and "from tqdm" not in text, path


def test_the_readme_test_command_is_what_ci_runs_and_installs_the_bench_extra() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_line = next(ln for ln in readme if ln.endswith("python -m pytest") and "pip install" in ln)
    assert test_line in ci
    # The tests run the bench (`python -m benchmarks`), which needs tqdm.
    assert '".[test,bench]"' in test_line


def test_a_missing_bench_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import benchmarks.cli

    def needs_tqdm(args: object, argv: object = None) -> int:
        raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")

    monkeypatch.setattr(benchmarks.cli, "run_bench", needs_tqdm)
    assert benchmarks.cli.main(["--seeds", "1"]) == 2
    assert "pip install -e '.[bench]'" in capsys.readouterr().err


def test_the_bench_is_python_m_benchmarks_not_a_vramfit_command() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m benchmarks"), done.stderr
    assert "--seeds" in done.stdout
    with pytest.raises(SystemExit) as exit_info:
        main(["bench"])
    assert exit_info.value.code == 2


def test_the_console_script_prints_the_version() -> None:
    script = Path(sys.executable).parent / "vramfit"
    if not script.exists():
        pytest.skip("console script not installed")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0 and done.stdout.strip() == f"vramfit {version('vramfit')}"


def test_without_the_bench_extra_the_service_and_cli_work_and_bench_says_what_to_install() -> None:
    # None in sys.modules makes `import tqdm` fail as if it were not installed.
    script = """
import contextlib, io, sys
sys.modules["tqdm"] = None
sys.modules["matplotlib"] = None
from vramfit.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["demo"]) == 0
    import extender.app, extender.cli, nodeagent.cli  # the service and the node agent import neither
from benchmarks.cli import main as bench
print(bench(["--seeds", "1", "--no-progress", "--policy", "paper:fgd"]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2" and "pip install -e '.[bench]'" in done.stderr
