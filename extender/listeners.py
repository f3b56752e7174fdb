"""The extender's listeners: one app, each path served on exactly one port.

- main (`--port`): the verbs and `/state` — behind kube-scheduler's client certificate when `--client-ca`;
- webhook (`--webhook-port`, optional): `/mutate`, HTTPS without client certificates (the API server sends
  none by default), so the verbs' client authentication need not be relaxed for it;
- health (`--health-port`, optional): `/healthz`, `/readyz`, `/metrics` over plain HTTP for the kubelet's
  probes and Prometheus.
Without the optional ports their paths stay on the main port (local runs, tests).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from extender.app import uvicorn_options  # the request-head deadline and size limit, on every listener

HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def webhook_paths(url_prefix: str) -> frozenset[str]:
    return frozenset({"/mutate", f"{url_prefix}/mutate"})


async def send_error(send: Send, status: int, text: str) -> None:
    """An `{"Error": ...}` answer straight on the ASGI channel (for wrappers that answer before the app)."""
    body = json.dumps({"Error": text}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def restrict(app: ASGIApp, allow: Callable[[str], bool]) -> ASGIApp:
    """The app, answering 404 for HTTP paths this listener does not serve."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not allow(scope["path"]):
            await send_error(send, 404, "not served on this port")
            return
        await app(scope, receive, send)

    return wrapped


@dataclass(frozen=True)
class Listener:
    name: str
    port: int
    allow: Callable[[str], bool]
    ssl: dict[str, Any] = field(default_factory=dict)  # uvicorn ssl_* options; empty = plain HTTP


def check_port(flag: str, port: int | None) -> None:
    """ValueError naming the flag for a port no socket can bind (the OS would say only "overflow")."""
    if port is not None and not 0 <= port <= 65535:  # 0: any free port (tests, local runs)
        raise ValueError(f"{flag} {port}: a TCP port is between 1 and 65535")


def plan(*, port: int, webhook_port: int | None, health_port: int | None, url_prefix: str,
         main_ssl: dict[str, Any], webhook_ssl: dict[str, Any]) -> list[Listener]:
    """Which listener serves which paths; raises ValueError on a port out of range or clashing ports."""
    for flag, value in (("--port", port), ("--webhook-port", webhook_port), ("--health-port", health_port)):
        check_port(flag, value)
    ports = [p for p in (port, webhook_port, health_port) if p is not None]
    if len(ports) != len(set(ports)):
        raise ValueError(f"--port, --webhook-port and --health-port must differ, got {ports}")
    hooks = webhook_paths(url_prefix)
    elsewhere: set[str] = set()
    out: list[Listener] = []
    if webhook_port is not None:
        if not webhook_ssl:
            raise ValueError("--webhook-port needs --tls-cert and --tls-key (the API server calls webhooks over HTTPS)")
        elsewhere |= hooks
        out.append(Listener("webhook", webhook_port, hooks.__contains__, webhook_ssl))
    if health_port is not None:
        elsewhere |= HEALTH_PATHS
        out.append(Listener("health", health_port, HEALTH_PATHS.__contains__))
    out.insert(0, Listener("main", port, lambda path: path not in elsewhere, main_ssl))
    return out


def ssl_options(cert: str | None, key: str | None, client_ca: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """uvicorn's TLS options for the main listener (client certificates required when a CA is given) and for
    the webhook listener (same server certificate, no client certificates)."""
    if cert is None and key is None:
        if client_ca:
            raise ValueError("--client-ca needs --tls-cert and --tls-key")
        return {}, {}
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together")
    check_tls_files(cert, key, client_ca)
    server = {"ssl_certfile": cert, "ssl_keyfile": key}
    main: dict[str, Any] = dict(server)
    if client_ca:
        main.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return main, server


def _readable(flag: str, path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot be read: {err.strerror or err}") from None
    if b"-----BEGIN " not in head:
        raise ValueError(f"{flag} {path}: not a PEM file (no '-----BEGIN' line)")


def check_tls_files(cert: str, key: str, client_ca: str | None) -> None:
    """Load the files the way the listeners will, now: a mistake is one line naming the flag and the file,
    not a traceback from inside the server after the process looked started."""
    _readable("--tls-cert", cert)
    _readable("--tls-key", key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as err:
        reason = "does not match the certificate" if "KEY_VALUES_MISMATCH" in str(err) else f"unusable ({err.reason})"
        raise ValueError(f"--tls-key {key}: {reason} (--tls-cert {cert})") from None
    if client_ca:
        _readable("--client-ca", client_ca)
        try:
            context.load_verify_locations(cafile=client_ca)
        except ssl.SSLError as err:
            raise ValueError(f"--client-ca {client_ca}: no CA certificate could be read ({err.reason})") from None


def serve(app: ASGIApp, host: str, listeners: list[Listener], log_level: str) -> bool:
    """Run every listener in one event loop until a signal stops them (uvicorn's handlers chain: the
    listener that catches it exits, and the others are told to follow). False when a listener never
    started (its port taken, say): the process must then exit non-zero, or Kubernetes shows it Completed."""
    servers = [uvicorn.Server(uvicorn.Config(restrict(app, lis.allow), host=host, port=lis.port, log_level=log_level,
                                             access_log=False, **lis.ssl, **uvicorn_options()))
               for lis in listeners]

    async def run_one(server: uvicorn.Server) -> None:
        try:
            await server.serve()
        except SystemExit:
            pass  # uvicorn exits on a startup failure (port taken) after logging it; `started` tells the caller

    async def run_all() -> None:
        tasks = [asyncio.create_task(run_one(s)) for s in servers]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for s in servers:
            s.should_exit = True
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    asyncio.run(run_all())
    return all(s.started for s in servers)
