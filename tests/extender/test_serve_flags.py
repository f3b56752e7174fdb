"""Every bad TLS or port input to `vramfit serve` is exit 2 with one line naming the flag and the file, never a
traceback or exit 0 (a container that exits 0 shows as Completed in Kubernetes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_extender_listeners import NODE, POD, _pki

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    snap = tmp_path / "snap.yaml"
    snap.write_text(yaml.safe_dump_all([NODE, POD]))
    return subprocess.run([sys.executable, "-m", "vramfit.cli", "serve", "--snapshot", str(snap), *flags],
                          capture_output=True, text=True, timeout=60)


def _one_clear_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("vramfit serve:")]
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@needs_openssl
@pytest.mark.parametrize("case", ["missing-cert", "missing-key", "missing-ca", "not-pem", "mismatch", "ca-not-pem",
                                  "unreadable-key"])
def test_bad_tls_inputs(tmp_path: Path, case: str) -> None:
    _pki(tmp_path)
    cert, key, ca = tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt"
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    flags = {"--tls-cert": cert, "--tls-key": key, "--client-ca": ca}
    expect = {
        "missing-cert": ("--tls-cert", tmp_path / "nope.crt", "cannot be read"),
        "missing-key": ("--tls-key", tmp_path / "nope.key", "cannot be read"),
        "missing-ca": ("--client-ca", tmp_path / "nope-ca.crt", "cannot be read"),
        "not-pem": ("--tls-cert", junk, "not a PEM file"),
        "mismatch": ("--tls-key", tmp_path / "scheduler.key", "does not match"),
        "ca-not-pem": ("--client-ca", junk, "not a PEM file"),
        "unreadable-key": ("--tls-key", tmp_path, "cannot be read"),  # a directory
    }[case]
    flag, path, words = expect
    flags[flag] = path
    proc = _serve(tmp_path, *[str(x) for pair in flags.items() for x in pair])
    _one_clear_line(proc, flag, str(path), words)


@pytest.mark.parametrize("flag", ["--port", "--webhook-port", "--health-port"])
def test_a_port_out_of_range_is_named(tmp_path: Path, flag: str) -> None:
    proc = _serve(tmp_path, flag, "70000")
    _one_clear_line(proc, flag, "70000", "between 1 and 65535")


def test_a_port_already_taken_is_not_exit_0(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve(tmp_path, "--host", "127.0.0.1", "--port", str(port))
    assert proc.returncode not in (0, None), proc.stderr
    assert "Traceback" not in proc.stderr
