"""Starting `vramfit serve` child processes (tests that run the real command line): the signing key cluster mode
needs, and waiting for readiness."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_ready(proc: subprocess.Popen[bytes], readyz_url: str, timeout_s: float = 30.0) -> None:
    """Poll `readyz_url` until it answers 200; fail with the child's output if it exits, or on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(readyz_url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "vramfit serve did not become ready"
        time.sleep(0.1)


# A test key (>= 32 bytes, `packing.k8s.trust.MIN_KEY_BYTES`): cluster mode refuses to start without one.
TEST_SIGNING_KEY = "vramfit-test-signing-key-0123456789abcdef"


def signing_key_file(directory: Path, key: str = TEST_SIGNING_KEY) -> Path:
    """Write a signing key file under `directory` (the extender's and the node agent's `--signing-key`)."""
    path = Path(directory) / "signing-key"
    path.write_text(key + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def cluster_serve_args(directory: Path) -> list[str]:
    """The arguments `vramfit serve --kubeconfig/--in-cluster` needs besides its source: a signing key."""
    return ["--signing-key", str(signing_key_file(directory))]
