"""Speed of the extender over loopback, driven like kube-scheduler drives it.

A cluster of N nodes x 8 GPUs in mixed modes (MIG layouts, MPS, time-slicing, exclusive) is served by
`vramfit serve --snapshot` code (uvicorn, in a separate process so the client does not share its GIL).
Each cycle is one pod: filter with every node name (nodeCacheCapable: true), prioritize with the nodes that
passed, bind to the best-scored one, each over HTTP/1.1 keep-alive (stdlib http.client). Then the same with full Node
objects (nodeCacheCapable: false) on a smaller cluster.

    .venv/bin/python -m benchmarks.bench_extender                    # 5,000 nodes, 2,000 cycles; 500 for Nodes
    .venv/bin/python -m benchmarks.bench_extender --nodes 500 --cycles 200 --no-write   # quick look
    .venv/bin/python -m benchmarks.bench_extender --plan --cycles 300 --warmup 50 --repeat 3   # planning off/on

--plan: the same NodeNames run on one policy, with `--pending` pods (the cycle's first pods after the
warm-up) pending in the server's queue: planning off, then planning on once per `--plan-workers` entry (the
solve in the planner's worker process, or in a thread of the server; the planner started and its first plan
published before the run; prioritize and bind follow it). Figures to extender_plan.md/.json.

Figures go to stdout and to benchmarks/results/extender.md and .json. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import math
import multiprocessing as mp
import os
import platform
import random
import re
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.floor_extender import serve_local as serve_floor

try:  # the lean client decodes as fast as Python can; the stdlib is the fallback
    import orjson

    _loads: Any = orjson.loads
    _dumps: Any = orjson.dumps
except ImportError:  # pragma: no cover
    _loads = json.loads

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

RESULTS = Path(__file__).resolve().parent / "results"
FLOOR = "floor"  # the do-nothing extender (benchmarks/floor_extender.py), run after each policy arm
PREFIX = "/vramfit"
TARGETS = {"filter_p99_ms": 5.0, "prioritize_p99_ms": 5.0, "cycles_per_s": 500.0}
FP = "filter+prioritize"  # a cycle's two scoring calls summed (issue 13's "filter + prioritize p99")
# --plan, issue 13's "no worse than without": planning on may cost at most this share of the off runs' median
# p99 (the upper end of the 95 % interval of the paired difference must stay below it); a slowdown above it
# is what "worse" means here, below it the rounds cannot tell the two apart on a shared box.
NO_WORSE_SHARE = 0.05


# ---- the cluster, as API JSON ------------------------------------------------------------------------

def _gpu(i: int, kind: str) -> dict[str, Any]:
    h100 = "NVIDIA-H100-80GB-HBM3"
    if kind == "mig-balanced":
        return {"index": i, "product": h100, "mode": "mig", "mig": [
            {"profile": "1g.10gb", "start": 0}, {"profile": "1g.10gb", "start": 1},
            {"profile": "2g.20gb", "start": 2}, {"profile": "3g.40gb", "start": 4}]}
    if kind == "mig-halves":
        return {"index": i, "product": h100, "mode": "mig",
                "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}
    if kind == "mps":
        return {"index": i, "product": h100, "mode": "mps", "replicas": 4}
    if kind == "timeslice":
        return {"index": i, "product": "NVIDIA-L40S", "mode": "timeslice", "replicas": 4}
    return {"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"}


NODE_KINDS = [
    ["mig-balanced"] * 4 + ["mig-halves"] * 4,
    ["mps"] * 8,
    ["timeslice"] * 8,
    ["exclusive"] * 8,
    ["mig-balanced", "mig-halves", "mps", "mps", "timeslice", "timeslice", "exclusive", "exclusive"],
]


def make_node(k: int) -> dict[str, Any]:
    name = f"gpu-node-{k:05d}"
    gpus = [_gpu(i, kind) for i, kind in enumerate(NODE_KINDS[k % len(NODE_KINDS)])]
    return {
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-uid-{k:05d}", "resourceVersion": str(1000 + k),
                     "creationTimestamp": "2026-05-04T09:12:31Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"},
                     "annotations": {"vramfit.io/gpus": json.dumps(gpus, separators=(",", ":")),
                                     "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": f"10.{k // 250}.{k % 250}.0/24", "providerID": f"aws:///us-east-1a/i-{k:017x}"},
        "status": {
            "capacity": {"cpu": "192", "memory": "2113598232Ki", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "191450m", "memory": "2098123544Ki", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-05-04T10:01:07Z",
                            "lastTransitionTime": "2026-05-04T09:13:02Z", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{k // 250}.{k % 250}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{k:032x}", "systemUUID": f"{k:032x}", "bootID": f"{k:032x}",
                         "kernelVersion": "6.1.112", "osImage": "Amazon Linux 2023", "containerRuntimeVersion":
                         "containerd://1.7.23", "kubeletVersion": "v1.31.2", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


VRAM_MIX = [4096, 8192, 8192, 14336, 14336, 20000, 30720, 38000]
ISOLATION_MIX = ["none", "none", "process", "hardware"]


# The bench pods' namespace: its admins let its pods name the three tenants they spread over (issue 26's tenancy).
BENCH_NAMESPACE: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Namespace",
    "metadata": {"name": "bench", "annotations": {"vramfit.io/allowed-tenants": "team-0,team-1,team-2"}}}


def make_pod(j: int, rng: random.Random) -> dict[str, Any]:
    """A pending pod as the scheduler's informer cache holds it (no kind/apiVersion)."""
    name = f"bench-{j:06d}"
    vram = rng.choice(VRAM_MIX)
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"00000000-0000-4000-8000-{j:012d}",
                     "resourceVersion": str(50_000 + j), "creationTimestamp": "2026-05-04T10:02:11Z",
                     "labels": {"app": "bench", "vramfit.io/tenant": f"team-{j % 3}"},
                     "annotations": {"vramfit.io/isolation": rng.choice(ISOLATION_MIX)}},
        "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.3",
                                 "resources": {"requests": {"cpu": "2", "memory": "8Gi", "vramfit.io/vram": str(vram)},
                                               "limits": {"memory": "8Gi", "vramfit.io/vram": str(vram)}},
                                 "terminationMessagePath": "/dev/termination-log",
                                 "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
                 "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                 "serviceAccountName": "default", "schedulerName": "vramfit-scheduler", "priority": 0,
                 "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


# ---- the server, in its own process ------------------------------------------------------------------

