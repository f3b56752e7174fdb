"""List+watch one kind of object (Namespaces, Nodes or Pods) from the API server into a sink, as raw API JSON.

    list (resourceVersion R) -> sink.replace(kind, items)   # full resync
    watch from R             -> sink.apply(kind, type, obj) # R advances with every event and BOOKMARK
    410 Gone (HTTP or ERROR event) -> relist at once
    disconnect / other error       -> exponential backoff, then watch again from R (relist if it fails)

A relist can be asked for at any time (`Reflector.request_relist`); while one is awaited, a failing list may be
retried with a shorter backoff cap, and the reflector says since when its list fails and why (`failure`).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from kubeio.client import GONE, ApiError, ResourceExpired, check_status, describe, read_json

log = logging.getLogger("vramfit.kube")

# Namespaces carry the tenancy rules (packing.k8s.trust): which tenants a namespace's pods may name.
KINDS = ("namespaces", "nodes", "pods")
# resource.k8s.io/v1 (Kubernetes >= 1.34): what the DRA allocator reads (extender/dra).
DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")


class ClusterSink(Protocol):
    """Where a reflector delivers objects (the extender's store, the node agent's pods of its node)."""

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None: ...

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None: ...


@dataclass
class Backoff:
    """Exponential backoff with jitter; reset after a healthy watch."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    _next: float = 0.0

    def __post_init__(self) -> None:
        self._next = self.initial_s

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.max_s, self._next * self.factor)
        return delay * (0.8 + 0.4 * random.random())

    def reset(self) -> None:
        self._next = self.initial_s


def _list_call(api: kclient.ApiClient, kind: str) -> Callable[..., Any]:
    core = kclient.CoreV1Api(api)
    dra = kclient.ResourceV1Api(api)
    lists: dict[str, Callable[..., Any]] = {
        "nodes": core.list_node, "pods": core.list_pod_for_all_namespaces, "namespaces": core.list_namespace,
        "resourceslices": dra.list_resource_slice, "deviceclasses": dra.list_device_class,
        "resourceclaims": dra.list_resource_claim_for_all_namespaces,
        "resourceclaimtemplates": dra.list_resource_claim_template_for_all_namespaces}
    return lists[kind]


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited watch events from a streaming response; a cut-off last line is dropped."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buffer += chunk
        while True:
            i = buffer.find(b"\n")
            if i < 0:
                break
            line, buffer = buffer[:i], buffer[i + 1:]
            if line.strip():
                yield line


