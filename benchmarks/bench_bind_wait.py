"""Bind wait per queued pod: a burst of pods to one node through the admission gate (extender/admission.py).

kube-scheduler's order: each pod's filter, then its bind sent (not awaited), then the next pod's filter. The
API is the stand-in of tests/fakes (list+watch, Bindings); a stand-in kubelet admits each bound pod (sets
status.startTime) `--admit-ms` after its Binding. Binds to the node go one at a time, each after the kubelet
admitted the one before, so the k-th queued bind waits about k admissions. Reported: bound, refused at filter,
failed binds, each bind's latency, and the mean added per queued pod (its latency over the one before).

    python -m benchmarks.bench_bind_wait [--pods 8 --gpus 5 --admit-ms 700 --out benchmarks/results/bind_wait.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.local_server import LocalServer
from benchmarks.report import save_json
from extender.admission import AdmissionGate
from extender.app import create_app
from extender.binder import KubeBinder
from extender.config import Settings
from extender.kube import KubeSource
from extender.store import Store, agent_rule
from kubeio.client import api_client
from packing.catalog import load_catalog

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "/vramfit"


def _node(gpus: int) -> dict[str, Any]:
    described = [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"} for i in range(gpus)]
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "vramfit.io/gpu": str(gpus * 8)}
    return {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"},
                         "annotations": {"vramfit.io/gpus": json.dumps(described)}},
            "spec": {}, "status": {"capacity": dict(alloc), "allocatable": alloc}}


def _pod(k: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p{k}", "namespace": "default"},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "main", "image": "busybox", "resources": {
                    "requests": {"vramfit.io/vram": "70000"}, "limits": {"vramfit.io/vram": "70000"}}}]},
            "status": {"phase": "Pending"}}


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def burst(pods: int, gpus: int, admit_s: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes.apiserver import FakeApiServer

    fake = FakeApiServer(nodes=[_node(gpus)]).start()
    objs = [fake.add_pod(_pod(k)) for k in range(pods)]
    store = Store(load_catalog(), serves=agent_rule())
    source = KubeSource(api_client(host=fake.url), store).start()
    assert source.ready.wait(10)
    binder = KubeBinder(api_client(host=fake.url))
    settings = Settings(url_prefix=PREFIX, planning=False, emit_events=False)
    binder.admission = AdmissionGate(store, binder, wait_s=settings.admission_wait_s,
                                     stale_s=settings.admission_stale_s)
    server = LocalServer(create_app(settings, store, binder)).start()
    client = httpx.Client(base_url=server.url, timeout=30)
    stop = threading.Event()
    bound_at: dict[str, float] = {}

    def kubelet() -> None:
        while not stop.wait(0.01):
            for k in range(pods):
                p = fake.get_pod("default", f"p{k}")
                if p is None or not p["spec"].get("nodeName") or p["status"].get("startTime"):
                    continue
                first = bound_at.setdefault(f"p{k}", time.perf_counter())
                if time.perf_counter() - first >= admit_s:
                    fake.set_pod_status("default", f"p{k}", startTime=_stamp(), phase="Running")

    threading.Thread(target=kubelet, daemon=True).start()
    results: dict[str, tuple[str, float]] = {}
    refused: dict[str, str] = {}
    threads = []

    def bind(obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        t0 = time.perf_counter()
        r = client.post(f"{PREFIX}/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                                 "PodUID": meta["uid"], "Node": "n1"})
        results[meta["name"]] = (r.json()["Error"], time.perf_counter() - t0)

    try:
        for obj in objs:
            r = client.post(f"{PREFIX}/filter", json={"Pod": obj, "Nodes": None, "NodeNames": ["n1"]}).json()
            if not r["NodeNames"]:
                refused[obj["metadata"]["name"]] = {**r["FailedNodes"], **r["FailedAndUnresolvableNodes"]}["n1"]
                continue
            t = threading.Thread(target=bind, args=(obj,))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 5
            while binder.admission.queued("n1") < sum(t.is_alive() for t in threads) and time.monotonic() < deadline:
                time.sleep(0.001)
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        client.close()
        server.stop()
        source.stop()
        fake.stop()
    latencies = [round(results[f"p{k}"][1], 3) for k in range(pods) if f"p{k}" in results]
    steps = [b - a for a, b in zip(latencies, latencies[1:], strict=False)]
    return {"pods": pods, "gpus": gpus, "admit_ms": round(admit_s * 1000),
            "bound": sum(1 for e, _ in results.values() if not e),
            "bind_failed": {k: e for k, (e, _) in results.items() if e},
            "refused_at_filter": len(refused), "filter_reason": next(iter(refused.values()), None),
            "bind_latency_s": latencies,
            "wait_per_queued_pod_s": round(statistics.mean(steps), 3) if steps else None,
            "overhead_per_queued_pod_ms": round((statistics.mean(steps) - admit_s) * 1000, 1) if steps else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=5)
    ap.add_argument("--admit-ms", type=float, default=700.0, help="the kubelet's admission time per pod")
    ap.add_argument("--out", default="benchmarks/results/bind_wait.json")
    args = ap.parse_args(argv)
    result = {"command": ("python -m benchmarks.bench_bind_wait " + " ".join(argv or sys.argv[1:])).strip(),
              **burst(args.pods, args.gpus, args.admit_ms / 1000)}
    print(json.dumps(result, indent=1))
    save_json(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
