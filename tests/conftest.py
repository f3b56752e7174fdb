"""Fixtures shared by the test files (pytest loads this module; no test and nothing shipped imports it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.apiserver import FakeApiServer
from helm_binary import HelmUnavailable, helm_path

from kubeio.reflector import Backoff
from packing.catalog import Catalog, load_catalog


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    """The shipped GPU catalog, loaded once per run (tests must not change it)."""
    return load_catalog()


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real helm binary (tests/helm_binary.py); the test skips where none can be had."""
    try:
        return helm_path()
    except HelmUnavailable as exc:
        pytest.skip(f"no helm binary: {exc}")


@pytest.fixture
def fake_api() -> Iterator[Callable[..., FakeApiServer]]:
    """`fake_api(nodes=[...], pods=[...])`: a started FakeApiServer, stopped when the test ends (each one)."""
    started: list[FakeApiServer] = []

    def start(**kwargs: Any) -> FakeApiServer:
        server = FakeApiServer(**kwargs).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def fast_backoff() -> Callable[[], Backoff]:
    """A reflector backoff factory that retries within tens of milliseconds (tests of reconnects)."""
    return lambda: Backoff(initial_s=0.01, max_s=0.05)