class Reflector:
    """List+watch one kind into the sink until `stop` is set."""

    def __init__(
        self,
        kind: str,
        api: kclient.ApiClient,
        sink: ClusterSink,
        stop: threading.Event,
        *,
        on_synced: Callable[[str], None] | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 60.0,
        backoff: Backoff | None = None,
        field_selector: str | None = None,
    ) -> None:
        if kind not in KINDS + DRA_KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        self.kind = kind
        self._list = _list_call(api, kind)
        self.sink = sink
        self.stop = stop
        self.on_synced = on_synced
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff = backoff or Backoff()
        # e.g. "spec.nodeName=gpu-7": the node agent watches only the pods of its own node
        self.field_selector = field_selector
        self.resource_version: str | None = None
        self.lists = 0  # full lists done (first = initial sync, later = resyncs)
        self.watches = 0
        self.errors = 0
        self._resp: Any = None
        self._relist = threading.Event()  # a new leadership term asks for a fresh list
        self._wake = threading.Event()  # cuts a backoff wait short (a relist was asked for, or stop)
        self.relist_pending = False  # asked to relist, not done yet
        self.retry_cap_s: float | None = None  # while a term waits for this relist: a failed list is retried sooner
        self.list_failing_since: float | None = None  # monotonic time of the first failed list since the last success
        self.list_failing_at: datetime | None = None  # the same, on the wall clock (for messages)
        self.last_error = ""

    def _call(self, **kwargs: Any) -> Any:
        # The client raises on any non-2xx status even with _preload_content=False; 410 means relist.
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        try:
            return self._list(_preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status == GONE:
                raise ResourceExpired(exc.reason or "Gone") from None
            raise

    # -- one list ---------------------------------------------------------------------------------
    def relist(self) -> None:
        resp = self._call(_request_timeout=self.request_timeout_s)
        check_status(resp)
        body = read_json(resp)
        items = body.get("items") or []
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion")
        self.sink.replace(self.kind, items)
        self.list_failing_since = self.list_failing_at = None
        self.relist_pending = False
        self.lists += 1
        log.info("listed %d %s at resourceVersion %s", len(items), self.kind, self.resource_version)
        if self.lists == 1 and self.on_synced is not None:
            self.on_synced(self.kind)

    # -- one watch --------------------------------------------------------------------------------
    def watch_once(self) -> None:
        """Stream events from resource_version until the server ends the stream (normal: timeoutSeconds)."""
        self.watches += 1
        resp = self._call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            # read timeout a little over the server-side timeout so a dead connection cannot hang us
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            if self._relist.is_set():
                return  # asked to relist while this watch was being opened: request_relist may have missed it
            check_status(resp)
            for line in _lines(resp):
                if self.stop.is_set():
                    return
                event = json.loads(line)
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == GONE:
                        raise ResourceExpired(obj.get("message", ""))
                    raise ApiError(int(code or 500), obj.get("message", ""))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype != "BOOKMARK":
                    self.sink.apply(self.kind, etype, obj)
                if rv:
                    self.resource_version = rv
                self.backoff.reset()
        finally:
            self._resp = None
            resp.close()  # a watch may stop mid-stream: never pool a connection with unread bytes
            resp.release_conn()

    # -- the loop ---------------------------------------------------------------------------------
    def request_relist(self) -> None:
        """List again now (the current watch is cut, a backoff wait ends); `lists` grows once it is done."""
        self.relist_pending = True
        self._relist.set()
        self._wake.set()
        self.close()

    def failure(self, now: float | None = None) -> str | None:
        """Why and since when this kind's list fails; None while it does not."""
        since, at = self.list_failing_since, self.list_failing_at
        if since is None or at is None:
            return None
        age = (time.monotonic() if now is None else now) - since
        return (f"{self.kind} list failing for {age:.1f}s (since {at.strftime('%H:%M:%S')}Z): "
                f"{self.last_error or 'unknown error'}")

    def _list_failed(self, exc: Exception) -> None:
        if self.list_failing_since is None:
            self.list_failing_since, self.list_failing_at = time.monotonic(), datetime.now(UTC)
        self.last_error = describe(exc)

    def _delay(self) -> float:
        delay = self.backoff.next_delay()
        cap = self.retry_cap_s
        return delay if cap is None else min(delay, cap)

    def _sleep(self, delay: float) -> None:
        """Back off for `delay`, ended early by stop or by a relist request (sliced: `stop` may be shared)."""
        end = time.monotonic() + delay
        while not self.stop.is_set() and not self._wake.is_set():
            left = end - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(min(left, 0.1))
        self._wake.clear()

    def run(self) -> None:
        need_list = True
        while not self.stop.is_set():
            if self._relist.is_set():
                self._relist.clear()
                self._wake.clear()
                need_list = True
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self.watch_once()
            except ResourceExpired as exc:
                log.info("%s watch expired (%s): relisting", self.kind, exc)
                need_list = True
                continue  # 410 is routine: relist now, no backoff
            except Exception as exc:  # noqa: BLE001 - any transport/API failure: back off and retry
                if self._relist.is_set():
                    continue  # we cut the watch ourselves to relist: no error, no backoff
                self.errors += 1
                if need_list:
                    self._list_failed(exc)
                delay = self._delay()
                log.warning("%s %s failed (%s: %s); retrying in %.1fs", self.kind, "list" if need_list else "watch",
                            type(exc).__name__, exc, delay)
                if self.resource_version is None:
                    need_list = True
                self._sleep(delay)

    def close(self) -> None:
        if self.stop.is_set():
            self._wake.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 - best effort while stopping
                pass