def _serve(n_nodes: int, policy: str, port_q: Any, stop_ev: Any, queue: list[dict[str, Any]] | None = None,
           planning: bool = False, plan_worker: str = "process", repack: bool = False,
           plan_cpus: tuple[int, list[int]] | None = None, shortlist: int | None = None) -> None:
    """`plan_cpus`: (config plan_cpus, every CPU the bench may use) with --plan-cpus: this process started on the
    CPUs the worker leaves (the bench's own); a planning-on server takes them all back first, for its planner
    to split them as `vramfit serve` does. `shortlist`: config shortlist_k (None: the key left unset)."""
    from benchmarks.local_server import LocalServer
    from extender.app import create_app, uvicorn_options
    from extender.binder import MemoryBinder
    from extender.cli import freeze_heap
    from extender.config import Settings
    from extender.store import Store
    from packing.catalog import load_catalog

    if plan_cpus is not None and planning:
        os.sched_setaffinity(0, plan_cpus[1])
    t0 = time.perf_counter()
    store = Store.from_objects([make_node(k) for k in range(n_nodes)] + list(queue or []) + [BENCH_NAMESPACE],
                               load_catalog())
    build_s = time.perf_counter() - t0
    extra: dict[str, Any] = ({} if queue is None else {"planning": planning, "plan_repack": repack,
                                                       "plan_cpus": plan_cpus[0] if plan_cpus else 0})
    if shortlist is not None:
        extra["shortlist_k"] = shortlist
    settings = Settings(url_prefix=PREFIX, policy=policy, **extra)
    app = create_app(settings, store, MemoryBinder())
    planner = app.state.services.planner
    first_plan: dict[str, Any] = {}
    freeze_heap()  # as `vramfit serve` does once the view is built, before it starts the planner
    if planner is not None:
        # "once": the worker process, stopped after its first plan (which stays published): the cost of
        # following a plan in the verbs, without the cost of making more.
        planner.worker = "process" if plan_worker == "once" else plan_worker  # read by the first round
        planner.after_full_copy = freeze_heap  # as `vramfit serve` sets it
        t0 = time.perf_counter()
        planner.start()  # as `vramfit serve` does
        deadline = time.monotonic() + 600
        while planner.plan is None and time.monotonic() < deadline:
            time.sleep(0.1)
        # The first round copies the whole state to the planner (in pieces): its longest hold of the lock.
        first_plan = {"first_plan_s": round(time.perf_counter() - t0, 2),
                      "first_sync_hold_max_ms": round(1000 * planner.sync_hold_max_s, 2),
                      "worker_pid": planner.worker_pid}
        planner.sync_hold_max_s = 0.0  # from here on: the holds of the rounds during the run
        if plan_worker == "once":
            planner.stop()
    with LocalServer(app, **uvicorn_options()) as server:  # the listener settings `vramfit serve` uses
        port_q.put((server.port, build_s, first_plan))
        stop_ev.wait(3600)
    if planner is not None:
        planner.stop()


