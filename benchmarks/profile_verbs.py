"""Where filter and prioritize spend their time, in-process: the bench's cluster and pod mix, no HTTP.

The app is built as `benchmarks.bench_extender` builds it (snapshot store, `create_app`, memory binder); each
cycle decodes and answers filter, prioritize (with the names filter passed) and bind (to the best-scored node)
through the app's own verb handlers. Per-call times of the three verbs are kept (p50/p99/max; bind is timed, not
profiled), with their sum per cycle (the server's share of a cycle, less HTTP and the refresher), and the
calls over a threshold are named with what the policy did inside them (LP solve, mix rebuild), so a spike can be
told from its trigger. With --profile, cProfile runs over the timed cycles and its top entries are printed.

    .venv/bin/python -m benchmarks.profile_verbs --nodes 5000 --cycles 300 --warmup 50 --profile

Not a test: nothing is asserted. The figures of record are in benchmarks/results/request_path.md.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from benchmarks.bench_extender import BENCH_NAMESPACE, PREFIX, make_node, make_pod
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.store import Store
from packing.catalog import load_catalog
from packing.policies import frag_aware, frag_dual, mix


class Triggers:
    """Counts of the heavy steps the policy may take inside a call (wrapped, so any caller is counted)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def counted(*a: Any, **k: Any) -> Any:
            self.counts[label] = self.counts.get(label, 0) + 1
            return original(*a, **k)

        setattr(owner, attr, counted)
        self._undo.append(lambda: setattr(owner, attr, original))

    def take(self) -> dict[str, int]:
        out, self.counts = self.counts, {}
        return out

    def undo(self) -> None:
        for f in reversed(self._undo):
            f()


@contextmanager
def triggers() -> Iterator[Triggers]:
    t = Triggers()
    t.wrap(frag_dual, "solve_duals", "lp_solve")
    t.wrap(mix.MixArrays, "build", "mix_build")
    t.wrap(frag_aware, "top_mix", "top_mix")
    try:
        yield t
    finally:
        t.undo()


def build(n_nodes: int, policy: str, shortlist_k: int | None = None) -> Any:
    """The bench's app; `shortlist_k`: the config key (None: its default)."""
    store = Store.from_objects([make_node(k) for k in range(n_nodes)] + [BENCH_NAMESPACE], load_catalog())
    extra = {} if shortlist_k is None else {"shortlist_k": shortlist_k}
    app = create_app(Settings(url_prefix=PREFIX, policy=policy, **extra), store, MemoryBinder())
    return app


def _pct(ms: list[float], q: float) -> float:
    s = sorted(ms)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def run(app: Any, cycles: int, warmup: int, seed: int, prof: cProfile.Profile | None,
        before_cycle: Callable[[], None] | None = None, gap_s: float = 0.0) -> dict[str, Any]:
    """Drive the verbs; -> per-verb times (ms) and every timed call with the heavy steps it triggered."""
    verbs = app.verbs
    f_verb, p_verb, b_verb = (verbs[f"{PREFIX}/{v}"] for v in ("filter", "prioritize", "bind"))
    names = [n["metadata"]["name"] for n in (make_node(k) for k in range(len(app.state.services.store.state)))]
    names_json = orjson.dumps(names)
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    calls: list[dict[str, Any]] = []
    gc.collect()
    gc.freeze()
    with triggers() as trig:
        for j in range(warmup + cycles):
            timed = j >= warmup
            if before_cycle is not None:
                before_cycle()
            time.sleep(gap_s)
            p = make_pod(j, rng)
            pod_json = orjson.dumps(p)
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}"
            res, dt_f, trig_f = _call(f_verb, body, prof if timed else None, trig)
            passed = res["NodeNames"]
            if not passed:
                continue
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + orjson.dumps(passed) + b"}"
            scores, dt_p, trig_p = _call(p_verb, body, prof if timed else None, trig)
            time.sleep(gap_s)
            best = max(scores, key=lambda s: s["Score"])["Host"]
            meta = p["metadata"]
            _, dt_b, trig_b = _call(b_verb, orjson.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                          "PodUID": meta["uid"], "Node": best}), None, trig)
            if not timed:
                continue
            for verb, dt, trig_v in (("filter", dt_f, trig_f), ("prioritize", dt_p, trig_p), ("bind", dt_b, trig_b)):
                times[verb].append(dt)
                calls.append({"cycle": j, "verb": verb, "ms": round(dt, 2), **trig_v})
    gc.unfreeze()
    return {"times": times, "calls": calls}


def _call(verb: Any, body: bytes, prof: cProfile.Profile | None, trig: Triggers) -> tuple[Any, float, dict[str, int]]:
    trig.take()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    out = verb.handler(verb.decode(body))
    if prof is not None:
        prof.disable()
    dt = (time.perf_counter() - t0) * 1000
    out = orjson.loads(out) if isinstance(out, bytes) else out
    return out, dt, trig.take()


def summary(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {v: {"p50_ms": round(_pct(ms, 50), 3), "p99_ms": round(_pct(ms, 99), 3), "max_ms": round(max(ms), 3),
                "mean_ms": round(statistics.fmean(ms), 3)} for v, ms in times.items() if ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--policy", default="vramfit")
    ap.add_argument("--shortlist", type=int, default=None, metavar="K",
                    help="config shortlist_k (default: the config's default)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile the timed filter and prioritize calls")
    ap.add_argument("--top", type=int, default=30, help="profile entries printed (by cumulative time)")
    ap.add_argument("--spike-ms", type=float, default=0.0,
                    help="list the calls slower than this (default: 2 x the verb's p50)")
    ap.add_argument("--gap-ms", type=float, default=0.5,
                    help="pause before filter and before bind, as a client's own time and HTTP leave the server "
                         "(the refresher, if any, runs in them)")
    ap.add_argument("--idle", action="store_true",
                    help="between cycles, wait until the policy refresher (if any) is idle (as the gaps between "
                         "kube-scheduler's cycles allow)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    app = build(args.nodes, args.policy, args.shortlist)
    print(f"built {args.nodes} nodes in {time.perf_counter() - t0:.1f} s")
    prof = cProfile.Profile() if args.profile else None
    before = _idle_wait(app) if args.idle else None
    out = run(app, args.cycles, args.warmup, args.seed, prof, before, args.gap_ms / 1000)
    stats = summary(out["times"])
    for verb, s in stats.items():
        print(f"{verb:10s} p50 {s['p50_ms']:7.3f} ms  p99 {s['p99_ms']:7.3f} ms  max {s['max_ms']:7.3f} ms  "
              f"mean {s['mean_ms']:7.3f} ms  p99/p50 {s['p99_ms'] / s['p50_ms']:.2f}")
    print(f"a cycle's three verbs: {sum(s['mean_ms'] for s in stats.values()):.3f} ms (the sum of their means)")
    for verb, s in stats.items():
        limit = args.spike_ms or 2 * s["p50_ms"]
        slow = [x for x in out["calls"] if x["verb"] == verb and x["ms"] > limit]
        print(f"{verb}: {len(slow)} calls over {limit:.2f} ms")
        for x in slow[:25]:
            print("   ", x)
    heavy = [x for x in out["calls"] if len(x) > 3]
    print(f"calls that triggered a heavy step: {len(heavy)}")
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.top)
        print(buf.getvalue())
    return 0


def _idle_wait(app: Any) -> Callable[[], None] | None:
    refresher = getattr(app.state.services, "refresher", None)
    if refresher is None:
        return None
    return lambda: refresher.wait_idle(1.0)


if __name__ == "__main__":
    raise SystemExit(main())
