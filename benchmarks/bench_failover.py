"""Failover of two extender replicas: the leader killed (no Lease release) in the middle of a bind burst.

Each round: two replicas (`extender.replica.cluster_replica`, leader election on) against the API stand-in of
the tests, 36 pods from three tenants scheduled by six concurrent "kube-scheduler" workers through a Service
that routes to the ready replica, the leader killed after 8 binds. Reported per round and in total: binds
tried, HTTP 5xx answers, failover seconds (kill -> the standby serving), double-booked units and tenant mixes
read back from the API. A 503 is a standby's (or a not-yet-ready leader's) refusal of a verb; any other
5xx would be a failure. Also the same burst with election off and both replicas serving, to show what the
fence prevents.

    python -m benchmarks.bench_failover --rounds 5 [--lease 6 --renew 4 --retry 1]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "failover.json"


def _harness() -> Any:
    # The cluster harness and API stand-in live with the tests (stand-ins never ship in the packages).
    sys.path.insert(0, str(ROOT / "tests"))
    import test_extender_ha as harness

    return harness


def one_round(h: Any, lease: Any, seed: int, *, election: bool) -> dict[str, Any]:
    random.seed(seed)
    h.LEASE = lease
    cluster = h.Cluster()
    statuses: list[int] = []
    try:
        if election:
            cluster.add_replica("replica-a")
            cluster.add_replica("replica-b")
            first = cluster.leader()
        else:
            for _ in range(2):
                api = h.api_client(host=cluster.fake.url)
                rep = h.cluster_replica(api, h.Settings(admission_wait_s=3.0, emit_events=False), h.load_catalog(),
                                        lease=None, backoff=lambda: h.Backoff(initial_s=0.01, max_s=0.05)).start()
                server = h.LocalServer(rep.asgi).start()
                cluster.replicas.append(h.Running(rep, server, h.httpx.Client(base_url=server.url, timeout=20)))
            h.wait(lambda: len(cluster.ready()) == 2)
            ready = cluster.ready
            cluster.ready = lambda: random.sample(ready(), len(ready()))  # type: ignore[method-assign]
        for r in cluster.replicas:  # count every answer's status
            hook = r.client.event_hooks.setdefault("response", [])
            hook.append(lambda resp: statuses.append(resp.status_code)
                        if resp.request.url.path.rsplit("/", 1)[-1] in ("filter", "prioritize", "bind") else None)
        tenants = ["team-a", "team-b", "team-c"]
        pods = [cluster.fake.add_pod(h.pod(f"b{seed}-{i}", tenants[i % 3], [3000, 9000, 14000][i % 3],
                                           ["hardware", "process", "none"][i % 3])) for i in range(36)]
        failover: list[float] = []

        def bound() -> int:
            with cluster.fake._lock:  # noqa: SLF001
                return sum(1 for p in cluster.fake.pods if p["spec"].get("nodeName"))

        def killer() -> None:
            h.wait(lambda: bound() >= 8, timeout_s=60)
            t0 = time.monotonic()
            cluster.kill(first)
            h.wait(lambda: len(cluster.ready()) == 1, timeout_s=60)
            failover.append(time.monotonic() - t0)

        k = threading.Thread(target=killer) if election else None
        if k is not None:
            k.start()
        with ThreadPoolExecutor(max_workers=6) as pool:
            # kube-scheduler retries a pod until it binds: keep trying through the failover window.
            list(pool.map(lambda p: cluster.schedule(p, attempts=400), pods))
        if k is not None:
            k.join()
        doubles, mixes = h.check_placements(cluster.fake)
        return {"seed": seed, "election": election, "requests": len(statuses),
                "verb_5xx_other": sum(1 for s in statuses if s >= 500 and s != 503),
                "verb_503_standby": sum(1 for s in statuses if s == 503), "bound": bound(),
                "double_booked_units": doubles, "tenant_mixes": mixes,
                "failover_s": round(failover[0], 2) if failover else None}
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lease", type=float, default=6.0)
    ap.add_argument("--renew", type=float, default=4.0)
    ap.add_argument("--retry", type=float, default=1.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    h = _harness()
    from extender.leader import LeaseConfig

    lease = LeaseConfig(namespace=h.NS, lease_duration_s=args.lease, renew_deadline_s=args.renew,
                        retry_period_s=args.retry)
    rounds = [one_round(h, lease, seed, election=True) for seed in range(args.rounds)]
    rounds.append(one_round(h, lease, 99, election=False))
    for r in rounds:
        print(json.dumps(r))
    ha = [r for r in rounds if r["election"]]
    total = {k: sum(r[k] for r in ha) for k in ("requests", "verb_5xx_other", "verb_503_standby",
                                                  "double_booked_units", "tenant_mixes")}
    fo = [r["failover_s"] for r in ha]
    summary = {"lease_s": [args.lease, args.renew, args.retry], "rounds": len(ha), **total,
               "failover_s_max": max(fo), "failover_s_mean": round(sum(fo) / len(fo), 2),
               "without_election": {k: rounds[-1][k] for k in ("double_booked_units", "tenant_mixes", "bound")}}
    print(json.dumps(summary))
    Path(args.out).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