class ServerProcess:
    """The extender serving `n_nodes` bench nodes with `policy`, or the do-nothing floor (policy FLOOR, which
    keeps no state: it answers for whatever names it is sent), in a process of its own."""

    def __init__(self, n_nodes: int, policy: str, queue: list[dict[str, Any]] | None = None,
                 planning: bool = False, plan_worker: str = "process", repack: bool = False,
                 plan_cpus: tuple[int, list[int]] | None = None, shortlist: int | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.q = ctx.Queue()
        self.stop = ctx.Event()
        # Not daemonic: a daemonic process may not start children, and the planner's worker is one.
        if policy == FLOOR:
            self.proc = ctx.Process(target=serve_floor, args=(self.q, self.stop))
        else:
            self.proc = ctx.Process(target=_serve, args=(n_nodes, policy, self.q, self.stop, queue, planning,
                                                         plan_worker, repack, plan_cpus, shortlist))

    def __enter__(self) -> ServerProcess:
        self.proc.start()
        self.port, self.build_s, self.first_plan = self.q.get(timeout=600)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


class Hog:
    """`--plan-workers hog`: a stand-in for the planner's worker on its CPUs, for the length of one run. It streams
    through 64 MB (beyond the cache, like a solve's working set) for 0.25 s of every second, about the share of
    each second the worker solves on the bench's full queue. No CPUs: nothing is started."""

    def __init__(self, cpus: frozenset[int]) -> None:
        self.cpus = cpus
        self.proc: Any = None

    def __enter__(self) -> Hog:
        if self.cpus:
            ctx = mp.get_context("spawn")
            self.stop, ready = ctx.Event(), ctx.Event()
            self.proc = ctx.Process(target=_hog, args=(sorted(self.cpus), self.stop, ready), daemon=True)
            self.proc.start()
            ready.wait(60)  # its start-up (spawn, numpy) runs on the bench's CPUs: not inside the timed calls
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop.set()
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.terminate()


def _hog(cpus: list[int], stop: Any, ready: Any) -> None:
    import numpy as np

    os.sched_setaffinity(0, set(cpus))
    a = np.random.default_rng(0).random(8_000_000)
    ready.set()
    while not stop.is_set():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.25:
            a *= 1.0000001
        stop.wait(0.75)


# ---- the driver ----------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class _Client:
    """A lean client, since it shares the two CPUs with the server: HTTP/1.1 keep-alive POSTs with the stdlib
    client (httpx adds ~2 ms a call on a 2-CPU box), request bodies pre-encoded outside the timed call
    (kube-scheduler marshals in Go), responses decoded with orjson inside it. Each timed call covers sending
    the request, the server's work, reading the whole response and decoding it; the decode and the
    extender's own time (its `Server-Timing` header) are recorded separately."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's net/http does

    def post(self, path: str, body: bytes) -> tuple[Any, float, float, float]:
        """-> (decoded answer, wall s, decode s, in-server s)."""
        t0 = time.perf_counter()
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        t1 = time.perf_counter()
        out = _loads(data)
        t2 = time.perf_counter()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:200]!r}")
        timing = re.search(r"dur=([0-9.]+)", resp.getheader("server-timing") or "")
        return out, t2 - t0, t2 - t1, float(timing.group(1)) / 1000 if timing else float("nan")

    def server_means_ms(self) -> dict[str, float]:
        """Mean time inside the extender per verb (its own latency histogram), without HTTP and client."""
        self.conn.request("GET", "/metrics")
        text = self.conn.getresponse().read().decode()
        out = {}
        for verb in ("filter", "prioritize", "bind"):
            total = re.search(rf'vramfit_request_duration_seconds_sum{{verb="{verb}"}} (\S+)', text)
            count = re.search(rf'vramfit_request_duration_seconds_count{{verb="{verb}"}} (\S+)', text)
            if total and count and float(count.group(1)):
                out[verb] = round(float(total.group(1)) / float(count.group(1)) * 1000, 3)
        return out

    def close(self) -> None:
        self.conn.close()


def _stats(seconds: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in seconds]
    return {"p50_ms": round(_pct(ms, 50), 3), "p99_ms": round(_pct(ms, 99), 3),
            "mean_ms": round(statistics.fmean(ms), 3) if ms else None, "max_ms": round(max(ms), 3) if ms else None}


def _args_body(pod_json: bytes, items: list[dict[str, Any]] | None, names_json: bytes) -> bytes:
    """ExtenderArgs as kube-scheduler sends them: the Node objects (nodeCacheCapable: false) or their names."""
    if items is not None:
        return b'{"Pod":' + pod_json + b',"Nodes":' + _dumps({"metadata": {}, "items": items}) + b',"NodeNames":null}'
    return b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}"


def top_of(scores: list[dict[str, Any]]) -> tuple[str, int]:
    """The host a HostPriorityList ranks first, and how many hosts share its score. Ties go to the first name in
    sorted order: kube-scheduler picks among ties at random, a fixed rule lets two runs be compared cycle by cycle."""
    high = max(s["Score"] for s in scores)
    tied = [s["Host"] for s in scores if s["Score"] == high]
    return min(tied), len(tied)


def _verb_figures(lat: dict[str, list[float]], dec: dict[str, list[float]],
                  srv: dict[str, list[float]]) -> dict[str, Any]:
    """Per verb: wall, round trip (wall less the client's decode), the decode, in-server (seconds in, ms out)."""
    return {verb: {"n": len(walls), **_stats(walls),
                   "round_trip": _stats([w - d for w, d in zip(walls, dec[verb], strict=True)]),
                   "client_decode": _stats(dec[verb]), "in_server": _stats(srv[verb])} for verb, walls in lat.items()}


def run_cycles(url: str, nodes: list[dict[str, Any]], cycles: int, warmup: int, full_nodes: bool,
               seed: int, samples: dict[str, list[float]] | None = None,
               refill: list[dict[str, Any]] | None = None, check: bool = False) -> dict[str, Any]:
    """`samples`: where to add each verb's raw wall times (seconds) too (--plan pools them over rounds).
    `refill`: pods to add to the server's queue (POST /queue, untimed), one after each timed cycle, so the queue
    stays as long as it started (--plan --refill: the pod `pending` cycles ahead joins as one is bound).
    `check`: after each cycle's prioritize, ask prioritize again about every node (untimed), on the same state: its
    top (`check_tops`) is the node the extender would rank first had filter passed every node the pod fits."""
    rng = random.Random(seed)
    names = [n["metadata"]["name"] for n in nodes]
    items = [{k: v for k, v in n.items() if k != "kind"} for n in nodes]
    by_name = dict(zip(names, items, strict=True))
    names_json = _dumps(names)  # kube-scheduler sends the same list every cycle
    verbs = ("filter", "prioritize", "bind")
    lat: dict[str, list[float]] = {v: [] for v in verbs}
    dec: dict[str, list[float]] = {v: [] for v in verbs}
    srv: dict[str, list[float]] = {v: [] for v in verbs}
    outcomes = {"bound": 0, "unschedulable": 0, "bind_error": 0}
    cycle_fp: list[float] = []  # filter + prioritize of one pod: the extender's share of a scheduling cycle
    tops: list[str | None] = []  # per cycle, warm-up included (it shapes the state): the host prioritize ranks first
    top_ties: list[int] = []  # how many hosts share that host's score
    check_tops: list[str | None] = []
    check_ties: list[int] = []
    untimed = 0.0  # the client's pick of that host (kube-scheduler's selectHost, in Go), the checks: not in cycles/s
    client = _Client(url)
    refill_bodies = [_dumps({"kind": "Pod", **p}) for p in refill or []]  # encoded outside the timed calls

    def call(verb: str, body: bytes) -> Any:
        out, wall, decode, server = client.post(f"{PREFIX}/{verb}", body)
        lat[verb].append(wall)
        dec[verb].append(decode)
        srv[verb].append(server)
        return out

    gc.collect()
    gc.freeze()  # the client's own collector pauses would land in the timed calls
    try:
        start = 0.0
        for j in range(warmup + cycles):
            if j == warmup:
                start = time.perf_counter()
                for d in (lat, dec, srv):
                    for v in d.values():
                        v.clear()
                cycle_fp.clear()
                outcomes = dict.fromkeys(outcomes, 0)
                untimed = 0.0
            p = make_pod(j, rng)
            pod_json = _dumps(p)
            res = call("filter", _args_body(pod_json, items if full_nodes else None, names_json))
            passed = ([n["metadata"]["name"] for n in res["Nodes"]["items"]] if full_nodes else res["NodeNames"])
            if not passed:
                outcomes["unschedulable"] += 1
                tops.append(None)
                top_ties.append(0)
                check_tops.append(None)
                check_ties.append(0)
                continue
            # As kube-scheduler does: prioritize is asked about the nodes filter passed, no others.
            scores = call("prioritize", _args_body(pod_json, [by_name[n] for n in passed] if full_nodes else None,
                                                   _dumps(passed)))
            cycle_fp.append(lat["filter"][-1] + lat["prioritize"][-1])
            t_pick = time.perf_counter()
            best, ties = top_of(scores)
            if check:
                every, _, _, _ = client.post(f"{PREFIX}/prioritize", _args_body(pod_json, items if full_nodes else None,
                                                                                 names_json))
                check_top, check_tie = top_of(every)
                check_tops.append(check_top)
                check_ties.append(check_tie)
            untimed += time.perf_counter() - t_pick
            tops.append(best)
            top_ties.append(ties)
            meta = p["metadata"]
            bound = call("bind", _dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                         "PodUID": meta["uid"], "Node": best}))
            outcomes["bound" if bound["Error"] == "" else "bind_error"] += 1
            if warmup <= j < warmup + len(refill_bodies):
                client.post("/queue", refill_bodies[j - warmup])  # as a watch event would add it: not timed
        elapsed = time.perf_counter() - start - untimed
        server_ms = client.server_means_ms()  # includes warm-up calls
    finally:
        client.close()
        gc.unfreeze()
    out: dict[str, Any] = {"cycles": cycles, "elapsed_s": round(elapsed, 3),
                           "cycles_per_s": round(cycles / elapsed, 1), "ms_per_cycle": round(1000 * elapsed / cycles, 3),
                           "outcomes": outcomes, "client_untimed_mean_ms": round(1000 * untimed / cycles, 3),
                           "server_mean_ms": server_ms}
    out.update(_verb_figures(lat, dec, srv))
    out[FP] = {"n": len(cycle_fp), **_stats(cycle_fp)}
    out["warmup"] = warmup
    out["tops"] = tops
    out["top_ties"] = top_ties
    if check:
        out["check_tops"] = check_tops
        out["check_ties"] = check_ties
    if samples is not None:
        for verb, walls in [*lat.items(), (FP, cycle_fp)]:
            samples.setdefault(verb, []).extend(walls)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="5000",
                    help="cluster sizes, comma-separated (e.g. 5000,10000): every arm runs at each (default 5000)")
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--full-nodes", type=int, default=500, help="cluster size for the full-Nodes run (0 = skip)")
    ap.add_argument("--full-cycles", type=int, default=500)
    ap.add_argument("--policy", default="vramfit,first-fit",
                    help="comma-separated policies; each gets a NodeNames run, the first also the full-Nodes run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    ap.add_argument("--out-stem", default=None,
                    help="results file name without extension (default extender, with --plan extender_plan)")
    ap.add_argument("--shortlist", type=int, default=None, metavar="K",
                    help="also run each policy with config shortlist_k: K (filter passes the K best nodes the pod "
                         "fits), and compare the node prioritize ranks first in every cycle with the run without it")
    ap.add_argument("--plan", action="store_true", help="queue planning off vs on with --pending pods queued")
    ap.add_argument("--pending", type=int, default=200, help="pods pending in the queue for --plan (default 200)")
    ap.add_argument("--plan-workers", default="process,thread",
                    help="--plan: where the solve runs in the planning-on runs, in order: process, thread, or once "
                         "(the process, stopped after the first plan); +repack (e.g. process+repack) sets "
                         "plan_repack, so the plan books units for every queued pod and prioritize and bind follow "
                         "it (without it the plan books only pods the online policy would leave out: none on an "
                         "roomy cluster) (default process,thread); hog: planning off, with a stand-in for the "
                         "worker on the worker's CPUs (--plan-cpus): a process streaming through 64 MB a quarter of "
                         "each second, to tell what the worker's mere presence on the other core costs the verbs")
    ap.add_argument("--repeat", type=int, default=1, help="--plan: rounds of off and each worker (default 1)")
    ap.add_argument("--refill", action="store_true",
                    help="--plan: keep --pending pods queued all through the timed cycles (after each one, the pod "
                         "--pending cycles ahead joins the queue, as a watch event would add it), so the planner "
                         "re-plans a full queue the whole run (default: the queue drains as its pods are bound)")
    ap.add_argument("--plan-cpus", type=int, default=0,
                    help="--plan: CPUs the planner's worker gets to itself (config plan_cpus: the highest-numbered); "
                         "the client and the servers, planning off too, run on the others (default 0: no pinning)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = "python -m benchmarks.bench_extender " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        sizes = node_sizes(args.nodes)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    if args.plan:
        if len(sizes) != 1:
            print(f"--plan runs one cluster size, got --nodes {args.nodes}", file=sys.stderr)
            return 2
        args.nodes = sizes[0]
        return main_plan(args, command)
    return main_floor(args, sizes, command)


def main_floor(args: argparse.Namespace, sizes: list[int], command: str) -> int:
    """Each policy (and with --shortlist each policy shortlisted) at each size, each followed by the floor."""
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    problem = shortlist_problem(args.shortlist) or (
        f"--policy: {FLOOR!r} is the floor every policy is run beside, not a policy" if FLOOR in policies else None)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "command": command.strip(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "policy": policies[0], "nodes": sizes, "shortlist": args.shortlist, "targets": TARGETS, "runs": [],
    }
    # With --shortlist: each policy with the shortlist off (0), then on (K); without: the server's default config.
    report["checks"] = []
    for n in sizes:
        size_runs(report, "node_names", [make_node(k) for k in range(n)], policies, args.shortlist, args.cycles,
                  args.warmup, args.seed)
    if args.full_nodes:
        size_runs(report, "full_nodes", [make_node(k) for k in range(args.full_nodes)], policies[:1], args.shortlist,
                  args.full_cycles, args.warmup // 2, args.seed)
    report["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    for run in report["runs"]:
        if run["kind"] == "node_names" and run["policy"] != FLOOR:
            run["targets_met"] = {
                "filter_p99": run["filter"]["p99_ms"] <= TARGETS["filter_p99_ms"],
                "prioritize_p99": run["prioritize"]["p99_ms"] <= TARGETS["prioritize_p99_ms"],
                "cycles_per_s": run["cycles_per_s"] >= TARGETS["cycles_per_s"],
            }
    report["placement"] = placement_checks(report["runs"], report["checks"])
    report["slope"] = slopes(report["runs"])
    text = render(report)
    print(text)
    if not args.no_write:
        stem = args.out_stem or "extender"
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / f"{stem}.md").write_text(text + "\n")
    return 0


def node_sizes(text: str) -> list[int]:
    """--nodes: one cluster size or several, comma-separated; ValueError naming the flag otherwise."""
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--nodes {text!r}: one node count or several, comma-separated (e.g. 5000,10000), each >= 1")
    return sizes


def shortlist_problem(k: int | None) -> str | None:
    """Why --shortlist K cannot be run (a line for the user), or None."""
    if k is None:
        return None
    if k < 1:
        return f"--shortlist {k}: K is the number of nodes filter passes, at least 1"
    if default_shortlist() is None:
        return ("--shortlist: this extender has no config key shortlist_k (extender/config.py Settings), so there "
                "is no shortlist to measure; run without --shortlist")
    return None


def default_shortlist() -> int | None:
    """The extender's shortlist_k when the config leaves it unset (None: this extender has no such key)."""
    from extender.config import Settings

    field = Settings.model_fields.get("shortlist_k")
    return None if field is None else int(field.default)


def arm_label(policy: str, shortlist: int | None) -> str:
    return f"{policy} shortlist {shortlist}" if shortlist else policy


def size_runs(report: dict[str, Any], kind: str, nodes: list[dict[str, Any]], policies: list[str],
              shortlist: int | None, cycles: int, warmup: int, seed: int) -> None:
    """At one cluster size: each policy, then the floor (with a shortlist: each policy with it off, then on),
    into report["runs"]; with a shortlist, then each policy's placement check run into report["checks"]."""
    for policy in policies:
        for k in [None] if shortlist is None else [0, shortlist]:
            report["runs"] += arm_and_floor(kind, nodes, policy, k, cycles, warmup, seed)
    for policy in policies if shortlist else []:
        run = timed_run(kind, nodes, policy, shortlist, cycles, warmup, seed, check=True)
        report["checks"].append({key: run[key] for key in ("kind", "policy", "shortlist", "arm", "nodes", "cycles",
                                                           "warmup", "outcomes", "tops", "top_ties", "check_tops",
                                                           "check_ties")})


def timed_run(kind: str, nodes: list[dict[str, Any]], policy: str, shortlist: int | None, cycles: int, warmup: int,
              seed: int, check: bool = False) -> dict[str, Any]:
    """One server (a policy, or the floor), one client, `warmup + cycles` pods: the run's figures. `shortlist`:
    config shortlist_k, None to leave it to the extender's default (the run records the value in effect)."""
    with ServerProcess(len(nodes), policy, shortlist=shortlist) as srv:
        load0 = round(os.getloadavg()[0], 2)
        run = run_cycles(srv.url, nodes, cycles, warmup, kind == "full_nodes", seed, check=check)
        build = {} if policy == FLOOR else {"state_build_s": round(srv.build_s, 2)}
    if policy != FLOOR and shortlist is None:
        shortlist = default_shortlist()
    return {"kind": kind, "policy": policy, "shortlist": shortlist, "arm": arm_label(policy, shortlist),
            "nodes": len(nodes), "gpus": 8 * len(nodes), **build,
            "loadavg_1m": [load0, round(os.getloadavg()[0], 2)], **run}


def arm_and_floor(kind: str, nodes: list[dict[str, Any]], policy: str, shortlist: int | None, cycles: int,
                  warmup: int, seed: int) -> list[dict[str, Any]]:
    """A policy's run, then the floor's right after it with the same client, names and pods; the policy's
    figures also as ratios to the floor's (`vs_floor`)."""
    arm = timed_run(kind, nodes, policy, shortlist, cycles, warmup, seed)
    floor = timed_run(kind, nodes, FLOOR, None, cycles, warmup, seed)
    floor["floor_of"] = arm["arm"]
    arm["vs_floor"] = vs_floor(arm, floor)
    return [arm, floor]


def _ratio(a: Any, b: Any) -> float | None:
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) and b != 0
    return round(a / b, 3) if ok else None


def vs_floor(arm: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """Every figure of `arm` as a ratio to the floor run's (None where either is missing)."""
    out: dict[str, Any] = {"cycles_per_s": _ratio(arm["cycles_per_s"], floor["cycles_per_s"]),
                           "ms_per_cycle": _ratio(arm["ms_per_cycle"], floor["ms_per_cycle"]),
                           "floor_ms_per_cycle": floor["ms_per_cycle"], "floor_cycles_per_s": floor["cycles_per_s"]}
    for verb in ("filter", "prioritize", "bind", FP):
        a, f = arm[verb], floor[verb]
        out[verb] = {f"{q}": _ratio(a[f"{q}_ms"], f[f"{q}_ms"]) for q in ("p50", "p99", "mean")}
        if "in_server" in a:
            out[verb].update({f"in_server_{q}": _ratio(a["in_server"][f"{q}_ms"], f["in_server"][f"{q}_ms"])
                              for q in ("p50", "p99")})
    return out


def placement_checks(runs: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each check run (shortlist on, every cycle's prioritize also asked about every node on the same state): the
    cycles whose shortlisted answer ranks another node first than the answer about every node (must be none).
    `across_runs_differ`: the same comparison between the two timed runs (off, on), which is not same-state: a
    policy whose deferred work lands by timing (extender/refresh.py) differs there even between two runs of one
    configuration, and after a first difference the two clusters drift apart."""
    timed = {(r["kind"], r["nodes"], r["policy"], bool(r["shortlist"])): r for r in runs if r["policy"] != FLOOR}
    out = []
    for c in checks:
        pairs = list(zip(c["check_tops"], c["tops"], strict=True))  # (every node, shortlisted)
        differ = [j for j, (a, b) in enumerate(pairs) if a != b]
        off, on = (timed.get((c["kind"], c["nodes"], c["policy"], flag)) for flag in (False, True))
        across = None if off is None or on is None else sum(a != b for a, b in zip(off["tops"], on["tops"], strict=True))
        out.append({"kind": c["kind"], "nodes": c["nodes"], "policy": c["policy"], "shortlist": c["shortlist"],
                    "cycles": len(pairs), "warmup": c["warmup"], "differ": len(differ),
                    "first_differences": [{"cycle": j, "without": pairs[j][0], "with": pairs[j][1]}
                                          for j in differ[:5]],
                    "tied_tops_without": sum(t > 1 for t in c["check_ties"]),
                    "tied_tops_with": sum(t > 1 for t in c["top_ties"]), "across_runs_differ": across})
    return out


def slopes(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm (NodeNames runs), cost per cycle at each cluster size beside its floor's, and how each grows from
    the smallest size to the largest (a ratio, and microseconds per node added)."""
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r["kind"] == "node_names" and r["policy"] != FLOOR:
            by_arm.setdefault(r["arm"], []).append(r)
    out = []
    for arm, rs in by_arm.items():
        rs = sorted(rs, key=lambda r: r["nodes"])
        points = [{"nodes": r["nodes"], "ms_per_cycle": r["ms_per_cycle"],
                   "floor_ms_per_cycle": r["vs_floor"]["floor_ms_per_cycle"],
                   "ratio": r["vs_floor"]["ms_per_cycle"]} for r in rs]
        entry: dict[str, Any] = {"arm": arm, "points": points}
        lo, hi = points[0], points[-1]
        if hi["nodes"] > lo["nodes"]:
            added = hi["nodes"] - lo["nodes"]
            entry["growth"] = _ratio(hi["ms_per_cycle"], lo["ms_per_cycle"])
            entry["floor_growth"] = _ratio(hi["floor_ms_per_cycle"], lo["floor_ms_per_cycle"])
            entry["us_per_node"] = round(1000 * (hi["ms_per_cycle"] - lo["ms_per_cycle"]) / added, 4)
            entry["floor_us_per_node"] = round(1000 * (hi["floor_ms_per_cycle"] - lo["floor_ms_per_cycle"]) / added, 4)
        out.append(entry)
    return out


def main_plan(args: argparse.Namespace, command: str) -> int:
    """--plan: one policy, planning off then on, the cycle's first `--pending` pods queued in the server."""
    policy = args.policy.split(",")[0].strip()
    rng = random.Random(args.seed)
    # Exactly the pods run_cycles sends, and with --refill the `pending` after them, which join the queue.
    pods = [make_pod(j, rng) for j in range(args.warmup + args.cycles + (args.pending if args.refill else 0))]
    queue = [{"kind": "Pod", **p} for p in pods[args.warmup: args.warmup + args.pending]]
    refill = pods[args.warmup + args.pending:] if args.refill else None
    report: dict[str, Any] = {
        "command": command.strip(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "policy": policy, "pending": len(queue), "refill": bool(args.refill), "targets": TARGETS, "runs": [],
    }
    nodes = [make_node(k) for k in range(args.nodes)]
    workers = [w.strip() for w in args.plan_workers.split(",") if w.strip()]
    for w in workers:
        base, _, extra = w.partition("+")
        if base not in ("process", "thread", "once", "hog") or extra not in ("", "repack") or (base == "hog" and extra):
            ap_error = f"--plan-workers: unknown entry {w!r} (process, thread or once, each optionally +repack; hog)"
            print(ap_error, file=sys.stderr)
            return 2
    plan_cpus: tuple[int, list[int]] | None = None
    mine: frozenset[int] = frozenset()
    if "hog" in workers and not args.plan_cpus:
        print("--plan-workers hog needs --plan-cpus (the stand-in runs on the worker's CPUs)", file=sys.stderr)
        return 2
    if args.plan_cpus:
        from extender.planning.cpus import allowed_cpus, split_cpus

        try:
            mine, rest = split_cpus(args.plan_cpus, allowed := allowed_cpus())
        except ValueError as err:
            print(f"--plan-cpus: {err}", file=sys.stderr)
            return 2
        # The client, and every server it starts (they inherit the mask), on the CPUs the worker leaves: the
        # planning-off runs too, so the two differ only by the planner.
        os.sched_setaffinity(0, rest)
        plan_cpus = (args.plan_cpus, sorted(allowed))
        report["plan_cpus"] = {"worker": sorted(mine), "server_and_client": sorted(rest)}
    # Rounds of off, then each worker: on a shared box the load drifts, so the kinds take turns.
    order = [(r, planning, worker) for r in range(args.repeat) for planning, worker in
             [(False, None), *((True, w) for w in workers)]]
    pooled: dict[str, dict[str, list[float]]] = {}
    for rnd, planning, worker in order:
        base, _, extra = (worker or "process").partition("+")
        hog = base == "hog"  # reported as a kind of its own beside off, paired with off as the on kinds are
        with ServerProcess(args.nodes, policy, queue, planning and not hog, base, extra == "repack",
                           plan_cpus if planning and not hog else None) as srv, Hog(mine if hog else frozenset()):
            load0 = round(os.getloadavg()[0], 2)
            run = run_cycles(srv.url, nodes, args.cycles, args.warmup, False, args.seed,
                             pooled.setdefault(_kind({"planning": planning, "plan_worker": worker}), {}), refill)
            for key in ("tops", "top_ties"):  # the placement check is the floor runs'; here they would only bloat
                run.pop(key)
            if planning and not hog:
                run["plan_metrics"] = _plan_metrics(srv.url)
                run["planner"] = {**srv.first_plan, **_planner_state(srv.url)}
            report["runs"].append({"kind": "node_names", "policy": policy, "planning": planning, "round": rnd,
                                   "plan_worker": worker, "nodes": args.nodes, "gpus": 8 * args.nodes,
                                   "state_build_s": round(srv.build_s, 2),
                                   "loadavg_1m": [load0, round(os.getloadavg()[0], 2)], **run})
    # A p99 of one round's 300 calls is its third-slowest call: the rounds pooled give one of 300 x rounds.
    report["pooled"] = {kind: {verb: {"n": len(v), **_stats(v)} for verb, v in verbs.items()}
                        for kind, verbs in pooled.items()}
    report["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    report["paired"] = paired(report["runs"])
    text = render_plan(report)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = args.out_stem or "extender_plan"
        (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / f"{stem}.md").write_text(text + "\n")
    return 0


def _plan_metrics(url: str) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("vramfit_plan_", "vramfit_queue_binds_total", "vramfit_pending_queue_pods")):
            name, _, value = line.rpartition(" ")
            if not name.startswith("vramfit_plan_status") or float(value):
                out[name] = float(value)
    return out


def _planner_state(url: str) -> dict[str, Any]:
    """The planner's counters from /state at the end of a run (its longest hold of the store's lock)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", "/state")
        plan = json.loads(conn.getresponse().read())["plan"] or {}
    finally:
        conn.close()
    return {"sync_hold_max_ms": round(1000 * float(plan.get("sync_hold_max_s", 0.0)), 2),
            "solves": plan.get("solves"), "errors": plan.get("errors")}


def median_ci(values: list[float], conf: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for a median: the order statistics whose binomial tail mass on each side is at
    most (1 - conf) / 2 (the sign test's interval), widened to the extremes when there are too few values."""
    v = sorted(values)
    n = len(v)
    tail, k, acc = (1 - conf) / 2, 0, 0.0
    while k < n:
        acc += math.comb(n, k) / 2 ** n  # P(X = k), X ~ Binomial(n, 1/2)
        if acc > tail:
            break
        k += 1
    # the k-th smallest .. k-th largest value (1-based); k = 0 (n too small for the level): min .. max
    i = min(max(k - 1, 0), (n - 1) // 2)
    return v[i], v[n - 1 - i]


def paired(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each planning-on kind against the off run of the same round: per metric (a verb's p99, or a cycle's
    filter + prioritize p99) the on-minus-off differences' median, its 95 % interval, rounds worse / better,
    and whether the interval's upper end stays below NO_WORSE_SHARE of the off runs' median."""
    off = {s.get("round", 0): s for s in runs if not s["planning"]}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in dict.fromkeys(_kind(s) for s in runs if s["planning"]):
        pairs = [(off[s.get("round", 0)], s) for s in runs if _kind(s) == kind and s.get("round", 0) in off]
        for metric in ("filter", "prioritize", FP):
            if not all(metric in a and metric in b for a, b in pairs) or not pairs:
                continue
            diffs = [b[metric]["p99_ms"] - a[metric]["p99_ms"] for a, b in pairs]
            lo, hi = median_ci(diffs)
            base = statistics.median(a[metric]["p99_ms"] for a, _ in pairs)
            out.setdefault(kind, {})[metric] = {
                "rounds": len(diffs), "worse": sum(d > 0 for d in diffs), "better": sum(d < 0 for d in diffs),
                "median_ms": round(statistics.median(diffs), 3), "ci95_ms": [round(lo, 3), round(hi, 3)],
                "off_median_p99_ms": round(base, 3), "margin_ms": round(NO_WORSE_SHARE * base, 3),
                "no_worse": hi <= NO_WORSE_SHARE * base}
    return out


def _kind(run: dict[str, Any]) -> str:
    if run.get("plan_worker") == "hog":
        return "off + hog"
    return f"on ({run.get('plan_worker') or 'process'})" if run["planning"] else "off"


def render_plan(r: dict[str, Any]) -> str:
    lines = ["# Extender speed with queue planning off vs on (issue 13)", "",
             f"Command: `{r['command']}`  ",
             f"Machine: {r['machine']['cpus']} CPUs, Python {r['machine']['python']}, {r['machine']['platform']}; "
             f"1-minute load average {r['machine']['loadavg_1m_at_start']} at start, "
             f"{r['machine']['loadavg_1m_at_end']} at end (client, server and planner share the CPUs with any "
             "other work)", "",
             f"{r['pending']} pods pending in the queue (the first {r['pending']} pods the cycles send after the "
             "warm-up" + ("; after each timed cycle the next pod joins it (POST /queue, untimed), so it stays "
                          f"{r['pending']} long" if r.get("refill") else "") + "); planning on: the planner plans the queue after every change (at most once per "
             "plan_min_interval_s, budget plan_budget_s) in its worker process (`process`) or in a thread of the "
             "server (`thread`), prioritize and bind follow the plan. Wall time as the client sees it; "
             "milliseconds." + (f" Pinned (--plan-cpus): the planner's worker on CPU {r['plan_cpus']['worker']}, the "
                                f"client and every server on {r['plan_cpus']['server_and_client']}."
                                if r.get("plan_cpus") else ""), "",
             "| round | planning | load 1m | nodes | cycles | cycles/s | filter p50 | filter p99 | prioritize p50 | "
             "prioritize p99 | bind p99 | outcomes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    kinds: dict[str, list[dict[str, Any]]] = {}
    for s in r["runs"]:
        kinds.setdefault(_kind(s), []).append(s)
        lines.append(f"| {s.get('round', 0)} | {_kind(s)} | {s['loadavg_1m'][0]}-{s['loadavg_1m'][1]} | {s['nodes']} | "
                     f"{s['cycles']} | {s['cycles_per_s']} | "
                     f"{s['filter']['p50_ms']} | {s['filter']['p99_ms']} | {s['prioritize']['p50_ms']} | "
                     f"{s['prioritize']['p99_ms']} | {s['bind']['p99_ms']} | {s['outcomes']} |")
    lines += ["", "Median over the rounds:", "", "| planning | runs | filter p50 | filter p99 | prioritize p50 | "
              "prioritize p99 | bind p99 |", "|---|---|---|---|---|---|---|"]
    for kind, runs in kinds.items():
        med = {f"{v}_{q}": round(statistics.median(s[v][f"{q}_ms"] for s in runs), 3)
               for v in ("filter", "prioritize", "bind") for q in ("p50", "p99")}
        lines.append(f"| {kind} | {len(runs)} | {med['filter_p50']} | {med['filter_p99']} | "
                     f"{med['prioritize_p50']} | {med['prioritize_p99']} | {med['bind_p99']} |")
    if r.get("pooled"):
        lines += ["", "Every round's calls pooled (p99 of all of them):", "",
                  "| planning | calls per verb | filter p50 | filter p99 | prioritize p50 | prioritize p99 | bind p99 | "
                  "prioritize max |", "|---|---|---|---|---|---|---|---|"]
        for kind, v in r["pooled"].items():
            lines.append(f"| {kind} | {v['filter']['n']} | {v['filter']['p50_ms']} | {v['filter']['p99_ms']} | "
                         f"{v['prioritize']['p50_ms']} | {v['prioritize']['p99_ms']} | {v['bind']['p99_ms']} | "
                         f"{v['prioritize']['max_ms']} |")
    if r.get("paired"):
        lines += ["", f"Paired by round (planning on minus off, p99 of the same round; {FP}: the two calls of one "
                  "cycle summed). Interval: the sign test's 95 % interval for the median difference. "
                  f"No worse: its upper end at most {NO_WORSE_SHARE:.0%} of the off runs' median p99.", "",
                  "| planning | p99 of | rounds | worse / better | median difference | 95 % interval | margin | "
                  "no worse |", "|---|---|---|---|---|---|---|---|"]
        for kind, metrics in r["paired"].items():
            for metric, d in metrics.items():
                lines.append(f"| {kind} | {metric} | {d['rounds']} | {d['worse']} / {d['better']} | "
                             f"{d['median_ms']:+.3f} | {d['ci95_ms'][0]:+.3f} .. {d['ci95_ms'][1]:+.3f} | "
                             f"{d['margin_ms']} | {'yes' if d['no_worse'] else 'not shown'} |")
    lines += ["", "The planner in each planning-on run: when its first plan was published (after the server's "
              "start), its longest hold of the store's lock during the first (full) copy and in the rounds after "
              "it, plans published, errors, and binds (warm-up included) that followed the plan / fell back / were not in "
              "it, and the pods still queued when the run ended:", ""]
    for s in r["runs"]:
        if s["planning"] and "plan_metrics" in s:
            pl, m = s.get("planner", {}), s["plan_metrics"]
            by_plan, fallback, unplanned = (m.get(f'vramfit_queue_binds_total{{via="{v}"}}', 0.0)
                                            for v in ("plan", "fallback", "unplanned"))
            lines.append(f"- round {s.get('round', 0)}, {_kind(s)}: first plan {pl.get('first_plan_s')} s; lock "
                         f"{pl.get('first_sync_hold_max_ms')} ms / {pl.get('sync_hold_max_ms')} ms; "
                         f"{pl.get('solves')} plans, {pl.get('errors')} errors; binds "
                         f"{by_plan:g} by plan / {fallback:g} fallback / {unplanned:g} unplanned; "
                         f"{m.get('vramfit_pending_queue_pods', float('nan')):g} pods queued at the end")
    return "\n".join(lines)


TITLES = {"node_names": "NodeNames (nodeCacheCapable: true)", "full_nodes": "full Nodes (nodeCacheCapable: false)"}


def render(r: dict[str, Any]) -> str:
    lines = ["# Extender speed (loopback HTTP, filter -> prioritize -> bind)", "",
             f"Command: `{r['command']}`  ", f"Machine: {r['machine']['cpus']} CPUs, Python {r['machine']['python']}, "
             f"{r['machine']['platform']}; 1-minute load average {r['machine']['loadavg_1m_at_start']} at start, "
             f"{r['machine']['loadavg_1m_at_end']} at end (client and server share the CPUs with any other work)",
             "",
             "wall: the client's timed call (send, server, read the whole answer, decode it with orjson). "
             "in-server: the extender's own time from its `Server-Timing` header (read body, decode, decide, "
             "encode). round trip: wall less the client's decode. Cycles/s count the whole loop, the client's "
             "request encoding included, its pick of the top-scored node (a scan of the answer in Python, where "
             "kube-scheduler's is in Go) left out. Prioritize is asked about the nodes filter passed, as kube-scheduler asks "
             f"it. `{FLOOR}`: the do-nothing extender (benchmarks/floor_extender.py: raw ASGI under uvicorn with "
             "`vramfit serve`'s listener settings, orjson, every node passes, every score 5), run right after each "
             "policy with the same client, nodes and pods.", ""]
    lines += render_floor(r)
    for s in r["runs"]:
        lines += _render_run(s)
    t = r["targets"]
    lines += ["## Targets (NodeNames runs, wall time as the client sees it)", "",
              f"| policy | nodes | filter p99 <= {t['filter_p99_ms']} ms | prioritize p99 <= {t['prioritize_p99_ms']} ms | "
              f">= {t['cycles_per_s']} cycles/s |", "|---|---|---|---|---|"]
    for s in r["runs"]:
        if "targets_met" in s:
            met = s["targets_met"]
            lines.append(f"| `{s.get('arm', s['policy'])}` | {s['nodes']} | " + " | ".join(
                f"{'met' if met[k] else 'MISSED'} ({v})" for k, v in (
                    ("filter_p99", s["filter"]["p99_ms"]), ("prioritize_p99", s["prioritize"]["p99_ms"]),
                    ("cycles_per_s", s["cycles_per_s"]))) + " |")
    return "\n".join(lines)


def _render_run(s: dict[str, Any]) -> list[str]:
    load = (f"; load average {s['loadavg_1m'][0]} -> {s['loadavg_1m'][1]}" if "loadavg_1m" in s else "")
    after = f" (run after `{s['floor_of']}`)" if "floor_of" in s else ""
    lines = [f"## {TITLES[s['kind']]}, `{s.get('arm', s['policy'])}`{after}: {s['nodes']} nodes x 8 GPUs "
             f"({s['gpus']} GPUs)", "",
             f"{s['cycles']} cycles in {s['elapsed_s']} s = **{s['cycles_per_s']} cycles/s**; "
             f"outcomes {s['outcomes']}" + (f"; state built in {s['state_build_s']} s" if "state_build_s" in s else "")
             + load, "",
             "| verb | n | wall p50 | wall p99 | wall mean | wall max | in-server p50 | in-server p99 | "
             "round trip p50 | round trip p99 | client decode mean |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for verb in ("filter", "prioritize", "bind"):
        v = s[verb]
        lines.append(f"| {verb} | {v['n']} | {v['p50_ms']} | {v['p99_ms']} | {v['mean_ms']} | {v['max_ms']} | "
                     f"{v['in_server']['p50_ms']} | {v['in_server']['p99_ms']} | {v['round_trip']['p50_ms']} | "
                     f"{v['round_trip']['p99_ms']} | {v['client_decode']['mean_ms']} |")
    if s["policy"] != FLOOR:
        lines += ["", f"(milliseconds; in-server means from /metrics, warm-up included: {s['server_mean_ms']})"]
    return [*lines, ""]


def _x(value: Any, ratio: Any) -> str:
    return f"{value} ({'-' if ratio is None else f'{ratio:g}x'})"


def render_floor(r: dict[str, Any]) -> list[str]:
    """The policies against the floor run after each, the slope with cluster size, the shortlist's placements,
    and issue 30's targets."""
    arms = [s for s in r["runs"] if "vs_floor" in s]
    if not arms:
        return []
    lines = ["## Against the floor", "",
             "Each figure, then its ratio to the floor run right after it (x; for cycles/s above 1 is faster than "
             "the floor, for times below 1 is). Milliseconds.", "",
             "| calls | nodes | arm | cycles/s | floor cycles/s | filter p50 | filter p99 | prioritize p50 | "
             "prioritize p99 | prioritize in-server p50 | prioritize in-server p99 | filter+prioritize p99 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in arms:
        x = s["vs_floor"]
        lines.append(
            f"| {s['kind'].replace('_', ' ')} | {s['nodes']} | `{s['arm']}` | {_x(s['cycles_per_s'], x['cycles_per_s'])} | "
            f"{x['floor_cycles_per_s']} | {_x(s['filter']['p50_ms'], x['filter']['p50'])} | "
            f"{_x(s['filter']['p99_ms'], x['filter']['p99'])} | {_x(s['prioritize']['p50_ms'], x['prioritize']['p50'])} | "
            f"{_x(s['prioritize']['p99_ms'], x['prioritize']['p99'])} | "
            f"{_x(s['prioritize']['in_server']['p50_ms'], x['prioritize']['in_server_p50'])} | "
            f"{_x(s['prioritize']['in_server']['p99_ms'], x['prioritize']['in_server_p99'])} | "
            f"{_x(s[FP]['p99_ms'], x[FP]['p99'])} |")
    lines += [""] + _render_slope(r.get("slope", [])) + _render_placement(r.get("placement", []))
    return lines + _render_issue_targets(r)


def _render_slope(slope: list[dict[str, Any]]) -> list[str]:
    if not any("growth" in e for e in slope):
        return []
    lines = ["### Cost per cycle with cluster size (NodeNames)", "",
             "Milliseconds per cycle (the whole loop) at each size, the floor's beside it; growth: largest size's "
             "cost over the smallest's; per node: microseconds a cycle costs more per node added.", "",
             "| arm | ms/cycle (floor) at each size | growth | floor growth | us per node | floor us per node |",
             "|---|---|---|---|---|---|"]
    for e in slope:
        if "growth" in e:
            pts = "; ".join(f"{p['nodes']}: {p['ms_per_cycle']} ({p['floor_ms_per_cycle']})" for p in e["points"])
            lines.append(f"| `{e['arm']}` | {pts} | {e['growth']} | {e['floor_growth']} | {e['us_per_node']} | "
                         f"{e['floor_us_per_node']} |")
    return [*lines, ""]


def _render_placement(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return []
    lines = ["### Placements with the shortlist", "",
             "A check run per policy and size, shortlist on: every cycle (warm-up included), after the timed "
             "prioritize about the nodes filter passed, an untimed prioritize about every node on the same state; "
             "the node each answer ranks first (highest score, ties to the first name; the bench binds the "
             "shortlisted one). differ: cycles where the two differ (must be 0). Tied tops: cycles where more than "
             "one node shares the top score (kube-scheduler picks among them at random). Across the timed runs: the "
             "same comparison between the timed off and on runs, not same-state (deferred policy work lands by "
             "timing, so even two runs of one configuration differ there, and drift apart after).", "",
             "| calls | nodes | policy | shortlist | cycles | differ | tied tops without / with | first differences | "
             "across the timed runs |", "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        first = "; ".join(f"cycle {d['cycle']}: {d['without']} -> {d['with']}" for d in c["first_differences"]) or "-"
        lines.append(f"| {c['kind'].replace('_', ' ')} | {c['nodes']} | `{c['policy']}` | {c['shortlist']} | "
                     f"{c['cycles']} | **{c['differ']}** | {c['tied_tops_without']} / {c['tied_tops_with']} | {first} | "
                     f"{c['across_runs_differ']} |")
    return [*lines, ""]


def issue_targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None, str]]:
    """Issue 30's targets per NodeNames arm: (arm at size, target, met or None when not measurable, figures)."""
    out: list[tuple[str, str, bool | None, str]] = []
    for s in r["runs"]:
        if s["kind"] != "node_names" or "vs_floor" not in s:
            continue
        where, x = f"`{s['arm']}` at {s['nodes']}", s["vs_floor"]["cycles_per_s"]
        if not s["shortlist"]:
            out.append((where, "cycles/s >= 0.9 x floor", None if x is None else x >= 0.9, f"{x}x"))
            p = s["prioritize"]["in_server"]
            ok = None if not all(math.isfinite(v) for v in (p["p50_ms"], p["p99_ms"])) else p["p99_ms"] <= 2 * p["p50_ms"]
            out.append((where, "prioritize in-server p99 <= 2 x p50", ok, f"{p['p99_ms']} / {p['p50_ms']} ms"))
        else:
            out.append((where, "cycles/s >= 1.5 x floor (issue: at 5,000 nodes)", None if x is None else x >= 1.5,
                        f"{x}x"))
    for c in r.get("placement", []):
        if c["kind"] == "node_names":
            out.append((f"`{c['policy']} shortlist {c['shortlist']}` at {c['nodes']}", "same placements",
                        c["differ"] == 0, f"{c['differ']} of {c['cycles']} differ"))
    for e in r.get("slope", []):
        if "growth" in e and e["growth"] is not None and e["floor_growth"] is not None:
            sizes = f"{e['points'][0]['nodes']} -> {e['points'][-1]['nodes']}"
            out.append((f"`{e['arm']}` {sizes}", "cost per cycle grows no faster than the floor's",
                        e["growth"] <= e["floor_growth"], f"{e['growth']}x vs {e['floor_growth']}x"))
    return out


def _render_issue_targets(r: dict[str, Any]) -> list[str]:
    rows = issue_targets(r)
    if not rows:
        return []
    lines = ["### Issue 30's targets (ratios from this run)", "", "| where | target | | figures |", "|---|---|---|---|"]
    for where, target, ok, figures in rows:
        lines.append(f"| {where} | {target} | {'-' if ok is None else 'met' if ok else 'MISSED'} | {figures} |")
    return [*lines, ""]


if __name__ == "__main__":
    sys.exit(main())
