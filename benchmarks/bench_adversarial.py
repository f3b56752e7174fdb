"""The extender under adversarial calls: how long a normal filter waits beside a 30 MiB call, and how much
memory hostile pods can make it hold.

    .venv/bin/python -m benchmarks.bench_adversarial                       # this tree, and d1db4df as "before"
    .venv/bin/python -m benchmarks.bench_adversarial --before-rev none --no-write   # this tree only

(a) stall: a server of N nodes (benchmarks.bench_extender's cluster, its own process) answers a normal
    filter (every node name, nodeCacheCapable) in a loop while a preempt call of ~27 MiB is in flight
    (NodeNameToMetaVictims: 1,200 victim UIDs on each node, the Meta form kube-scheduler sends); p50/p99/max
    of those filters, the preempt's own time, and the filters' baseline with nothing else in flight.
(b) memory: the server's RSS after 130 filter calls each with a distinct 16 MiB pod (a padded annotation),
    and, in-process, after 60,000 pods of distinct shapes were filtered (the default policy learns each).

The "before" figures come from the same code at `--before-rev` (git archive into a temporary directory, run
with the same interpreter). Figures go to stdout and benchmarks/results/adversarial.json and .md.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.bench_extender import _Client, make_pod

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PREFIX = "/vramfit"
ISSUE_BEFORE = {"stall_s": 19.7, "rss_130_pods_gib": 2.2, "shapes_60k_mb": 86.0}  # issue 10, as measured there

# Runs inside the tree under test (cwd and PYTHONPATH), so "before" is served by the code of before.
SERVER = r"""
import sys
from benchmarks.bench_extender import make_node
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
try:
    from benchmarks.local_server import LocalServer
except ImportError:  # before issue 12 the runner lived in the service package
    from extender.local import LocalServer
from extender.store import Store
from packing.catalog import load_catalog
try:
    from extender.app import uvicorn_options
    options = uvicorn_options()
except ImportError:  # before: uvicorn's defaults
    options = {}
import benchmarks.bench_extender as _bench  # its pods' tenants need their Namespace's leave (issue 26)
_ns = [_bench.BENCH_NAMESPACE] if hasattr(_bench, "BENCH_NAMESPACE") else []
store = Store.from_objects([make_node(k) for k in range(int(sys.argv[1]))] + _ns, load_catalog())
app = create_app(Settings(url_prefix="/vramfit"), store, MemoryBinder())
with LocalServer(app, **options) as server:
    print(server.port, flush=True)
    sys.stdin.read()
"""

SHAPES = r"""
import gc, json, random, sys
from benchmarks.bench_extender import make_node, make_pod
from extender import wire
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.store import Store
from packing.catalog import load_catalog

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

n_nodes, count = int(sys.argv[1]), int(sys.argv[2])
import benchmarks.bench_extender as _bench  # its pods' tenants need their Namespace's leave (issue 26)
_ns = [_bench.BENCH_NAMESPACE] if hasattr(_bench, "BENCH_NAMESPACE") else []
store = Store.from_objects([make_node(k) for k in range(n_nodes)] + _ns, load_catalog())
ext = create_app(Settings(url_prefix="/vramfit"), store, MemoryBinder()).state.services.extender
names = [f"gpu-node-{k:05d}" for k in range(n_nodes)]
rng = random.Random(5)
gc.collect()
before = rss_mib()
for j in range(count):
    p = make_pod(j, rng)
    for part in ("requests", "limits"):
        p["spec"]["containers"][0]["resources"][part]["vramfit.io/vram"] = str(1000 + j)  # a shape of its own
    args = wire.ExtenderArgs.model_validate({"Pod": p, "Nodes": None, "NodeNames": names})
    ext.filter(args)
    if j % 2048 == 0:
        ext.prioritize(args)  # scores: the learnt mix is built into the policy's arrays
gc.collect()
counts = getattr(ext.policy, "_counts", None)
print(json.dumps({"rss_before_mib": round(before, 1), "rss_after_mib": round(rss_mib(), 1),
                  "learnt_shapes": None if counts is None else len(counts)}))
