"""Run an app on uvicorn over loopback in a background thread (tests, benchmarks, the page screenshot script).

Not part of the service: `vramfit serve` runs uvicorn itself (extender/listeners.py).

Binds 127.0.0.1 on an ephemeral port; `url` is known once `start()` returns; `stop()` ends it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class LocalServer:
    def __init__(self, app: Any, *, host: str = "127.0.0.1", start_timeout_s: float = 10.0,
                 **uvicorn_options: Any) -> None:
        self.config = uvicorn.Config(app, host=host, port=0, log_level="warning", access_log=False,
                                     lifespan="off", **uvicorn_options)
        self.server = uvicorn.Server(self.config)
        self.start_timeout_s = start_timeout_s
        self._thread: threading.Thread | None = None

    def start(self) -> LocalServer:
        self._thread = threading.Thread(target=self.server.run, name="uvicorn-local", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        sock = self.server.servers[0].sockets[0]
        return int(sock.getsockname()[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.config.ssl_certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
