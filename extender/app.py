"""FastAPI app: the extender verbs over HTTP, plus health, readiness, metrics and a state dump.

Verb endpoints read the raw body themselves (size-capped before it is read) and answer pre-serialised
JSON: kube-scheduler sends up to thousands of node names per call, and FastAPI's generic encoder is the
slowest part of a naive handler. Bad input is HTTP 400 with `{"Error": "<what is wrong>"}`; a request the
extender understands but cannot serve is HTTP 200 with a non-empty `Error` (kube-scheduler discards the body
of any non-200 answer, so only that form reaches the user).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from extender import wire
from extender.binder import Binder
from extender.config import ConfigError, Settings
from extender.metrics import Metrics, exposition
from extender.service import Extender
from extender.store import Store
from extender.webhook import add_webhook_routes
from packing.policies import get_policy
from packing.snapshot import node_summary

log = logging.getLogger("vramfit.app")


class BodyTooLarge(Exception):
    pass


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
        self.extender = Extender(store, binder, policy, self.metrics)
        self._ready = ready

    def ready(self) -> bool:
        return self.store.ready and (self._ready is None or self._ready())


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def _json(content: Any, status: int = 200) -> Response:
    return Response(wire.dumps(content), status_code=status, media_type="application/json")


async def _read_asgi_body(scope: Scope, receive: Receive, cap: int) -> bytes:
    """The request body straight from the ASGI channel, at most `cap` bytes (413 beyond)."""
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit() and int(value) > cap:
            raise BodyTooLarge(f"request body of {value.decode()} bytes exceeds the {cap}-byte limit")
    chunks: list[bytes] = []
    size = 0
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


@dataclass(frozen=True)
class Verb:
    """One extender verb: its request model, handler, and whether the handler may block on I/O."""

    name: str
    model: type[wire.GoStruct]
    handler: Callable[[Any], Any]
    threaded: bool
    latency: Any  # the verb's pre-bound histogram child (labels() costs a lookup per call)


async def run_verb(svc: Services, verb: Verb, read: Callable[[], Awaitable[bytes]]) -> tuple[int, bytes, float]:
    """Read, decode, handle and encode one verb call -> (HTTP status, JSON body, seconds spent).

    Never raises, except ClientGone (nobody to answer)."""
    start = time.perf_counter()
    status = 200
    body = b""
    try:
        args = wire.parse(verb.model, await read())
        result = await run_in_threadpool(verb.handler, args) if verb.threaded else verb.handler(args)
        # Handlers on the hot path answer pre-encoded JSON bytes; the others plain values.
        body = result if isinstance(result, bytes) else wire.dumps(result)
    except ClientGone:
        status = 499  # nginx's "client closed request", for the request counter only
        raise
    except BodyTooLarge as err:
        status = 413
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
            status, body, spent = await run_verb(svc, verb,
                                                 lambda: _read_asgi_body(scope, receive, svc.settings.max_body_bytes))
        except ClientGone:
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"server-timing", _timing_header(spent))]})
        await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings, store: Store, binder: Binder,
               ready: Callable[[], bool] | None = None) -> FastAPI:
    """The extender app. `ready` (optional) adds a readiness condition, e.g. the API watch being up."""
    app = ExtenderApp(title="vramfit scheduler extender", version="0.1.0", docs_url=None, redoc_url=None,
                      openapi_url=None)
    svc = Services(settings, store, binder, ready)
    app.state.services = svc
    prefix = settings.url_prefix
    ext = svc.extender
    # A binder that talks to the API server runs off the event loop, so filters keep flowing meanwhile.
    verbs = [Verb("filter", wire.ExtenderArgs, ext.filter, False, svc.metrics.latency.labels("filter")),
             Verb("prioritize", wire.ExtenderArgs, ext.prioritize, False, svc.metrics.latency.labels("prioritize")),
             Verb("bind", wire.ExtenderBindingArgs, ext.bind, getattr(binder, "blocking", True),
                  svc.metrics.latency.labels("bind")),
             Verb("preempt", wire.ExtenderPreemptionArgs, ext.preempt, False, svc.metrics.latency.labels("preempt"))]
    app.verbs = {f"{prefix}/{v.name}": v for v in verbs}

    def add_verb_route(verb: Verb) -> None:
        async def route(request: Request, svc: ServicesDep) -> Response:
            read = lambda: _read_asgi_body(request.scope, request.receive, svc.settings.max_body_bytes)  # noqa: E731
            try:
                status, body, spent = await run_verb(svc, verb, read)
            except ClientGone:
                return Response(status_code=499)  # nobody reads it
            return Response(body, status_code=status, media_type="application/json",
                            headers={"server-timing": _timing_header(spent).decode()})

        app.add_api_route(f"{prefix}/{verb.name}", route, methods=["POST"], name=verb.name)

    for verb in verbs:
        add_verb_route(verb)
    add_webhook_routes(app, settings)  # POST /mutate: the mutating admission webhook (extender/webhook.py)

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz(svc: ServicesDep) -> PlainTextResponse:
        if svc.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready: nodes and pods not yet listed", status_code=503)

    @app.get("/metrics")
    async def metrics(svc: ServicesDep) -> Response:
        # Off the event loop: a 5,000-node scrape takes a few ms, and verbs should interleave with it.
        body = await run_in_threadpool(exposition, svc.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    async def state(svc: ServicesDep) -> Response:
        return _json(state_view(svc.store))

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"Error": f"no such endpoint: {request.method} {request.url.path}"}, status_code=404)

    app.add_exception_handler(404, not_found)
    return app


def state_view(store: Store) -> dict[str, Any]:
    """Every node's GPUs and units and who holds them, plus reservations not yet bound."""
    store.sweep()
    with store.lock:
        state = store.state
        now = store.clock()
        return {
            "ready": store.ready,
            "generation": store.generation,
            "nodes": [node_summary(state, node) for node in state.nodes()],
            "unusable_nodes": dict(store.bad_nodes),
            "reservations": [
                {"pod": r.pod.key, "uid": r.uid, "node": r.assignment.node,
                 "assignment": r.assignment.to_annotation(), "expires_in_s": round(r.deadline - now, 3)}
                for r in store.reservations.values()
            ],
            "stranded_mib": state.stranded_mib(),
            "warnings": list(store.warnings)[-50:],
        }
