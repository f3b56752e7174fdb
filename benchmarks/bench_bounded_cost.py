"""Bounded cost for every input (issue 26): three studies against a real server process on loopback.

- fuzz:  >= 30,000 random requests (valid, mutated, random JSON trees, garbage) across filter, prioritize, bind,
         preempt, /mutate and /queue on a small snapshot cluster -> the count of 5xx answers (target 0).
- flood: /mutate bodies just under the webhook's cap from 4 clients for --seconds while /healthz and /readyz are
         probed as the kubelet does (timeoutSeconds 1) -> failed probes (target 0); peak RSS of the server for one
         largest /mutate and one largest preempt, and for two of each at once (targets < 1 GiB and < 2 GiB, the
         chart's limit), and what an oversized 30 MiB preempt costs (refused by the cluster-sized cap).
- block: at --nodes nodes, how long GET /, GET /state and a preempt naming every node delay a concurrent filter
         (5,000 node names): the filter's worst latency while each runs, less its median alone (target <= 50 ms).

    python -m benchmarks.bench_bounded_cost [--nodes 5000] [--requests 30000] [--seconds 30] \
        [--out benchmarks/results/bounded_cost.json]

Writes the figures as JSON (and prints them); the command line is recorded in the file.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_extender import PREFIX, make_node
from benchmarks.report import save_json

GIB = 2**30
MIB = 2**20


# ---- the server ----------------------------------------------------------------------------------------

def _pod(j: int, vram: int = 8192, node: str | None = None, gpu: bool = True) -> dict[str, Any]:
    res = {"requests": {"cpu": "1", **({"vramfit.io/vram": str(vram)} if gpu else {})},
           "limits": {**({"vramfit.io/vram": str(vram)} if gpu else {})}}
    spec: dict[str, Any] = {"schedulerName": "vramfit-scheduler", "priority": 0,
                            "containers": [{"name": "main", "image": "busybox", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": f"pod-{j:06d}", "namespace": "bench",
                                        "uid": f"00000000-0000-4000-8000-{j:012d}",
                                        "creationTimestamp": "2026-05-04T10:02:11Z"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def _serve(n_nodes: int, bound_per_node: int, port_q: Any, stop_ev: Any) -> None:
    import os

    from benchmarks.local_server import LocalServer
    from extender.app import create_app, uvicorn_options
    from extender.binder import MemoryBinder
    from extender.cli import freeze_heap
    from extender.config import Settings
    from extender.store import Store
    from packing.catalog import load_catalog

    nodes = [make_node(k) for k in range(n_nodes)]
    bound = [_pod(100_000 + k * bound_per_node + i, node=nodes[k]["metadata"]["name"], gpu=False)
             for k in range(n_nodes) for i in range(bound_per_node)]
    queued = [_pod(j) for j in range(20)]
    store = Store.from_objects(nodes + bound + queued, load_catalog())
    app = create_app(Settings(url_prefix=PREFIX, planning=False), store, MemoryBinder())
    freeze_heap()
    with LocalServer(app, **uvicorn_options()) as server:
        port_q.put((server.port, os.getpid()))
        stop_ev.wait(3600)


class Server:
    def __init__(self, n_nodes: int, bound_per_node: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self.q, self.stop = ctx.Queue(), ctx.Event()
        self.proc = ctx.Process(target=_serve, args=(n_nodes, bound_per_node, self.q, self.stop), daemon=True)

    def __enter__(self) -> Server:
        self.proc.start()
        self.port, self.pid = self.q.get(timeout=900)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()

    def conn(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * 4096


def call(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """(HTTP status, body); -1 when the server closed the connection while the body was still being sent (its
    413 for a Content-Length over the cap comes before the body is read)."""
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionError, http.client.HTTPException, TimeoutError, OSError):
        conn.close()  # an answer before the whole body was sent (413) closes the connection: reconnect
        return -1, b""


class PeakRss:
    """Samples the server's RSS every 2 ms while in use: (baseline, peak) in bytes."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.peak = self.base = server.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss())
            time.sleep(0.002)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join()


# ---- fuzz -----------------------------------------------------------------------------------------------

NAMES = ["gpu-node-00000", "gpu-node-00001", "gpu-node-00002", "ghost"]
WEIRD = ["", "\x00", "\u202e", "💥", "a" * 300, "default", "NaN", "n1", "uid-1", "vramfit.io/vram"]


