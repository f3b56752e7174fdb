"""FastAPI app: the extender verbs over HTTP, plus health, readiness, metrics and a state dump.

Verb endpoints read the raw body themselves (size-capped before it is read) and answer pre-serialised
JSON: kube-scheduler sends up to thousands of node names per call, and FastAPI's generic encoder is the
slowest part of a naive handler. Bad input is HTTP 400 with `{"Error": "<what is wrong>"}`; a request the
extender understands but cannot serve is HTTP 200 with a non-empty `Error` (kube-scheduler discards the body
of any non-200 answer, so only that form reaches the user).

Cost per request is bounded: a body must arrive within BODY_READ_TIMEOUT_S (408), be at most max_body_bytes
(413) and be `application/json` (415, as kube-scheduler always sends); bodies above LARGE_BODY_BYTES are
decoded and answered in a worker thread, at most LARGE_CALLS_AT_ONCE at a time, so one 30 MiB preempt call
does not hold up the small calls of the scheduling cycle. Request headers have their own deadline in the
HTTP protocol (`HeaderDeadlineHttpTools` / `HeaderDeadlineH11`, via `uvicorn_options`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import h11
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # uvicorn[standard], a dependency

from extender import wire
from extender.binder import Binder, MemoryBinder
from extender.config import ConfigError, Settings
from extender.metrics import Metrics, PlanCollector, exposition
from extender.offload import RETRY_AFTER_S, Busy, Offload
from extender.planning.planner import Planner
from extender.refresh import Refresher
from extender.service import Extender
from extender.store import Store
from extender.view import CHUNK_NODES, MAX_PENDING, cluster_view, each_node, html_pieces, pause
from extender.webhook import add_webhook_routes
from packing.k8s.demand import pod_demand, pod_key
from packing.k8s.snapshot import node_summary
from packing.k8s.trust import NO_NAMESPACE_RULES, Tenancy
from packing.model import InputError
from packing.policies import get_policy

log = logging.getLogger("vramfit.app")

# A body this large is decoded and answered off the event loop (a 5,000-name filter is ~100 KiB: fast path).
LARGE_BODY_BYTES = 256 * 1024
LARGE_CALLS_AT_ONCE = 2  # large calls are CPU-bound: more at once only adds memory, not throughput
# kube-scheduler writes a body at once, and gives up on the call after its httpTimeout (10 s in
# manifests/40-scheduler.yaml): a body still trickling in after that is a stuck or hostile client's.
BODY_READ_TIMEOUT_S = 10.0
HEADER_TIMEOUT_S = 10.0  # the same for the request line and headers (HeaderDeadlineH11)
KEEP_ALIVE_S = 5  # uvicorn's idle keep-alive timeout (its default), stated once for every listener
MAX_HEADER_BYTES = 16 * 1024  # h11's default incomplete-event limit: a request head larger than this is 400
# A preempt body is capped by what the cluster holds: the preemptor pod (as large as the API server accepts)
# plus, with room to spare, each known node's name and each known bound pod's UID (kube-scheduler names only
# pods on the node, in the UID form the chart's nodeCacheCapable: true asks for), never above max_body_bytes.
PREEMPT_POD_BYTES = 3 * 1024 * 1024
PREEMPT_NODE_BYTES = 512
PREEMPT_VICTIM_BYTES = 128
PREEMPT_WORKERS, PREEMPT_WAITING = 2, 8  # preempt calls decoded and answered at once / admitted to wait
# GET /, GET /state and POST /queue walk the whole cluster or the queue: one at a time off the event loop
BULK_WORKERS, BULK_WAITING = 1, 8


# Answers given before the whole body was read: the connection cannot carry another request after them.
_UNREAD_BODY = frozenset({408, 413})


class BodyTooLarge(Exception):
    pass


class BodyTimeout(Exception):
    """The request body did not arrive within the read deadline."""


class NotJson(Exception):
    """The request's Content-Type is not application/json."""


class ClientGone(Exception):
    """The client hung up before its request body arrived: there is no one to answer."""


