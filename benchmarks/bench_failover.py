"""Failover of two `vramfit serve` replicas (cluster mode, leader election with the default lease settings)
against the API stand-in of the tests.

kill (default): N rounds of SIGKILL to the leader process. Each round measures, from the kill: the standby's
/readyz answering 200 (`ready_s`), then a filter and a bind of a new pod answered by it (`served_s`). The killed
replica is restarted (as the kubelet would) and waits as the warm standby of the next round; each kill lands at a
random moment of the renewal cycle.

relist: the start-of-term re-list failing. Pod LISTs fail (HTTP 500 "etcdserver: request timed out") from the
moment the leader is killed, for `--outage` seconds, so the standby's new term cannot re-list pods; the killed
replica restarts meanwhile. Reported, from the kill: the standby taking the Lease, it releasing the Lease
(term_relist_deadline_s after its term began) and failing /healthz, and a replica serving again (a filter and a
bind answered) once LISTs work. Run with an outage longer than the deadline (hand-over) and shorter (recovery
within the same term).

burst: the older in-process round (extender.replica.cluster_replica twice, the leader killed in the middle of a
bind burst, default lease settings): verb 5xx, double-booked units and tenant mixes read back from the API.

    python -m benchmarks.bench_failover kill --rounds 10 \
        [--baseline-args '--lease-duration 6 --renew-deadline 4 --retry-period 1']
    python -m benchmarks.bench_failover relist --outage 40
    python -m benchmarks.bench_failover relist --outage 12
    python -m benchmarks.bench_failover burst --rounds 5 --out benchmarks/results/failover_burst

The API stand-in (tests/fakes/apiserver.py) lives with the tests, never in a shipped package: this bench puts
tests/ on sys.path for it, as this bench always has (no other benchmark needs a stand-in).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NS = "vramfit-system"
LEASE = "vramfit-extender"
NODE = "mig-node"
GPUS = [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "mig",
         "mig": [{"profile": "1g.10gb", "start": s} for s in range(7)]} for i in range(8)]


def _stand_ins() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes.apiserver import FakeApiServer

    return FakeApiServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "annotations": {"vramfit.io/gpus": json.dumps(GPUS)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "vramfit.io/gpu": "448"}}}  # agent runs


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "annotations": {"vramfit.io/isolation": "hardware"}},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"vramfit.io/vram": "4096", "vramfit.io/gpu": "1"}}}]}}


@dataclass
class Proc:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    url: str = ""

    def get(self, path: str) -> tuple[int, str]:
        """(status, text); (0, error) when nothing answers."""
        try:
            r = httpx.get(f"{self.url}{path}", timeout=1.0)
            return r.status_code, r.text
        except httpx.HTTPError as err:
            return 0, str(err)


@dataclass
class Bench:
    fake: Any
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    pods: int = 0
    serve_args: list[str] = field(default_factory=list)

    def kubeconfig(self) -> Path:
        path = self.workdir / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.fake.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def start(self, name: str, port: int | None = None) -> Proc:
        port = port or _free_port()
        log = (self.workdir / f"{name}.log").open("ab")
        env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NS, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "vramfit.cli", "serve", "--kubeconfig", str(self.workdir / "kubeconfig"),
               "--port", str(port), "--signing-key", str(self.workdir / "signing-key"), "--log-level", "warning", *self.serve_args]
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        proc = Proc(name, port, popen, f"http://127.0.0.1:{port}")
        self.procs[name] = proc
        return proc

    def admit(self) -> None:
        """The kubelet: every bound pod is admitted a moment later (the admission gate waits for it)."""
        while not self.stop.wait(0.05):
            with self.fake._lock:  # noqa: SLF001 - a consistent read of the stand-in's storage
                todo = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.fake.pods
                        if p["spec"].get("nodeName") and not (p.get("status") or {}).get("startTime")]
            for ns, name in todo:
                self.fake.set_pod_status(ns, name, startTime="2026-12-06T00:00:00Z", phase="Running")

    def leader(self) -> Proc | None:
        ready = [p for p in self.procs.values() if p.popen.poll() is None and p.get("/readyz")[0] == 200]
        return ready[0] if len(ready) == 1 else None

    def warm_standby(self, p: Proc) -> bool:
        code, text = p.get("/readyz")
        return code == 503 and "standby: the Lease" in text and "not listed" not in text

    def holder(self) -> str | None:
        lease = self.fake.get_lease(NS, LEASE)
        return None if lease is None else str(lease["spec"].get("holderIdentity") or "")

    def serve_one(self, p: Proc) -> bool:
        """A filter then a bind of a new pod, answered by `p` (what kube-scheduler sends)."""
        self.pods += 1
        created = self.fake.add_pod(pod(f"fo-{self.pods}"))
        meta = created["metadata"]
        try:
            f = httpx.post(f"{p.url}/filter", json={"Pod": created, "NodeNames": [NODE]}, timeout=5)
            if f.status_code != 200 or not (f.json().get("NodeNames") or []):
                return False
            b = httpx.post(f"{p.url}/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                  "PodUID": meta["uid"], "Node": NODE}, timeout=10)
            return b.status_code == 200 and not b.json().get("Error")
        except httpx.HTTPError:
            return False


def until(cond: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.01) -> float:
    """Seconds until `cond()` holds (perf_counter); raises on timeout."""
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"{what}: not within {timeout_s}s")
        time.sleep(every_s)
    return time.perf_counter() - t0


@contextmanager
def bench_cluster(serve_args: list[str]) -> Iterator[Bench]:
    fake_cls = _stand_ins()
    fake = fake_cls(nodes=[node()]).start()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        bench = Bench(fake, Path(tmp), serve_args=serve_args)
        (bench.workdir / "signing-key").write_text(secrets.token_hex(32) + "\n")
        bench.kubeconfig()
        threading.Thread(target=bench.admit, daemon=True).start()
        try:
            for name in ("replica-a", "replica-b"):
                bench.start(name)
            until(lambda: bench.leader() is not None, 60, "a first leader", 0.1)
            yield bench
        finally:
            bench.stop.set()
            for p in bench.procs.values():
                if p.popen.poll() is None:
                    p.popen.send_signal(signal.SIGTERM)
            for p in bench.procs.values():
                try:
                    p.popen.wait(15)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
            fake.stop()


def restart(bench: Bench, killed: Proc) -> None:
    killed.popen.wait(10)
    bench.start(killed.name, killed.port)


def one_kill(bench: Bench, rng: random.Random) -> dict[str, Any]:
    leader = bench.leader()
    assert leader is not None
    (standby,) = [p for p in bench.procs.values() if p is not leader]
    until(lambda: bench.warm_standby(standby), 60, "a warm standby", 0.05)
    time.sleep(rng.uniform(0.0, 1.0))  # any moment of the renewal cycle
    t0 = time.perf_counter()
    os.kill(leader.popen.pid, signal.SIGKILL)
    until(lambda: standby.get("/readyz")[0] == 200, 60, "the standby ready")
    ready_s = time.perf_counter() - t0
    until(lambda: bench.serve_one(standby), 30, "a filter and bind on the new leader", 0.02)
    served_s = time.perf_counter() - t0
    restart(bench, leader)
    return {"killed": leader.name, "ready_s": round(ready_s, 3), "served_s": round(served_s, 3)}


def run_kills(rounds: int, seed: int, serve_args: list[str]) -> dict[str, Any]:
    rng = random.Random(seed)
    with bench_cluster(serve_args) as bench:
        out = []
        for k in range(rounds):
            r = one_kill(bench, rng)
            print(json.dumps({"round": k, **r}), flush=True)
            out.append(r)
    ready = [r["ready_s"] for r in out]
    served = [r["served_s"] for r in out]
    return {"scenario": "kill", "rounds": rounds, "seed": seed, "serve_args": serve_args,
            "ready_s_mean": round(statistics.mean(ready), 2), "ready_s_max": round(max(ready), 2),
            "served_s_mean": round(statistics.mean(served), 2), "served_s_max": round(max(served), 2),
            "per_round": out}


def run_relist(outage_s: float, serve_args: list[str]) -> dict[str, Any]:
    """The leader killed and pod LISTs failing for `outage_s` from that moment: what the next term does."""
    with bench_cluster(serve_args) as bench:
        leader = bench.leader()
        assert leader is not None
        (standby,) = [p for p in bench.procs.values() if p is not leader]
        until(lambda: bench.warm_standby(standby), 60, "a warm standby", 0.05)
        events: dict[str, float] = {}
        holders: list[tuple[float, str | None]] = []
        t0 = time.perf_counter()
        bench.fake.failing_lists = {"pods"}
        os.kill(leader.popen.pid, signal.SIGKILL)
        restarted = False
        healthz_text = readyz_text = served_by = ""
        while True:
            now = time.perf_counter() - t0
            if now >= outage_s and bench.fake.failing_lists:
                bench.fake.failing_lists = set()
                events["lists_work_again"] = now
            if not restarted and "standby_took_lease" in events:
                restart(bench, leader)  # the kubelet restarts the killed container (after the takeover: this
                # measures the standby's term; a restart before expiry would resume the dead one's own Lease)
                restarted = True
            holder = bench.holder()
            if not holders or holders[-1][1] != holder:
                holders.append((round(now, 2), holder))
            if holder == standby.name and "standby_took_lease" not in events:
                events["standby_took_lease"] = now
            if holder == "" and "lease_released" not in events and "standby_took_lease" in events:
                events["lease_released"] = now
            if "standby_healthz_failed" not in events:
                code, text = standby.get("/healthz")
                if code == 503:
                    events["standby_healthz_failed"], healthz_text = now, text
            if "standby_took_lease" in events and "lease_released" not in events and not readyz_text \
                    and now - events["standby_took_lease"] > 2:
                readyz_text = standby.get("/readyz")[1]
            serving = bench.leader()
            if serving is not None and bench.serve_one(serving):
                events["served_again"] = time.perf_counter() - t0
                served_by = serving.name
                break
            if now > outage_s + 120:
                raise RuntimeError("nobody served again")
            time.sleep(0.05)
    return {"scenario": "relist", "outage_s": outage_s, "serve_args": serve_args, "from_kill_s": {k: round(v, 2) for k, v in events.items()},
            "served_again_by": served_by, "lease_holders": holders,
            "standby_readyz_during_term": readyz_text, "standby_healthz_after_step_down": healthz_text}


def write_md(path: Path, results: list[dict[str, Any]], commands: list[str]) -> None:
    lines = ["# Failover of two `vramfit serve` replicas (SIGKILL of the leader, failing term re-lists)", "",
             "Produced by `benchmarks/bench_failover.py` on loopback against the API stand-in "
             "(tests/fakes/apiserver.py), default lease settings (4 s / 2 s / 0.5 s) and "
             "term_relist_deadline_s 20. Commands:", ""]
    lines += [f"    {c}" for c in commands] + [""]
    for r in results:
        if r["scenario"] == "kill":
            extra = (f", `{' '.join(r['serve_args'])}`: the old defaults, with this code's wake at expiry"
                     if r["serve_args"] else ", default lease settings")
            lines += [f"## SIGKILL of the leader, {r['rounds']} rounds (seed {r['seed']}{extra})", "",
                      "| from the kill to | mean s | max s |", "|---|---|---|",
                      f"| the standby's /readyz 200 | {r['ready_s_mean']} | {r['ready_s_max']} |",
                      f"| a filter and a bind answered by it | {r['served_s_mean']} | {r['served_s_max']} |", "",
                      "Per round (ready_s, served_s): " + ", ".join(f"({x['ready_s']}, {x['served_s']})"
                                                                    for x in r["per_round"]), ""]
        else:
            ev = r["from_kill_s"]
            lines += [f"## Pod LISTs failing for {r['outage_s']:g} s from the kill (the new term's re-list)", "",
                      "| event | s after the kill |", "|---|---|"]
            lines += [f"| {k.replace('_', ' ')} | {v} |" for k, v in sorted(ev.items(), key=lambda kv: kv[1])]
            took, released = ev.get("standby_took_lease"), ev.get("lease_released")
            if took is not None and released is not None:
                lines += ["", f"The new term handed the Lease over {released - took:.1f} s after it began."]
            elif took is not None and "served_again" in ev:
                lines += ["", f"The new term recovered {ev['served_again'] - took:.1f} s after it began, "
                          f"{ev['served_again'] - ev.get('lists_work_again', 0):.1f} s after the LISTs worked again."]
            lines += ["", f"Served again by {r['served_again_by']}. Lease holders over time (s, holder): "
                      + ", ".join(f"({t}, {h!r})" for t, h in r["lease_holders"]), ""]
            if r["standby_readyz_during_term"]:
                lines += [f"The new leader's /readyz during its term: `{r['standby_readyz_during_term']}`", ""]
            if r["standby_healthz_after_step_down"]:
                lines += [f"Its /healthz after stepping down: `{r['standby_healthz_after_step_down']}`", ""]
    path.write_text("\n".join(lines))


# -- the in-process burst (double booking across a failover) ---------------------------------------------
def _harness() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "extender"))
    import test_extender_ha as harness

    from extender.leader import LeaseConfig

    harness.LEASE = LeaseConfig(namespace=NS, name=LEASE)  # the default lease settings, not the tests' short ones
    return harness


def burst_round(h: Any, seed: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    random.seed(seed)
    cluster = h.Cluster()
    statuses: list[int] = []
    try:
        cluster.add_replica("replica-a")
        cluster.add_replica("replica-b")
        first = cluster.leader()
        for r in cluster.replicas:
            hook = r.client.event_hooks.setdefault("response", [])
            hook.append(lambda resp: statuses.append(resp.status_code)
                        if resp.request.url.path.rsplit("/", 1)[-1] in ("filter", "prioritize", "bind") else None)
        tenants = ["team-a", "team-b", "team-c"]
        pods = [cluster.fake.add_pod(h.pod(f"b{seed}-{i}", tenants[i % 3], [3000, 9000, 14000][i % 3],
                                           ["hardware", "process", "none"][i % 3])) for i in range(36)]

        def bound() -> int:
            with cluster.fake._lock:  # noqa: SLF001
                return sum(1 for p in cluster.fake.pods if p["spec"].get("nodeName"))

        def killer() -> None:
            h.wait(lambda: bound() >= 8, timeout_s=60)
            cluster.kill(first)

        k = threading.Thread(target=killer)
        k.start()
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(lambda p: cluster.schedule(p, attempts=400), pods))
        k.join()
        doubles, mixes = h.check_placements(cluster.fake)
        return {"seed": seed, "requests": len(statuses),
                "verb_5xx_other": sum(1 for s in statuses if s >= 500 and s != 503),
                "verb_503_standby": sum(1 for s in statuses if s == 503), "bound": bound(),
                "double_booked_units": doubles, "tenant_mixes": mixes}
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", nargs="*", default=["kill"], choices=["kill", "relist", "burst"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outage", type=float, action="append", help="relist: seconds of failing pod LISTs "
                    "(repeatable; default 40 and 12)")
    ap.add_argument("--serve-args", default="", help="extra `vramfit serve` arguments, e.g. the old lease "
                    "settings for a baseline: '--lease-duration 6 --renew-deadline 4 --retry-period 1'")
    ap.add_argument("--baseline-args", default="", help="kill: also run the rounds with these `vramfit serve` "
                    "arguments, on the same machine, e.g. '--lease-duration 6 --renew-deadline 4 --retry-period 1'")
    ap.add_argument("--out", default=str(RESULTS / "failover"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    for scenario in args.scenario:
        if scenario == "kill":
            results.append(run_kills(args.rounds, args.seed, args.serve_args.split()))
            if args.baseline_args:
                print(json.dumps({k: v for k, v in results[-1].items() if k != "per_round"}), flush=True)
                results.append(run_kills(args.rounds, args.seed, args.baseline_args.split()))
        elif scenario == "relist":
            for outage in args.outage or [40.0, 12.0]:
                results.append(run_relist(outage, args.serve_args.split()))
                if outage != (args.outage or [40.0, 12.0])[-1]:
                    print(json.dumps(results[-1]), flush=True)
        else:
            h = _harness()
            rounds = [burst_round(h, seed) for seed in range(args.rounds)]
            totals = {k: sum(r[k] for r in rounds) for k in ("requests", "verb_5xx_other", "verb_503_standby",
                                                              "double_booked_units", "tenant_mixes")}
            results.append({"scenario": "burst", **totals, "rounds": rounds})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "per_round"}), flush=True)
    command = "python -m benchmarks.bench_failover " + shlex.join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "results": results}, indent=2) + "\n")
    if any(r["scenario"] != "burst" for r in results):
        write_md(out.with_suffix(".md"), [r for r in results if r["scenario"] != "burst"], [command])
    return 0


if __name__ == "__main__":
    sys.exit(main())