"""


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def _stats_ms(seconds: list[float]) -> dict[str, float | int]:
    ms = [v * 1000 for v in seconds]
    return {"n": len(ms), "p50_ms": round(_pct(ms, 50), 2), "p99_ms": round(_pct(ms, 99), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


class Server:
    """The extender of one source tree in its own process (the client must not share its GIL)."""

    def __init__(self, tree: Path, n_nodes: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(n_nodes)], cwd=tree, env=_env(tree),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def rss_mib(self) -> dict[str, float]:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
                "peak_mib": round(int(fields["VmHWM"].split()[0]) / 1024, 1)}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _filter_body(j: int, names: list[str]) -> bytes:
    return orjson.dumps({"Pod": make_pod(j, random.Random(j)), "Nodes": None, "NodeNames": names})


def stall(tree: Path, n_nodes: int, victims: int, rounds: int) -> dict[str, Any]:
    """(a): filters beside an in-flight ~27 MiB preempt call."""
    names = [f"gpu-node-{k:05d}" for k in range(n_nodes)]
    big = orjson.dumps({"Pod": make_pod(0, random.Random(0)), "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": f"00000000-0000-4000-8000-{k:05d}{i:07d}"} for i in range(victims)],
            "NumPDBViolations": 0} for k, n in enumerate(names)}})
    server = Server(tree, n_nodes)
    try:
        client = _Client(server.url)
        bodies = [_filter_body(j, names) for j in range(200)]
        for b in bodies[:20]:
            client.post(f"{PREFIX}/filter", b)  # warm-up
        baseline = [client.post(f"{PREFIX}/filter", b)[1] for b in bodies]
        during: list[float] = []
        preempts: list[float] = []
        for _ in range(rounds):
            done = threading.Event()

            def preempt(done: threading.Event = done) -> None:
                other = _Client(server.url)
                try:
                    preempts.append(other.post(f"{PREFIX}/preempt", big)[1])
                finally:
                    other.close()
                    done.set()

            thread = threading.Thread(target=preempt)
            thread.start()
            j = 0
            while not done.is_set():
                during.append(client.post(f"{PREFIX}/filter", bodies[j % len(bodies)])[1])
                j += 1
            thread.join()
        client.close()
    finally:
        server.close()
    return {"nodes": n_nodes, "preempt_body_mib": round(len(big) / 2**20, 1), "victims": victims * n_nodes,
            "filter_baseline": _stats_ms(baseline), "filter_during_preempt": _stats_ms(during),
            "preempt_s": [round(s, 2) for s in preempts]}


def fat_pods(tree: Path, n_nodes: int, pods: int, pad_mib: int) -> dict[str, Any]:
    """(b1): server RSS after `pods` filter calls with a distinct pod of `pad_mib` MiB each."""
    names_json = orjson.dumps([f"gpu-node-{k:05d}" for k in range(n_nodes)])
    pad = b'"' + b"x" * (pad_mib * 2**20) + b'"'
    server = Server(tree, n_nodes)
    try:
        client = _Client(server.url)
        before = server.rss_mib()
        start = time.perf_counter()
        for j in range(pods):
            p = make_pod(j, random.Random(j))  # its own UID: a distinct pod each time
            p["metadata"]["annotations"]["pad"] = "PAD"
            pod_json = orjson.dumps(p).replace(b'"PAD"', pad)
            client.post(f"{PREFIX}/filter", b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}")
        spent = time.perf_counter() - start
        after = server.rss_mib()
        client.close()
    finally:
        server.close()
    return {"pods": pods, "pod_mib": pad_mib, "rss_before_mib": before["rss_mib"], "rss_after_mib": after["rss_mib"],
            "rss_peak_mib": after["peak_mib"], "seconds": round(spent, 1)}


def shapes(tree: Path, n_nodes: int, count: int) -> dict[str, Any]:
    """(b2): in-process RSS after `count` pods of distinct shapes were filtered."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", SHAPES, str(n_nodes), str(count)], cwd=tree, env=_env(tree),
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(pods=count, nodes=n_nodes, growth_mib=round(result["rss_after_mib"] - result["rss_before_mib"], 1),
                  seconds=round(time.perf_counter() - start, 1))
    return result