class Services:
    """What the routes depend on; one per app, reached through FastAPI's dependency injection."""

    def __init__(self, settings: Settings, store: Store, binder: Binder,
                 ready: Callable[[], bool] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.binder = binder
        try:
            policy = get_policy(settings.policy, **settings.policy_params)
        except (KeyError, TypeError) as err:
            raise ConfigError(f"policy {settings.policy!r}: {err}") from None
        self.metrics = Metrics(store)
        # Snapshot mode (binds change memory only) reads every pending pod into the queue and takes POST /queue;
        # cluster mode reads the pods for vramfit's scheduler names.
        self.snapshot_mode = isinstance(binder, MemoryBinder)
        schedulers = (settings.scheduler_name, settings.webhook_scheduler_name)
        if not self.snapshot_mode:
            with store.lock:
                store.queue.schedulers = frozenset(schedulers)
        # The queue planner (extender/planning/planner.py): made here, its thread started by whoever serves the app
        # (`vramfit serve`, `start_planner`), so an app built for a test plans only when asked.
        self.planner: Planner | None = None
        if settings.planning:
            # The live policy object (not its name): the plan scores with the verbs' mix and policy_params.
            try:
                self.planner = Planner(store, budget_s=settings.plan_budget_s,
                                       min_interval_s=settings.plan_min_interval_s, policy=policy,
                                       repack=settings.plan_repack, cpus=settings.plan_cpus,
                                       max_pods=settings.plan_max_pods)
            except ValueError as err:  # plan_cpus that this process's CPUs cannot give
                raise ConfigError(str(err)) from None
            self.metrics.registry.register(PlanCollector(self.planner, store))
        self.extender = Extender(store, binder, policy, self.metrics, scheduler_names=schedulers,
                                 filter_window_s=settings.bind_filter_window_s, planner=self.planner,
                                 shortlist_k=settings.shortlist_k)
        # The policy's deferred work (LP re-solves, mix rebuilds) off the request path; its thread starts with
        # the first work due (extender/refresh.py).
        self.refresher = Refresher.for_policy(store, policy, self.metrics.registry)
        self._ready = ready
        self._large: asyncio.Semaphore | None = None  # made on first use, inside the serving loop
        self.preempts = Offload("preempt", PREEMPT_WORKERS, PREEMPT_WAITING)
        self.bulk = Offload("bulk", BULK_WORKERS, BULK_WAITING)  # the view, /state, POST /queue
        self.body_timeout_s = BODY_READ_TIMEOUT_S

    def large_calls(self) -> asyncio.Semaphore:
        if self._large is None:
            self._large = asyncio.Semaphore(LARGE_CALLS_AT_ONCE)
        return self._large

    def ready(self) -> bool:
        return self.store.ready and (self._ready is None or self._ready())

    def preempt_cap(self) -> int:
        """The largest preempt body this cluster can call for (see PREEMPT_POD_BYTES)."""
        store = self.store
        sized = (PREEMPT_POD_BYTES + len(store.state) * PREEMPT_NODE_BYTES
                 + store.queue.bound_count() * PREEMPT_VICTIM_BYTES)
        return min(self.settings.max_body_bytes, sized)

    def known_victims(self, node: str) -> frozenset[str]:
        """The UIDs of the watched pods bound to a node (the victims kube-scheduler can name there)."""
        return frozenset(uid for obj in self.store.pods_on(node)
                         if isinstance(uid := (obj.get("metadata") or {}).get("uid"), str))


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def _json(content: Any, status: int = 200) -> Response:
    return Response(wire.dumps(content), status_code=status, media_type="application/json")


async def _read_asgi_body(scope: Scope, receive: Receive, cap: int, timeout_s: float = BODY_READ_TIMEOUT_S) -> bytes:
    """The request body straight from the ASGI channel: at most `cap` bytes (413 beyond), all of it within
    `timeout_s` of the first read (408 after)."""
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit() and int(value) > cap:
            raise BodyTooLarge(f"request body of {value.decode()} bytes exceeds the {cap}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > cap:
                    raise BodyTooLarge(f"request body exceeds the {cap}-byte limit")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s ({size} bytes arrived)") from None


def _media_type(scope: Scope) -> str:
    for key, value in scope["headers"]:
        if key == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""


def _require_json(scope: Scope) -> None:
    media = _media_type(scope)
    if media != "application/json":
        raise NotJson(f"Content-Type must be application/json, got {media or 'none'!r}")


@dataclass(frozen=True)
class Verb:
    """One extender verb: its request model, handler, and whether the handler may block on I/O."""

    name: str
    model: type[wire.GoStruct]
    handler: Callable[[Any], Any]
    threaded: bool
    latency: Any  # the verb's pre-bound histogram child (labels() costs a lookup per call)
    parse: Callable[[bytes], Any] | None = None  # the body's decoder (default: wire.parse into `model`)
    offload: Offload | None = None  # set: every call is decoded and answered there, admitted before its body
    cap: Callable[[], int] | None = None  # the body cap (default: max_body_bytes)
    # Set: awaited on the event loop around a threaded handler (bind's turn at the admission gate)
    before: Callable[[Any], contextlib.AbstractAsyncContextManager[None]] | None = None

    def decode(self, raw: bytes) -> Any:
        return self.parse(raw) if self.parse is not None else wire.parse(self.model, raw)


@contextlib.asynccontextmanager
async def _admitted(offload: Offload | None) -> AsyncIterator[Any]:
    if offload is None:
        yield None
        return
    async with offload.admit() as slot:
        yield slot


async def run_verb(svc: Services, verb: Verb, read: Callable[[int], Awaitable[bytes]],
                   scope: Scope | None = None) -> tuple[int, bytes, float]:
    """Read (`read(cap)`), decode, handle and encode one verb call -> (HTTP status, JSON body, seconds spent).

    Never raises, except ClientGone (nobody to answer)."""
    start = time.perf_counter()
    status = 200
    body = b""
    try:
        async with _admitted(verb.offload) as slot:
            raw = await read(verb.cap() if verb.cap is not None else svc.settings.max_body_bytes)
            if scope is not None:
                # After the read, so an oversized body is always 413 and the client is not cut off mid-send.
                _require_json(scope)
            if slot is not None:
                body = await slot.run(_answer, verb, raw)
            elif len(raw) > LARGE_BODY_BYTES:
                async with svc.large_calls():
                    body = await run_in_threadpool(_answer, verb, raw)
            else:
                body = _encoded(await _handle(verb, verb.decode(raw)))
    except Busy as err:
        status = 503
        body = wire.dumps(wire.binding_result(str(err)))
    except ClientGone:
        status = 499  # nginx's "client closed request", for the request counter only
        raise
    except BodyTooLarge as err:
        status = 413
        body = wire.dumps(wire.binding_result(str(err)))
    except BodyTimeout as err:
        status = 408
        body = wire.dumps(wire.binding_result(str(err)))
    except NotJson as err:
        status = 415
        body = wire.dumps(wire.binding_result(str(err)))
    except wire.WireError as err:
        status = 400
        body = wire.dumps(wire.binding_result(str(err)))
    except Exception as err:
        status = 500
        log.exception("%s failed", verb.name)
        body = wire.dumps(wire.binding_result(f"internal error in {verb.name}: {type(err).__name__}: {err}"))
    finally:
        spent = time.perf_counter() - start
        verb.latency.observe(spent)
        svc.metrics.requests.labels(verb.name, str(status)).inc()
    return status, body, spent


async def _handle(verb: Verb, args: Any) -> Any:
    if not verb.threaded:
        return verb.handler(args)
    if verb.before is None:
        return await run_in_threadpool(verb.handler, args)
    async with verb.before(args):  # waits on the event loop, holding no pool thread
        return await run_in_threadpool(verb.handler, args)


def _encoded(result: Any) -> bytes:
    # Handlers on the hot path answer pre-encoded JSON bytes; the others plain values.
    return result if isinstance(result, bytes) else wire.dumps(result)


def _answer(verb: Verb, raw: bytes) -> bytes:
    """Decode, handle and encode a large call, in a worker thread: the event loop keeps serving meanwhile."""
    with _gc_paused():
        return _encoded(verb.handler(verb.decode(raw)))


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = True


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a large call builds its objects. A 27 MiB preempt call makes
    ~10^6 of them (no cycles: refcounting frees them all); the collections they trigger would walk the whole
    heap several times, every thread stopped meanwhile (1.1 of its 1.8 s of decoding, and the longest
    pauses of the small calls beside it). Collection resumes when the last large call ends."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        _gc_pausers += 1
        if _gc_pausers == 1:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _timing_header(seconds: float) -> bytes:
    """`Server-Timing` (W3C): the extender's own time, so a client can split its latency from transport."""
    return f"vramfit;dur={seconds * 1000:.3f}".encode()


class ExtenderApp(FastAPI):
    """FastAPI for everything, except that a POST to a verb's exact path is answered right here.

    kube-scheduler calls the verbs in its serial scheduling cycle with thousands of node names; FastAPI's
    middleware stack, routing and dependency injection cost ~0.2 ms a call on a 2-CPU box, so the verbs
    take the raw ASGI path. The FastAPI routes for the same paths stay (other methods, trailing slashes)
    and share `run_verb`, so both paths answer identically."""

    verbs: dict[str, Verb]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = self.verbs.get(scope["path"])
            if verb is not None:
                await self._serve_verb(verb, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve_verb(self, verb: Verb, scope: Scope, receive: Receive, send: Send) -> None:
        svc: Services = self.state.services
        try:
            status, body, spent = await run_verb(
                svc, verb, lambda cap: _read_asgi_body(scope, receive, cap, svc.body_timeout_s), scope)
        except ClientGone:
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"server-timing", _timing_header(spent))]
        if status in _UNREAD_BODY:
            headers.append((b"connection", b"close"))
        if status == 503:
            headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _HeadDeadline:
    """A deadline on the request head for uvicorn's HTTP protocols: a connection that has not sent a complete
    request line and headers HEADER_TIMEOUT_S after it opened (or after its previous response) is closed.

    uvicorn's own keep-alive timer only runs between requests and stops at the first byte, so a client that
    trickles a header a byte at a time would hold its connection (and a slot of the scheduler's) forever."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        self._arm_head_deadline()
        super().on_response_complete()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            self.transport.close()

    def _awaiting_head(self) -> bool:
        raise NotImplementedError


class HeaderDeadlineH11(_HeadDeadline, H11Protocol):
    """h11 with the head deadline (head size: h11's incomplete-event limit, `MAX_HEADER_BYTES`)."""

    def handle_events(self) -> None:
        super().handle_events()
        if not self._awaiting_head():
            self._disarm_head_deadline()

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE


class HeaderDeadlineHttpTools(_HeadDeadline, HttpToolsProtocol):
    """httptools (uvicorn's faster parser, ~0.1 ms a call less) with the head deadline and a head-size
    limit of its own: llhttp sets none, and headers would pile up in memory until the deadline."""

    _in_head = True  # between the first byte of a request (or the connection's start) and its last header
    _head_bytes = 0

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_deadline()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():  # what this chunk added to an unfinished head
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self.send_400_response("Request head too large.")

    def _awaiting_head(self) -> bool:
        return self._in_head


def uvicorn_options(header_timeout_s: float = HEADER_TIMEOUT_S, protocol: str = "httptools") -> dict[str, Any]:
    """uvicorn.Config keywords every listener of this app should use: the head deadline and size limit on
    `protocol` ("httptools", what uvicorn's "auto" picks, or "h11") and the keep-alive timeout."""
    base: type[_HeadDeadline] = HeaderDeadlineHttpTools if protocol == "httptools" else HeaderDeadlineH11
    chosen = base
    if header_timeout_s != HEADER_TIMEOUT_S:
        chosen = type(base.__name__, (base,), {"header_timeout_s": header_timeout_s})
    return {"http": chosen, "timeout_keep_alive": KEEP_ALIVE_S, "h11_max_incomplete_event_size": MAX_HEADER_BYTES}


def create_app(settings: Settings, store: Store, binder: Binder,
               ready: Callable[[], bool] | None = None) -> FastAPI:
    """The extender app. `ready` (optional) adds a readiness condition, e.g. the API watch being up."""
    app = ExtenderApp(title="vramfit scheduler extender", version="0.1.0", docs_url=None, redoc_url=None,
                      openapi_url=None)
    svc = Services(settings, store, binder, ready)
    app.state.services = svc
    verbs = _verbs(svc, binder)
    app.verbs = {f"{p}/{v.name}": v for p in settings.verb_prefixes for v in verbs}
    for verb in verbs:
        _add_verb_route(app, settings, verb)
    add_webhook_routes(app, settings)  # POST /mutate: the mutating admission webhook (extender/webhook.py)
    _add_health_routes(app)
    _add_read_routes(app)
    app.add_exception_handler(404, _not_found)
    return app


def _verbs(svc: Services, binder: Binder) -> list[Verb]:
    """The scheduler's four verbs, each with its parser, latency histogram and where it runs."""
    ext, store = svc.extender, svc.store
    # A binder that talks to the API server runs off the event loop, so filters keep flowing meanwhile.
    return [Verb("filter", wire.ExtenderArgs, ext.filter, False, svc.metrics.latency.labels("filter")),
            Verb("prioritize", wire.ExtenderArgs, ext.prioritize, False, svc.metrics.latency.labels("prioritize")),
            Verb("bind", wire.ExtenderBindingArgs, ext.bind, getattr(binder, "blocking", True),
                 svc.metrics.latency.labels("bind"), before=lambda args: _gate_turn(binder, ext, args)),
            # Off the event loop always, and bounded by the nodes and pods the store knows (extender/wire.py).
            Verb("preempt", wire.ExtenderPreemptionArgs, ext.preempt, True, svc.metrics.latency.labels("preempt"),
                 parse=lambda raw: wire.parse_preemption(raw, store.state.has_node, svc.known_victims),
                 offload=svc.preempts, cap=svc.preempt_cap)]


def _add_verb_route(app: FastAPI, settings: Settings, verb: Verb) -> None:
    """POST <prefix>/<verb> for every verb prefix the settings name."""
    async def route(request: Request, svc: ServicesDep) -> Response:
        read = lambda cap: _read_asgi_body(request.scope, request.receive, cap,  # noqa: E731
                                           svc.body_timeout_s)
        try:
            status, body, spent = await run_verb(svc, verb, read, request.scope)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        return Response(body, status_code=status, media_type="application/json",
                        headers=_verb_headers(status, spent))

    for p in settings.verb_prefixes:
        app.add_api_route(f"{p}/{verb.name}", route, methods=["POST"], name=f"{verb.name}{p.replace('/', '_')}")


def _verb_headers(status: int, spent: float) -> dict[str, str]:
    headers = {"server-timing": _timing_header(spent).decode()}
    if status in _UNREAD_BODY:
        headers["connection"] = "close"
    if status == 503:
        headers["retry-after"] = str(RETRY_AFTER_S)
    return headers


def _add_health_routes(app: FastAPI) -> None:
    """GET /healthz and /readyz."""
    # Cluster mode sets app.state.liveness / .readiness (extender/replica.py): () -> None when fine, else why not.
    app.state.liveness = None
    app.state.readiness = None

    @app.get("/healthz")
    async def healthz(request: Request) -> PlainTextResponse:
        check = request.app.state.liveness
        why = check() if check is not None else None
        return PlainTextResponse(f"unhealthy: {why}", status_code=503) if why else PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz(request: Request, svc: ServicesDep) -> PlainTextResponse:
        if svc.ready():
            return PlainTextResponse("ok")
        check = request.app.state.readiness
        why = check() if check is not None else None
        return PlainTextResponse(f"not ready: {why or 'nodes and pods not yet listed'}", status_code=503)


def _add_read_routes(app: FastAPI) -> None:
    """GET /metrics, /state and / (the page), and snapshot mode's POST /queue."""
    @app.get("/metrics")
    async def metrics(svc: ServicesDep) -> Response:
        # Off the event loop: a 5,000-node scrape takes a few ms, and verbs should interleave with it.
        body = await run_in_threadpool(exposition, svc.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    async def state(svc: ServicesDep) -> Response:
        try:  # off the event loop: at 5,000 nodes it is a walk of half a second
            pieces = await svc.bulk.run(state_pieces, svc)
        except Busy as err:
            return _busy(err)
        return StreamingResponse(_sent_apart(pieces), media_type="application/json")

    app.add_api_route("/queue", _add_to_queue, methods=["POST"], name="add_to_queue")

    @app.get("/")
    async def page(svc: ServicesDep) -> Response:
        """The cluster as people read it (extender/view.py); same port and client auth as /state."""
        try:  # off the event loop, the store's lock taken a chunk of nodes at a time (extender/view.py)
            pieces = await svc.bulk.run(_page_pieces, svc.store)
        except Busy as err:
            return _busy(err)
        return StreamingResponse(_sent_apart(pieces), media_type="text/html; charset=utf-8")


async def _add_to_queue(request: Request, svc: ServicesDep) -> Response:
    """Snapshot mode: add pending pods (a Pod, a list of Pods, or a List) to the running cluster, as a
    watch would (tests, demos). 400 with the reason for anything that is not a pending vramfit pod."""
    if not svc.snapshot_mode:
        return _json({"Error": "POST /queue is for snapshot mode only: in a cluster, create the pod"}, 404)
    try:
        async with svc.bulk.admit() as slot:
            try:
                raw = await _read_asgi_body(request.scope, request.receive, svc.settings.max_body_bytes,
                                            svc.body_timeout_s)
            except BodyTooLarge as err:
                return _json({"Error": str(err)}, 413)
            except (BodyTimeout, ClientGone) as err:
                return _json({"Error": str(err) or "client gone"}, 408)
            status, answer = await slot.run(add_queued, svc, raw)  # decoding is off the event loop
    except Busy as err:
        return _busy(err)
    return _json(answer, status)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"Error": f"no such endpoint: {request.method} {request.url.path}"}, status_code=404)


def _busy(err: Busy) -> Response:
    return Response(wire.dumps({"Error": str(err)}), status_code=503, media_type="application/json",
                    headers={"retry-after": str(RETRY_AFTER_S)})


@contextlib.asynccontextmanager
async def _gate_turn(binder: Binder, ext: Extender, args: wire.ExtenderBindingArgs) -> AsyncIterator[None]:
    """Bind's units booked and its turn at the admission gate taken, on the event loop (extender/verbs/bind.py,
    extender/admission.py); neither in snapshot mode."""
    gate = getattr(binder, "admission", None)
    if gate is None:
        yield
        return
    async with ext.bind_turn(gate, args):
        yield


def add_queued(svc: Services, raw: bytes) -> tuple[int, dict[str, Any]]:
    """POST /queue's work (in a worker thread): (HTTP status, answer)."""
    try:
        pods = queue_objects(wire.decode_json(raw), svc.store.tenancy)
    except (wire.WireError, ValueError, InputError) as err:
        return 400, {"Error": str(err)}
    for obj in pods:
        svc.store.apply("pods", "ADDED", obj)
    if svc.planner is not None:
        svc.planner.request_replan()
    return 200, {"added": [{"pod": pod_key(o), "uid": o["metadata"]["uid"]} for o in pods]}


def queue_objects(body: Any, tenancy: Tenancy = NO_NAMESPACE_RULES) -> list[dict[str, Any]]:
    """The pods of a POST /queue body (a Pod, a list, or a List), each checked to be a pending vramfit pod (its
    tenant one its namespace allows, by `tenancy`) and given a uid and creationTimestamp when it has none;
    ValueError / InputError saying what is wrong."""
    items = body.get("items") if isinstance(body, dict) and body.get("kind") == "List" else body
    items = items if isinstance(items, list) else [items]
    if not items:
        raise ValueError("no pods given")
    out = []
    for k, obj in enumerate(items):
        if not isinstance(obj, dict) or obj.get("kind") not in (None, "Pod"):
            raise ValueError(f"item {k}: expected a Pod object")
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise ValueError(f"item {k}: metadata.name is missing")
        obj = {**obj, "metadata": {"namespace": "default", **meta}}
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise ValueError(f"pod {pod_key(obj)}: spec is missing")
        if spec.get("nodeName"):
            raise ValueError(f"pod {pod_key(obj)}: spec.nodeName is set: only pending pods join the queue")
        if not isinstance(spec.get("schedulerName", ""), str | None):
            raise ValueError(f"pod {pod_key(obj)}: spec.schedulerName must be a string")
        if pod_demand(obj, tenancy) is None:  # raises InputError for malformed vramfit fields
            raise ValueError(f"pod {pod_key(obj)}: asks for no VRAM (resource or annotation vramfit.io/vram)")
        out.append(obj)
    return out


def view_pieces(store: Store) -> Iterator[str]:
    """The page (in a worker thread): the head of the queue, bounded whatever its size, and the nodes read a
    chunk at a time under the store's lock, so verbs interleave with it; the HTML a chunk of nodes at a time."""
    with store.lock:
        pending = [e.pod for e in store.queue.read(store.state, MAX_PENDING)]
        total = store.queue.ours()
        conflicted = [f"{c.key} on {c.node}: {c.reason}" for c in store.conflicted.values()]
        unserved = sorted(store.unserved.items())
    view = cluster_view(store.state, pending, conflicted, store.catalog, lock=store.lock,
                        pending_total=max(total, len(pending)), not_served=unserved)
    return html_pieces(view, title="vramfit")


def _page_pieces(store: Store) -> list[bytes]:
    with _gc_paused():  # the page's ~10^6 short-lived objects would trigger collections that stop every thread
        # Encoded and sent a chunk at a time: one encode, join or send of it all held the verbs.
        return [piece.encode() for piece in view_pieces(store)]


def state_pieces(svc: Services) -> list[bytes]:
    """GET /state's body (in a worker thread), in pieces of CHUNK_NODES nodes: one encoder call, join or copy
    over the whole 10 MB view (5,000 nodes) would hold the interpreter lock, and so the verbs, for its length."""
    with _gc_paused():
        view = state_view(svc.store)
        view["plan"] = svc.planner.to_json() if svc.planner is not None else None
        nodes = view.pop("nodes")
        head = wire.dumps({"ready": view.pop("ready"), "generation": view.pop("generation")})
        pieces = [head[:-1] + b',"nodes":[']
        for k in range(0, len(nodes), CHUNK_NODES):
            lead = b"," if k else b""
            pieces.append(lead + b",".join(wire.dumps(n) for n in nodes[k:k + CHUNK_NODES]))
            pause()
        pieces.append(b"]," + wire.dumps(view)[1:])
        return pieces


async def _sent_apart(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:  # the event loop sends one piece per step: verbs are answered in between
        yield piece


def state_view(store: Store) -> dict[str, Any]:
    """Every node's GPUs and units and who holds them, reservations not yet bound, conflicted pods."""
    store.sweep()
    nodes = each_node(store.state, store.lock, lambda n: node_summary(store.state, store.state.node(n)))
    with store.lock:
        state = store.state
        now = store.clock()
        return {
            "ready": store.ready,
            "generation": store.generation,
            "nodes": nodes,
            "unusable_nodes": dict(store.bad_nodes),
            # nodes kube-scheduler never offers vramfit pods (no node agent): not counted as capacity
            "nodes_not_served": dict(store.unserved),
            "reservations": [
                {"pod": r.pod.key, "uid": r.uid, "node": r.assignment.node,
                 "assignment": r.assignment.to_annotation(), "expires_in_s": round(r.deadline - now, 3)}
                for r in store.reservations.values()
            ],
            "stranded_mib": state.stranded_mib(),
            # pods bound to a node whose units clash with another holder's (their free parts stay booked)
            "conflicted": store.conflicted_view(),
            # bound pods whose assignment was edited after it was recorded (the edit is ignored)
            "edited": store.edited_view(),
            "waiting_for_node": store.waiting_view(),
            # DRA: the nodes read from ResourceSlices, claims allocated, gated pods and why they wait
            "dra": store.dra.view() if store.dra is not None else None,
            "warnings": list(store.warnings)[-50:],
        }
