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
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from extender import wire
from extender.binder import Binder
from extender.config import ConfigError, Settings
from extender.metrics import Metrics, exposition
from extender.service import Extender
from extender.store import Store
from packing.policies import get_policy
from packing.snapshot import node_summary

log = logging.getLogger("vramfit.app")


class BodyTooLarge(Exception):
    pass


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


async def _read_body(request: Request, cap: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise BodyTooLarge(f"request body of {length} bytes exceeds the {cap}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(f"request body exceeds the {cap}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(settings: Settings, store: Store, binder: Binder,
               ready: Callable[[], bool] | None = None) -> FastAPI:
    """The extender app. `ready` (optional) adds a readiness condition, e.g. the API watch being up."""
    app = FastAPI(title="vramfit scheduler extender", version="0.1.0", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.services = Services(settings, store, binder, ready)
    prefix = settings.url_prefix

    async def verb(request: Request, svc: Services, name: str, model: type[wire.GoStruct],
                   handler: Callable[[Any], Any], threaded: bool = False) -> Response:
        start = time.perf_counter()
        status = 200
        try:
            body = await _read_body(request, svc.settings.max_body_bytes)
            args = wire.parse(model, body)
            result = await run_in_threadpool(handler, args) if threaded else handler(args)
            return _json(result)
        except BodyTooLarge as err:
            status = 413
            return _json(wire.binding_result(str(err)), 413)
        except wire.WireError as err:
            status = 400
            return _json(wire.binding_result(str(err)), 400)
        except Exception as err:
            status = 500
            log.exception("%s failed", name)
            return _json(wire.binding_result(f"internal error in {name}: {type(err).__name__}: {err}"), 500)
        finally:
            svc.metrics.latency.labels(name).observe(time.perf_counter() - start)
            svc.metrics.requests.labels(name, str(status)).inc()

    @app.post(f"{prefix}/filter")
    async def filter_(request: Request, svc: ServicesDep) -> Response:
        return await verb(request, svc, "filter", wire.ExtenderArgs, svc.extender.filter)

    @app.post(f"{prefix}/prioritize")
    async def prioritize(request: Request, svc: ServicesDep) -> Response:
        return await verb(request, svc, "prioritize", wire.ExtenderArgs, svc.extender.prioritize)

    @app.post(f"{prefix}/bind")
    async def bind(request: Request, svc: ServicesDep) -> Response:
        # A binder that talks to the API server runs off the event loop, so filters keep flowing meanwhile.
        return await verb(request, svc, "bind", wire.ExtenderBindingArgs, svc.extender.bind,
                          threaded=getattr(svc.binder, "blocking", True))

    @app.post(f"{prefix}/preempt")
    async def preempt(request: Request, svc: ServicesDep) -> Response:
        return await verb(request, svc, "preempt", wire.ExtenderPreemptionArgs, svc.extender.preempt)

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
