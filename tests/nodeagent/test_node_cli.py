"""`vramfit node` on a first install: every bad flag, file or value is exit 2 with one line naming it; the
device plugin says why it waits and never logs a traceback per poll; a dry run writes only where it says.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kubelet import FakeKubelet, cleanup_socket_dir, short_socket_dir
from node_signing import KEY_TEXT, sign_pod

import nodeagent.cli as node_cli
from nodeagent.agent import NodeAgent
from nodeagent.allocate import GPU_RESOURCE
from nodeagent.cli import add_node_parser, build_agent
from nodeagent.ledger import Ledger
from nodeagent.plugin import KUBELET_SOCKET, PluginServer

NODE = "gpu-node-1"
GPUS = [{"index": 0, "uuid": "GPU-t4", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"}]
MPS_GPUS = [{"index": 0, "uuid": "GPU-h100", "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559,
             "mode": "mps", "replicas": 2}]


class Files:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.inventory = tmp / "gpus.json"
        self.inventory.write_text(json.dumps(GPUS))
        self.snapshot = tmp / "pods.yaml"
        self.snapshot.write_text("")
        self.key = tmp / "key"
        self.key.write_text(KEY_TEXT)
        self.plugin_dir = tmp / "dp"
        self.plugin_dir.mkdir()
        (tmp / "bad.yaml").write_text("a: [\n")

    def argv(self, *extra: str, plugin_dir: str | None = None) -> list[str]:
        return ["node", "--node-name", NODE, "--inventory-file", str(self.inventory), "--snapshot",
                str(self.snapshot), "--signing-key", str(self.key), "--metrics-port", "0",
                "--device-plugin-dir", plugin_dir or str(self.plugin_dir), *extra]


def keep_temp_dirs_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run's own directory comes from tempfile: keep the ones a test makes in tmp_path."""
    own = tmp_path / "tmp"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))


