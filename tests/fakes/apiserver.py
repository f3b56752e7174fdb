"""A loopback stand-in for the few kube-apiserver paths vramfit uses (tests and dry runs).

It serves recorded API JSON: `GET /api/v1/nodes` and `/api/v1/pods` (lists, or `?watch=true` streams
scripted per call), `PATCH /api/v1/namespaces/{ns}/pods/{name}`, `POST .../pods/{name}/binding` and
`POST /api/v1/namespaces/{ns}/events`, recording every request so tests can check exact bodies.
No kube-apiserver binary exists on these machines; the wire format here follows the real server's:
chunked watch streams of `{"type": ..., "object": ...}` lines, `Status` objects for errors.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

KIND_PATHS = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods"}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A `metav1.Status` failure object as the API server writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class WatchScript:
    """What one watch call answers: these lines, then either a clean end or a cut mid-line."""

    events: list[dict[str, Any]]
    break_midway: bool = False  # send half of one more line and drop the connection
    hold_s: float = 0.0  # keep the stream open this long after the events (bounded)
    http_status: int = 200  # non-200: answer with a Status object instead of a stream (e.g. 410 Gone)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeApiServer:
    """Start with `start()`; `url` is `http://127.0.0.1:<port>`. Thread-safe; stop with `stop()`."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    resource_version: int = 1000
    watch_scripts: dict[str, list[WatchScript]] = field(default_factory=lambda: {"nodes": [], "pods": []})
    # Optional hooks: (recorded request) -> (code, body dict) to inject failures; None = default handling.
    on_patch: Callable[[Recorded], tuple[int, dict[str, Any]] | None] | None = None
    on_binding: Callable[[Recorded], tuple[int, dict[str, Any]] | None] | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeApiServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass

            def _record(self) -> Recorded:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                rec = Recorded(self.command, parts.path, parse_qs(parts.query),
                               {k.lower(): v for k, v in self.headers.items()}, body)
                with fake._lock:
                    fake.requests.append(rec)
                return rec

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                rec = self._record()
                kind = KIND_PATHS.get(rec.path)
                if kind is None:
                    self._send(404, status(404, "NotFound", f"the server could not find {rec.path}"))
                    return
                if rec.query.get("watch", ["false"])[0] in ("true", "1"):
                    self._watch(kind)
                    return
                with fake._lock:
                    items = copy.deepcopy(fake.nodes if kind == "nodes" else fake.pods)
                    rv = str(fake.resource_version)
                self._send(200, {
                    "kind": "NodeList" if kind == "nodes" else "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                })

            def _watch(self, kind: str) -> None:
                with fake._lock:
                    scripts = fake.watch_scripts.get(kind, [])
                    script = scripts.pop(0) if scripts else WatchScript(events=[], hold_s=0.2)
                if script.http_status != 200:
                    reason = "Expired" if script.http_status == 410 else "InternalError"
                    self._send(script.http_status, status(script.http_status, reason,
                                                          "too old resource version: 1 (1000)"))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in script.events:
                    self._chunk(json.dumps(event).encode() + b"\n")
                if script.break_midway:
                    self._chunk(b'{"type":"MODIFIED","object":{"metadata":')
                    self.close_connection = True
                    self.wfile.flush()
                    return  # no terminating chunk: the client sees a truncated stream
                fake._stopping.wait(script.hold_s)
                self.wfile.write(b"0\r\n\r\n")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_PATCH(self) -> None:  # noqa: N802
                rec = self._record()
                injected = fake.on_patch(rec) if fake.on_patch else None
                if injected is not None:
                    self._send(*injected)
                    return
                ns, name, sub = _pod_path(rec.path)
                if sub is not None or name is None:
                    self._send(404, status(404, "NotFound", rec.path))
                    return
                with fake._lock:
                    pod = fake._find_pod(ns, name)
                    if pod is None:
                        self._send(404, status(404, "NotFound", f'pods "{name}" not found'))
                        return
                    patch = json.loads(rec.body)
                    want_uid = patch.get("metadata", {}).get("uid")
                    if want_uid and want_uid != pod["metadata"].get("uid"):
                        self._send(409, status(409, "Conflict", "Precondition failed: UID in precondition: "
                                              f"{want_uid}, UID in object meta: {pod['metadata'].get('uid')}"))
                        return
                    _merge(pod, patch)
                    fake.resource_version += 1
                    pod["metadata"]["resourceVersion"] = str(fake.resource_version)
                    out = copy.deepcopy(pod)
                self._send(200, out)

            def do_POST(self) -> None:  # noqa: N802
                rec = self._record()
                ns, name, sub = _pod_path(rec.path)
                if sub == "binding" and name is not None:
                    injected = fake.on_binding(rec) if fake.on_binding else None
                    if injected is not None:
                        self._send(*injected)
                        return
                    body = json.loads(rec.body)
                    with fake._lock:
                        pod = fake._find_pod(ns, name)
                        if pod is None:
                            self._send(404, status(404, "NotFound", f'pods "{name}" not found'))
                            return
                        uid = body.get("metadata", {}).get("uid")
                        if uid and uid != pod["metadata"].get("uid"):
                            self._send(409, status(409, "Conflict", "Operation cannot be fulfilled on pods/binding"
                                                  f' "{name}": Precondition failed: UID in precondition: {uid}'))
                            return
                        if pod["spec"].get("nodeName"):
                            self._send(409, status(409, "Conflict", f'Operation cannot be fulfilled on pods/binding '
                                                  f'"{name}": pod {name} is already assigned to node '
                                                  f'"{pod["spec"]["nodeName"]}"'))
                            return
                        pod["spec"]["nodeName"] = body["target"]["name"]
                        fake.resource_version += 1
                    self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                     "status": "Success", "code": 201})
                    return
                if rec.path.startswith("/api/v1/namespaces/") and rec.path.endswith("/events"):
                    self._send(201, json.loads(rec.body))
                    return
                self._send(404, status(404, "NotFound", rec.path))

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="fake-apiserver")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers --------------------------------------------------------------------------------
    def _find_pod(self, ns: str | None, name: str) -> dict[str, Any] | None:
        for pod in self.pods:
            meta = pod.get("metadata", {})
            if meta.get("namespace") == ns and meta.get("name") == name:
                return pod
        return None

    def recorded(self, method: str, suffix: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up mid-stream on purpose in these tests


def _pod_path(path: str) -> tuple[str | None, str | None, str | None]:
    # /api/v1/namespaces/{ns}/pods/{name}[/{sub}]
    parts = path.strip("/").split("/")
    if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
        return parts[3], parts[5], parts[6] if len(parts) > 6 else None
    return None, None, None


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386); strategic merge is the same for the map fields patched here."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
