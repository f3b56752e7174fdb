"""The API server client the shells share: building an ApiClient, and reading raw JSON responses.

Raw JSON (`_preload_content=False`) keeps one parser for everything: the objects reach `packing` exactly
as a snapshot file or an extender payload would carry them.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.client.exceptions import ApiException

GONE = 410


class ResourceExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 / ERROR event with code 410): relist."""


class ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


def api_client(kubeconfig: str | None = None, in_cluster: bool = False, host: str | None = None) -> kclient.ApiClient:
    """An ApiClient from a kubeconfig file, the in-cluster service account, or a bare URL (tests)."""
    cfg = kclient.Configuration()
    if host is not None:
        cfg.host = host
    elif in_cluster:
        kconfig.load_incluster_config(client_configuration=cfg)
    else:
        kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = kclient.ApiClient(cfg)
    api.user_agent = "vramfit-extender/0.1"
    return api


def read_json(resp: Any) -> Any:
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return json.loads(data)


def check_status(resp: Any) -> None:
    code = int(getattr(resp, "status", 200))
    if 200 <= code < 300:
        return
    try:
        body = read_json(resp)
        message = body.get("message", "") if isinstance(body, dict) else str(body)
    except (ValueError, AttributeError):
        message = ""
    if code == GONE:
        raise ResourceExpired(message)
    raise ApiError(code, message)


def describe(exc: Exception) -> str:
    """An API failure in one line: the HTTP status and the Status message where there is one."""
    if isinstance(exc, ApiException):
        message = ""
        try:
            body = json.loads(exc.body or b"{}")
            message = body.get("message", "") if isinstance(body, dict) else ""
        except (ValueError, TypeError):
            pass
        return f"HTTP {exc.status}: {message or exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:300]