@pytest.fixture(autouse=True)
def _temp_dirs_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keep_temp_dirs_in(tmp_path, monkeypatch)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def vramfit(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    """`vramfit ARGV` as an operator runs it: exit status and stderr lines (a run that starts is a failure)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(cwd / "tmp")}
    try:
        done = subprocess.run([sys.executable, "-m", "vramfit.cli", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"vramfit {' '.join(argv)} started instead of refusing: {err.stderr!r}") from None
    return done.returncode, done.stderr.strip().splitlines()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_parser(parser.add_subparsers())
    return parser.parse_args(argv)


# ---- every bad flag, file and value: exit 2, one line naming it ----------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


BAD: list[tuple[list[str], str]] = [
    (["--metrics-port", "70000"], "--metrics-port 70000"),
    (["--metrics-port", "-1"], "--metrics-port -1"),
    (["--config", "missing.yaml"], "--config missing.yaml"),
    (["--inventory-file", "missing.json"], "--inventory-file missing.json"),
    (["--snapshot", "missing.yaml"], "--snapshot missing.yaml"),
    (["--signing-key", "missing-key"], "--signing-key missing-key"),
    (["--config", "bad.yaml"], "--config: config bad.yaml is not valid YAML"),
    (["--snapshot", "bad.yaml"], "--snapshot: bad.yaml: not valid YAML"),
    (["--inventory-file", "bad.yaml"], "--inventory-file: bad.yaml: not valid JSON"),
    (["--mps-control", "./no-such-control"], "--mps-control ./no-such-control"),
    (["--state-dir", "/var/lib/vramfit"], "--state-dir /var/lib/vramfit"),
    (["--state-dir", "/proc/no/such"], "--state-dir /proc/no/such"),
    (["--device-plugin-dir", "no-such-dir"], "--device-plugin-dir no-such-dir"),
    (["--device-plugin-dir", "/var/lib/kubelet/device-plugins"], "--device-plugin-dir /var/lib/kubelet"),
    (["--device-plugin-dir", "/tmp/" + "d" * 110], "--device-plugin-dir /tmp/ddd"),
]


@pytest.mark.parametrize(("extra", "named"), BAD)
def test_every_bad_flag_is_exit_2_with_one_line_naming_it(files: Files, extra: list[str], named: str) -> None:
    if extra[0] == "--device-plugin-dir" and extra[1].startswith("/tmp/d"):
        os.makedirs(extra[1], exist_ok=True)
    try:
        code, err = vramfit(files.argv(*extra), files.tmp)
    finally:
        if extra[0] == "--device-plugin-dir" and extra[1].startswith("/tmp/d"):
            os.rmdir(extra[1])
    assert code == 2 and len(err) == 1 and named in err[0] and "Traceback" not in err[0], err


def test_a_dry_run_without_its_own_plugin_dir_is_refused(files: Files) -> None:
    argv = files.argv()
    del argv[-2:]  # no --device-plugin-dir: the default is the kubelet's own
    code, err = vramfit(argv, files.tmp)
    assert code == 2 and len(err) == 1 and "--device-plugin-dir" in err[0] and "kubelet's" in err[0], err


def test_a_bad_kubeconfig_is_one_line_naming_the_flag(files: Files) -> None:
    argv = files.argv()
    at = argv.index("--snapshot")
    argv[at:at + 2] = ["--kubeconfig", "bad.yaml"]
    code, err = vramfit(argv, files.tmp)
    assert code == 2 and len(err) == 1 and err[0].startswith("vramfit node: --kubeconfig: "), err


def test_a_metrics_port_in_use_is_exit_2_naming_the_flags(files: Files, busy_port: int) -> None:
    code, err = vramfit(files.argv("--metrics-host", "127.0.0.1", "--metrics-port", str(busy_port)), files.tmp)
    assert code == 2 and len(err) == 1 and f"--metrics-host/--metrics-port 127.0.0.1:{busy_port}" in err[0], err


# ---- the device plugin: a relative directory, waiting for the kubelet, a socket that cannot bind ---------------


@pytest.fixture
def sockets() -> Iterator[Path]:
    d = short_socket_dir()
    try:
        yield d
    finally:
        cleanup_socket_dir(d)


def test_a_relative_plugin_dir_is_resolved_and_registers(files: Files, sockets: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (sockets / "dp").mkdir()
    monkeypatch.chdir(sockets)
    agent: NodeAgent = build_agent(parse(files.argv(plugin_dir="dp")))
    assert agent.plugin.plugin_dir == str(sockets / "dp")
    agent.plugin.poll_s = 0.05
    with FakeKubelet(sockets / "dp") as kubelet:
        agent.start()
        try:
            kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
        finally:
            agent.stop()


def test_the_plugin_dir_is_made_absolute_whoever_builds_the_server(sockets: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(sockets)
    assert PluginServer(ctx=None, plugin_dir="dp").plugin_dir == str(sockets / "dp")  # type: ignore[arg-type]


def _records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_waiting_for_the_kubelet_is_said_once_then_at_a_low_rate(files: Files,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    agent: NodeAgent = build_agent(parse(files.argv()))
    plugin = agent.plugin
    with caplog.at_level(logging.INFO, logger="vramfit.node.plugin"):
        for _ in range(20):
            plugin._cycle()
        waiting = _records(caplog, f"no {KUBELET_SOCKET} in {files.plugin_dir}")
        assert len(waiting) == 1 and waiting[0].levelno == logging.WARNING
        plugin._said.every_s = 0.0  # the repeat period has passed: said again
        plugin._cycle()
        assert len(_records(caplog, f"no {KUBELET_SOCKET}")) == 2
    assert not plugin.registered.is_set()


def test_a_socket_that_cannot_bind_is_one_line_not_a_traceback_per_poll(caplog: pytest.LogCaptureFixture) -> None:
    # A path past the unix socket limit: the kubelet socket can be stat'ed, ours cannot be bound.
    deep = Path("/tmp") / ("vf-" + "d" * 100)
    deep.mkdir(exist_ok=True)
    try:
        (deep / KUBELET_SOCKET).write_text("")
        agent: Any = build_agent_for_dir(deep)
        with caplog.at_level(logging.INFO, logger="vramfit.node.plugin"):
            for _ in range(10):
                agent.plugin._cycle()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "cannot serve the device plugin" in errors[0].getMessage()
        assert all(r.exc_info is None for r in caplog.records)
    finally:
        for f in deep.iterdir():
            f.unlink()
        deep.rmdir()


def build_agent_for_dir(plugin_dir: Path) -> Any:
    from nodeagent.agent import AgentOptions
    from nodeagent.allocate import Trust
    from nodeagent.config import AgentConfig
    from nodeagent.inventory import FileInventory
    from nodeagent.pods import SnapshotPods
    from nodeagent.publish import LogPublisher

    tmp = plugin_dir.parent / (plugin_dir.name + "-files")
    tmp.mkdir(exist_ok=True)
    (tmp / "gpus.json").write_text(json.dumps(GPUS))
    (tmp / "pods.yaml").write_text("")
    options = AgentOptions(node_name=NODE, plugin_dir=str(plugin_dir), pod_resources_socket=None,
                           trust=Trust(keys=None))
    agent = NodeAgent(options, AgentConfig(), FileInventory(tmp / "gpus.json"),
                      SnapshotPods(tmp / "pods.yaml", NODE), LogPublisher())
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    return agent


# ---- a dry run writes only where it says, and never reads a real node's ledger -------------------------------


def test_a_dry_run_keeps_its_ledger_in_a_fresh_directory_it_names(files: Files, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    # A "real node's" ledger at the default place that answered the pod already: a dry run must not read it.
    real = tmp_path / "var-lib-vramfit"
    real.mkdir()
    monkeypatch.setattr(node_cli, "DEFAULT_STATE_DIR", str(real))
    Ledger(real / "allocations.json").record("uid-p", "team-a/p", "main", ["GPU-t4::0"], ("GPU-t4",), (1000,))
    with caplog.at_level(logging.INFO, logger="vramfit.node"):
        first: NodeAgent = build_agent(parse(files.argv()))
        second: NodeAgent = build_agent(parse(files.argv()))
    assert first.ledger.path is not None and second.ledger.path is not None
    dirs = {first.ledger.path.parent, second.ledger.path.parent}
    assert len(dirs) == 2 and real not in dirs and not first.ledger.answers()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dry run:")]
    assert len(said) == 2 and str(first.ledger.path.parent) in said[0]
    assert first.reconciler is None  # nor the real kubelet's pod-resources socket


def test_a_dry_run_admits_a_pod_a_real_ledger_has_answered(files: Files, sockets: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "var-lib-vramfit"
    real.mkdir()
    monkeypatch.setattr(node_cli, "DEFAULT_STATE_DIR", str(real))
    Ledger(real / "allocations.json").record("uid-p", "team-a/p", "main", ["GPU-t4::0"], ("GPU-t4",), (1000,))
    pod = sign_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "uid": "uid-p", "creationTimestamp": "2026-12-03T10:00:00Z",
                     "annotations": {"vramfit.io/assignment": json.dumps({"gpus": [{"index": 0, "vram_mib": 1000}]}),
                                     "vramfit.io/phase": "allocating"}},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
        "status": {"phase": "Pending"}})
    files.snapshot.write_text(yaml.safe_dump(pod))
    (sockets / "dp").mkdir()
    agent: NodeAgent = build_agent(parse(files.argv(plugin_dir=str(sockets / "dp"))))
    agent.plugin.poll_s = 0.05
    with FakeKubelet(sockets / "dp") as kubelet:
        agent.start()
        try:
            kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
            kubelet.wait_for_devices(GPU_RESOURCE, lambda d: len(d) > 0, timeout_s=10)
            (result,) = kubelet.admit([pod])
        finally:
            agent.stop()
    assert result.admitted, result.message


def test_a_dry_run_keeps_mps_pipes_in_its_own_directory(files: Files) -> None:
    files.inventory.write_text(json.dumps(MPS_GPUS))
    agent: NodeAgent = build_agent(parse(files.argv()))
    assert agent.ledger.path is not None
    assert agent.mps_root == str(agent.ledger.path.parent / "mps")
    named = files.tmp / "state"
    agent = build_agent(parse(files.argv("--state-dir", str(named))))
    assert agent.ledger.path == named / "allocations.json" and agent.mps_root == str(named / "mps")
