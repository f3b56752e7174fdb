"""Waiting on a condition with a timeout: what the tests that run servers, threads or workers poll with
(no wall-clock asserts: a slow machine only waits longer, up to the timeout)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(poll_s)