def _tree(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.4:
        return rng.choice([None, True, False, rng.randint(-(2**70), 2**70), rng.random() * 1e30, rng.choice(WEIRD),
                           rng.randint(-5, 5)])
    if r < 0.7:
        return [_tree(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(WEIRD + ["metadata", "spec", "Pod", "uid", "UID"]): _tree(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _mutate(rng: random.Random, doc: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        cur, parent, key = doc, None, None
        while isinstance(cur, dict | list) and cur and rng.random() < 0.7:
            parent = cur
            key = rng.choice(list(cur)) if isinstance(cur, dict) else rng.randrange(len(cur))
            cur = cur[key]
        if parent is None:
            continue
        action = rng.choice(["replace", "drop", "case"])
        if action == "replace":
            parent[key] = _tree(rng)
        elif action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif action == "case" and isinstance(parent, dict) and isinstance(key, str):
            parent[key.swapcase()] = parent.pop(key)
    return doc


def _fuzz_pod(rng: random.Random, j: int) -> dict[str, Any]:
    p = _pod(j, rng.choice([1024, 8192, 81920, 10**9]))
    del p["kind"]
    ann: dict[str, Any] = rng.choice([{}, {"vramfit.io/isolation": "hardware"}, {"vramfit.io/gpus": "2"},
                                      {"vramfit.io/gpus": "64"}, {"vramfit.io/isolation": "bogus"}])
    p["metadata"]["annotations"] = ann
    if rng.random() < 0.2:
        p["spec"]["schedulerName"] = rng.choice(["default-scheduler", "other", {"x": 1}, 7])
    return p


def _review(p: dict[str, Any], op: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": op,
                        "namespace": "bench", "name": p["metadata"]["name"], "object": p,
                        "oldObject": p if op == "UPDATE" else None,
                        "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}}


def _fuzz_request(rng: random.Random, j: int) -> tuple[str, bytes]:
    target = rng.choice(["filter", "prioritize", "bind", "preempt", "mutate", "queue"])
    p = _fuzz_pod(rng, j)
    meta = p["metadata"]
    valid: Any = {
        "filter": {"Pod": p, "Nodes": None, "NodeNames": NAMES},
        "prioritize": {"Pod": p, "Nodes": None, "NodeNames": NAMES[:3]},
        "bind": {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                 "Node": rng.choice(NAMES)},
        "preempt": {"Pod": p, "NodeNameToVictims": None,
                    "NodeNameToMetaVictims": {n: {"Pods": [{"UID": "u"}], "NumPDBViolations": 0} for n in NAMES}},
        "mutate": _review(p, rng.choice(["CREATE", "UPDATE", "DELETE"])),
        "queue": rng.choice([p, [p], {"kind": "List", "items": [p]}]),
    }[target]
    r = rng.random()
    if r < 0.45:
        doc = valid
    elif r < 0.85:
        doc = _mutate(rng, valid)
    else:
        doc = _tree(rng)
    body = json.dumps(doc).encode()
    if rng.random() < 0.03:
        body = rng.choice([b"", b"{", b"\xff\xfe", b'{"a": NaN}', b"[" * 2000, body[: len(body) // 2]])
    path = {"mutate": "/mutate", "queue": "/queue"}.get(target, f"{PREFIX}/{target}")
    if target == "bind" and rng.random() < 0.5:  # a real cycle: filter first
        return path, body
    return path, body


def fuzz(n_requests: int, seed: int = 26) -> dict[str, Any]:
    rng = random.Random(seed)
    codes: dict[str, dict[int, int]] = {}
    fives: list[str] = []
    with Server(3) as server:
        conn = server.conn(30)
        t0 = time.perf_counter()
        for j in range(n_requests):
            path, body = _fuzz_request(rng, j)
            status, answer = call(conn, "POST", path, body)
            if status == -1:
                conn = server.conn(30)
                status, answer = call(conn, "POST", path, body)
            by = codes.setdefault(path.rsplit("/", 1)[-1], {})
            by[status] = by.get(status, 0) + 1
            if status >= 500 or status == -1:
                fives.append(f"{path} {status} {body[:200]!r} -> {answer[:200]!r}")
        elapsed = time.perf_counter() - t0
    total5 = sum(n for by in codes.values() for s, n in by.items() if s >= 500 or s == -1)
    return {"requests": n_requests, "seconds": round(elapsed, 1), "5xx": total5, "codes": codes,
            "examples_5xx": fives[:10]}


# ---- flood and memory ------------------------------------------------------------------------------------

def _big_review(size: int) -> bytes:
    """An UPDATE review of about `size` bytes: object and oldObject each carry half of it in annotations."""
    p = _pod(1)
    del p["kind"]
    p["metadata"]["annotations"] = {f"note-{i}": "x" * 1000 for i in range(size // 2 // 1016)}
    return json.dumps(_review(p, "UPDATE")).encode()


def _probe(server: Server, stop: threading.Event, out: dict[str, int]) -> None:
    """kubelet-style probes: each on a fresh connection, 1 s timeout, every 0.5 s (the chart probes every 10 s)."""
    while not stop.is_set():
        for path in ("/healthz", "/readyz"):
            conn = server.conn(1.0)
            status, _ = call(conn, "GET", path)
            conn.close()
            out["probes"] += 1
            if status != 200:
                out["failed"] += 1
        stop.wait(0.5)


def _preempt_at_cap(server: Server, n_nodes: int, bound_per_node: int, cap: int) -> bytes:
    """A preempt naming every node with its known pods, padded with unknown victims up to just under the cap."""
    victims = {f"gpu-node-{k:05d}": [f"00000000-0000-4000-8000-{100_000 + k * bound_per_node + i:012d}"
                                     for i in range(bound_per_node)] for k in range(n_nodes)}
    pod = _pod(7, 40000)
    del pod["kind"]
    base = len(json.dumps({"Pod": pod, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": u} for u in v], "NumPDBViolations": 0} for n, v in victims.items()}}))
    per = len('{"UID": "00000000-0000-4000-9000-000000000000"}, ') + 1
    extra = max(0, (cap - base - 64 * 1024) // per)
    k = 0
    while extra > 0:
        victims[f"gpu-node-{k % n_nodes:05d}"].append(f"00000000-0000-4000-9000-{k:012d}")
        extra -= 1
        k += 1
    return json.dumps({"Pod": pod, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": u} for u in v], "NumPDBViolations": 0} for n, v in victims.items()}}).encode()


def _at_once(server: Server, path: str, bodies: list[bytes]) -> tuple[int, int, list[int]]:
    """(baseline RSS, peak RSS, statuses) while the bodies are posted at once."""
    statuses: list[int] = []

    def one(b: bytes) -> None:
        conn = server.conn(120)
        statuses.append(call(conn, "POST", path, b)[0])
        conn.close()

    with PeakRss(server) as rss:
        threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return rss.base, rss.peak, statuses


def flood(n_nodes: int, seconds: float, bound_per_node: int = 4) -> dict[str, Any]:
    from extender.app import PREEMPT_NODE_BYTES, PREEMPT_POD_BYTES, PREEMPT_VICTIM_BYTES
    from extender.config import Settings

    webhook_cap = Settings().webhook_max_body_bytes
    review = _big_review(webhook_cap - 64 * 1024)
    out: dict[str, Any] = {"nodes": n_nodes, "bound_pods": n_nodes * bound_per_node, "review_bytes": len(review)}
    with Server(n_nodes, bound_per_node) as server:
        out["rss_idle_mib"] = round(server.rss() / MIB)
        stop = threading.Event()
        probes = {"probes": 0, "failed": 0}
        sent = {"ok": 0, "other": 0}

        def client() -> None:
            conn = server.conn(30)
            while not stop.is_set():
                status, _ = call(conn, "POST", "/mutate", review)
                sent["ok" if status == 200 else "other"] += 1
                if status == -1:
                    conn = server.conn(30)

        prober = threading.Thread(target=_probe, args=(server, stop, probes))
        clients = [threading.Thread(target=client) for _ in range(4)]
        with PeakRss(server) as rss:
            prober.start()
            for c in clients:
                c.start()
            time.sleep(seconds)
            stop.set()
            for t in [prober, *clients]:
                t.join()
        out["flood"] = {"clients": 4, "seconds": seconds, "reviews_answered_200": sent["ok"],
                        "reviews_other": sent["other"], **probes, "peak_rss_mib": round(rss.peak / MIB)}
        cap = min(Settings().max_body_bytes, PREEMPT_POD_BYTES + n_nodes * PREEMPT_NODE_BYTES
                  + n_nodes * bound_per_node * PREEMPT_VICTIM_BYTES)
        preempt = _preempt_at_cap(server, n_nodes, bound_per_node, cap)
        out["preempt_cap_bytes"] = cap
        out["preempt_bytes"] = len(preempt)
        oversized = _preempt_at_cap(server, n_nodes, bound_per_node, 30 * MIB)
        for name, path, body, n in [("mutate_one", "/mutate", review, 1), ("mutate_two", "/mutate", review, 2),
                                    ("preempt_one", f"{PREFIX}/preempt", preempt, 1),
                                    ("preempt_two", f"{PREFIX}/preempt", preempt, 2),
                                    ("preempt_30MiB_one", f"{PREFIX}/preempt", oversized, 1),
                                    ("preempt_30MiB_two", f"{PREFIX}/preempt", oversized, 2)]:
            base, peak, statuses = _at_once(server, path, [body] * n)
            out[name] = {"body_mib": round(len(body) / MIB, 2), "statuses": statuses,
                         "rss_before_mib": round(base / MIB), "peak_rss_mib": round(peak / MIB),
                         "added_mib": round((peak - base) / MIB)}
    return out


# ---- how long a read path holds up a verb ----------------------------------------------------------------

def block(n_nodes: int, rounds: int = 5) -> dict[str, Any]:
    names = [f"gpu-node-{k:05d}" for k in range(n_nodes)]
    pod = _pod(3, 8192)
    del pod["kind"]
    filt = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    preempt_pod = _pod(4, 40000)
    del preempt_pod["kind"]
    preempt = json.dumps({"Pod": preempt_pod, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": f"00000000-0000-4000-8000-{100_000 + k * 4 + i:012d}"} for i in range(4)],
            "NumPDBViolations": 0} for k, n in enumerate(names)}}).encode()
    out: dict[str, Any] = {"nodes": n_nodes, "filter_names": n_nodes}
    with Server(n_nodes, 4) as server:
        conn = server.conn(60)
        for _ in range(20):
            call(conn, "POST", f"{PREFIX}/filter", filt)
        alone = []
        for _ in range(200):
            t0 = time.perf_counter()
            assert call(conn, "POST", f"{PREFIX}/filter", filt)[0] == 200
            alone.append(time.perf_counter() - t0)
        alone.sort()
        median = alone[len(alone) // 2]
        out["filter_alone_ms"] = {"p50": round(median * 1000, 2), "max": round(alone[-1] * 1000, 2)}
        for name, method, path, body in [("GET /", "GET", "/", None), ("GET /state", "GET", "/state", None),
                                         ("preempt", "POST", f"{PREFIX}/preempt", preempt)]:
            worst: list[float] = []
            read_s: list[float] = []
            for _ in range(rounds):
                done = threading.Event()
                took: list[float] = []

                def read(method: str = method, path: str = path, body: bytes | None = body,
                         took: list[float] = took, done: threading.Event = done) -> None:
                    c = server.conn(120)
                    t0 = time.perf_counter()
                    status, _ = call(c, method, path, body)
                    took.append(time.perf_counter() - t0)
                    assert status == 200, (path, status)
                    c.close()
                    done.set()

                reader = threading.Thread(target=read)
                reader.start()
                lat = []
                while not done.is_set():
                    t0 = time.perf_counter()
                    call(conn, "POST", f"{PREFIX}/filter", filt)
                    lat.append(time.perf_counter() - t0)
                reader.join()
                worst.append(max(lat) if lat else 0.0)
                read_s.append(took[0])
            out[name] = {"read_s": round(max(read_s), 3), "filter_worst_ms": round(max(worst) * 1000, 1),
                         "blocked_ms": round((max(worst) - median) * 1000, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=30000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--studies", default="fuzz,flood,block")
    ap.add_argument("--out", default="benchmarks/results/bounded_cost.json")
    args = ap.parse_args(argv)
    studies = args.studies.split(",")
    command = "python -m benchmarks.bench_bounded_cost " + " ".join(argv or sys.argv[1:])
    out = Path(args.out)
    # One file for the three studies: a run of some of them replaces those and keeps the others.
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    result.pop("command", None)
    runs = {"fuzz": lambda: fuzz(args.requests), "flood": lambda: flood(args.nodes, args.seconds),
            "block": lambda: block(args.nodes)}
    for name in ("fuzz", "flood", "block"):
        if name in studies:
            result[name] = {"command": command, **runs[name]()}
            print(json.dumps(result[name], indent=1), flush=True)
    save_json(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