def measure(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    label = "this tree" if tree == ROOT else str(tree)
    print(f"== {label}", flush=True)
    out: dict[str, Any] = {}
    out["stall"] = stall(tree, args.nodes, args.victims, args.rounds)
    print("stall:", json.dumps(out["stall"]), flush=True)
    out["fat_pods"] = fat_pods(tree, args.nodes, args.fat_pods, args.fat_mib)
    print("fat pods:", json.dumps(out["fat_pods"]), flush=True)
    out["shapes"] = shapes(tree, args.shape_nodes, args.shapes)
    print("shapes:", json.dumps(out["shapes"]), flush=True)
    return out


def _markdown(res: dict[str, Any]) -> str:
    lines = ["# The extender under adversarial calls", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine']}", "",
             "Issue 10 measured before: a normal filter stalled 19.7 s beside one 30 MiB preempt call; "
             "RSS 2.2 GiB after 130 x 16 MiB pods; +86 MB for 60k learnt shapes.", "",
             "| | " + " | ".join(res["runs"]) + " |", "|---|" + "---|" * len(res["runs"])]

    def row(name: str, get: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(str(get(r)) for r in res["runs"].values()) + " |")

    row("filter p50 / p99 / max ms, nothing else in flight",
        lambda r: "{p50_ms} / {p99_ms} / {max_ms}".format(**r["stall"]["filter_baseline"]))
    row("filter p50 / p99 / max ms, beside the preempt call",
        lambda r: "{p50_ms} / {p99_ms} / {max_ms}".format(**r["stall"]["filter_during_preempt"]))
    row("filters answered during the preempt calls", lambda r: r["stall"]["filter_during_preempt"]["n"])
    row("preempt call, s", lambda r: ", ".join(map(str, r["stall"]["preempt_s"])))
    row("RSS after 130 x 16 MiB pods (peak), MiB", lambda r: f"{r['fat_pods']['rss_after_mib']} "
                                                            f"({r['fat_pods']['rss_peak_mib']})")
    row("RSS growth over 60k distinct shapes, MiB", lambda r: r["shapes"]["growth_mib"])
    row("learnt shapes kept", lambda r: r["shapes"]["learnt_shapes"])
    s = next(iter(res["runs"].values()))["stall"]
    lines += ["", f"Stall set-up: {s['nodes']} nodes, preempt body {s['preempt_body_mib']} MiB "
                  f"({s['victims']} victim UIDs, Meta form); filters of every node name in a loop on one "
                  "keep-alive connection while the preempt call is in flight on another.", "",
              "After: the preempt call is decoded and answered in a worker thread (bodies over 256 KiB), its "
              "victims checked node by node with the store's lock taken per node, no cyclic GC meanwhile, "
              "and its answer encoded node by node. What is left beside it is the interpreter lock: a "
              "filter waits up to one switch interval (5 ms, the p50) behind the worker, and once for the "
              "single ~0.2 s parse of the 27 MiB body (the max). The pod-demand cache is keyed by UID + "
              "resourceVersion within a 64 MiB budget of the objects' sizes; the learnt shape counts keep "
              "at most 2 x 4,096 shapes; per-node reasons are cached for 16,384 (shape, node) pairs.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--victims", type=int, default=1200, help="victim UIDs per node in the preempt call")
    ap.add_argument("--rounds", type=int, default=3, help="preempt calls, one after another")
    ap.add_argument("--fat-pods", type=int, default=130)
    ap.add_argument("--fat-mib", type=int, default=16)
    ap.add_argument("--shapes", type=int, default=60_000)
    ap.add_argument("--shape-nodes", type=int, default=50)
    ap.add_argument("--before-rev", default="d1db4df", help="git revision measured as 'before'; 'none' to skip")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vramfit-before-") as tmp:
        if args.before_rev != "none":
            archive = subprocess.run(["git", "archive", args.before_rev], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            runs[f"before ({args.before_rev})"] = measure(Path(tmp), args)
        runs["after"] = measure(ROOT, args)
    res = {"command": " ".join(["python -m benchmarks.bench_adversarial", *(argv if argv is not None else sys.argv[1:])]),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
           "issue_before": ISSUE_BEFORE, "runs": runs}
    print(_markdown(res))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "adversarial.json").write_text(json.dumps(res, indent=2) + "\n")
        (RESULTS / "adversarial.md").write_text(_markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
