"""Waiting for a `vramfit serve` child process to become ready (tests that run the real command line)."""

from __future__ import annotations

import subprocess
import time

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
