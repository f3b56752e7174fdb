"""The protocol's floor: a scheduler extender that decides nothing, for bench_extender to measure vramfit against.

Raw ASGI under uvicorn with the listener settings `vramfit serve` uses (`extender.app.uvicorn_options`: httptools
with the head deadline, the keep-alive timeout), JSON by orjson. Each verb still does what the protocol makes any
extender do: read the whole body, decode it as kube-scheduler's ExtenderArgs (the names must be read to be
answered), encode an answer naming every node:

- /filter: every requested node passes (NodeNames form: the same names; Nodes form: the same Node objects);
- /prioritize: every requested node scores 5 (of kube-scheduler's 0..10);
- /bind: HTTP 200, no error (nothing is bound).

Any path ending in one of the three verbs is served (so `/vramfit/filter` as well as `/filter`); `GET /metrics`
answers an empty page (the bench's client reads it after a run). Each answer carries a `Server-Timing` header
measured as vramfit's is (from the body's first read to the encoded answer), so in-server times compare too.

    .venv/bin/python -m benchmarks.floor_extender --port 8888      # serve it alone
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

FLOOR_SCORE = 5  # the middle of kube-scheduler's extender scale (MaxExtenderPriority = 10)
VERBS = ("filter", "prioritize", "bind")
JSON = (b"content-type", b"application/json")


class BadArgs(ValueError):
    """A body that is not the verb's ExtenderArgs / ExtenderBindingArgs (answered HTTP 400, naming the field)."""


def node_names(args: Any) -> list[str]:
    """The names an ExtenderArgs names: `NodeNames` (nodeCacheCapable: true), else `Nodes.items[].metadata.name`."""
    if not isinstance(args, dict):
        raise BadArgs("ExtenderArgs: not a JSON object")
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadArgs("ExtenderArgs.NodeNames: not a list of strings")
        return names
    return [_item_name(i, item) for i, item in enumerate(_node_items(args))]


def _node_items(args: dict[str, Any]) -> list[Any]:
    nodes = args.get("Nodes")
    if nodes is None:
        return []  # neither form: no node to answer for
    items = nodes.get("items") if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        raise BadArgs("ExtenderArgs.Nodes.items: not a list")
    return items


def _item_name(i: int, item: Any) -> str:
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        raise BadArgs(f"ExtenderArgs.Nodes.items[{i}].metadata.name: not a string")
    return name


def filter_answer(args: Any) -> dict[str, Any]:
    """ExtenderFilterResult passing every requested node, in the form it was asked in."""
    names = node_names(args)  # validates either form
    nodes = None if args.get("NodeNames") is not None else {"metadata": {}, "items": _node_items(args)}
    return {"Nodes": nodes, "NodeNames": names if nodes is None else None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": ""}


def prioritize_answer(args: Any) -> list[dict[str, Any]]:
    """HostPriorityList: every requested node scores FLOOR_SCORE."""
    return [{"Host": name, "Score": FLOOR_SCORE} for name in node_names(args)]


def bind_answer(args: Any) -> dict[str, str]:
    """ExtenderBindingResult with no error, once the ExtenderBindingArgs name a pod and a node."""
    if not isinstance(args, dict):
        raise BadArgs("ExtenderBindingArgs: not a JSON object")
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        if not isinstance(args.get(key), str):
            raise BadArgs(f"ExtenderBindingArgs.{key}: not a string")
    return {"Error": ""}


ANSWERS = {"filter": filter_answer, "prioritize": prioritize_answer, "bind": bind_answer}


def answer(verb: str, body: bytes) -> tuple[int, bytes]:
    """(HTTP status, JSON body) for one call of `verb` with this request body."""
    try:
        return 200, orjson.dumps(ANSWERS[verb](orjson.loads(body)))
    except orjson.JSONDecodeError as err:
        return 400, orjson.dumps({"Error": f"{verb}: body is not JSON: {err}"})
    except BadArgs as err:
        return 400, orjson.dumps({"Error": f"{verb}: {err}"})


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ConnectionError("client gone")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [JSON, (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor extender, as an ASGI application."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    verb = scope["path"].rpartition("/")[2]
    if scope["method"] == "POST" and verb in ANSWERS:
        start = time.perf_counter()
        try:
            body = await _read_body(receive)
        except ConnectionError:
            return
        status, out = answer(verb, body)
        timing = f"floor;dur={(time.perf_counter() - start) * 1000:.3f}".encode()
        await _respond(send, status, out, [(b"server-timing", timing)])
    elif scope["method"] == "GET" and scope["path"] == "/metrics":
        await _respond(send, 200, b"", [])
    else:
        await _respond(send, 404, orjson.dumps({"Error": f"not served: {scope['method']} {scope['path']}"}), [])


def serve_local(port_q: Any, stop_ev: Any) -> None:
    """Serve on an ephemeral loopback port in this process until `stop_ev` is set; puts (port, 0.0, {}) on
    `port_q` once listening (bench_extender's server-process protocol: port, state build seconds, planner)."""
    from benchmarks.local_server import LocalServer
    from extender.app import uvicorn_options

    with LocalServer(app, **uvicorn_options()) as server:
        port_q.put((server.port, 0.0, {}))
        stop_ev.wait(3600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    import uvicorn  # here, so the bench's client imports only the answers

    from extender.app import uvicorn_options

    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                                  **uvicorn_options())).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
