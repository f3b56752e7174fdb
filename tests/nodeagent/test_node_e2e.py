"""The whole chain, through real wire formats: webhook -> filter -> prioritize -> bind -> the kubelet's Allocate.

Stand-ins: the stateful API server (`fakes.apiserver`: Binding semantics, watches, field selectors), the
kubelet (`fakes.kubelet`: device plugin + pod-resources gRPC on unix sockets, admission in creation order)
and the MPS control executable. Everything else is the product: `vramfit serve`'s app with its store,
reflectors, binder and admission gate; `vramfit node`'s agent with its API pod source and node publisher.

A "kubelet loop" thread does what the kubelet's pod worker does: it sees pods bound to its node, admits them
in creationTimestamp order, and writes `status.startTime` (admitted) or phase Failed (rejected).
The extender and the agent share one signing key, as the chart's Secret gives them.
"""

from __future__ import annotations

import base64
import copy
import inspect
import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer
from fakes.kubelet import FakeKubelet, cleanup_socket_dir, short_socket_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException
from node_signing import KEYS

from benchmarks.local_server import LocalServer
from extender.admission import AdmissionGate
from extender.app import create_app
from extender.binder import KubeBinder
from extender.config import Settings
from extender.kube import KubeSource
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import Backoff
from nodeagent.agent import AgentOptions, NodeAgent
from nodeagent.allocate import GPU_RESOURCE, Trust
from nodeagent.config import AgentConfig
from nodeagent.inventory import FileInventory
from nodeagent.pods import ApiPods
from nodeagent.publish import KubePublisher
from packing.catalog import load_catalog
from packing.k8s.demand import ANN_ASSIGNMENT, ANN_PHASE
from packing.k8s.trust import ANN_SIGNATURE, sign

NODE = "gpu-node-1"
MPS_FAKE = Path(__file__).resolve().parents[1] / "fakes" / "mps_control.py"
GPUS: list[dict[str, Any]] = [
    {"index": 0, "uuid": "GPU-a100", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "mode": "mig",
     "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a100-0"},
             {"profile": "2g.20gb", "start": 4, "uuid": "MIG-a100-4"},
             {"profile": "1g.10gb", "start": 6, "uuid": "MIG-a100-6"}]},
    {"index": 1, "uuid": "GPU-h100", "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "mode": "mps",
     "replicas": 4},
    {"index": 2, "uuid": "GPU-t4-ts", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice",
     "replicas": 4},
    {"index": 3, "uuid": "GPU-t4", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"},
]
UNIT_GPU = {"GPU-a100": 0, "MIG-a100-0": 0, "MIG-a100-4": 0, "MIG-a100-6": 0, "GPU-h100": 1, "GPU-t4-ts": 2,
            "GPU-t4": 3}
SHARED_MODES = {1, 2}  # MPS and time-slicing: one tenant per GPU


def wait(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in time")
        time.sleep(0.02)


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add`/`replace` (all the webhook emits), with ~1 / ~0 unescaping."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            else:
                target.insert(int(last), op["value"]) if op["op"] == "add" else target.__setitem__(int(last),
                                                                                                    op["value"])
        else:
            target[last] = op["value"]
    return out


@dataclass
class Chain:
    fake: FakeApiServer
    kubelet: FakeKubelet
    agent: NodeAgent
    source: KubeSource
    server: LocalServer
    client: httpx.Client
    results: dict[str, Any] = field(default_factory=dict)  # pod uid -> AdmitResult
    stop: threading.Event = field(default_factory=threading.Event)

    # -- what the user and kube-scheduler do ------------------------------------------------------------------
    def create(self, name: str, vram: str, *, tenant: str, isolation: str = "none", gpus: int = 1,
               models: str | None = None) -> dict[str, Any]:
        """kubectl apply -> the webhook's AdmissionReview -> the mutated pod stored in the API."""
        pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": tenant,
                            "annotations": {"vramfit.io/isolation": isolation, "vramfit.io/gpus": str(gpus)}},
               "spec": {"containers": [{"name": "main", "image": "cuda",
                                        "resources": {"limits": {"vramfit.io/vram": vram}}}]}}
        if models:
            pod["metadata"]["annotations"]["vramfit.io/gpu-models"] = models
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": f"req-{name}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "resource": {"group": "", "version": "v1", "resource": "pods"},
                              "namespace": tenant, "operation": "CREATE", "object": pod,
                              "userInfo": {"username": "alice"}}}
        resp = self.client.post("/mutate", json=review)
        assert resp.status_code == 200, resp.text
        answer = resp.json()["response"]
        assert answer["allowed"], answer
        patch = json.loads(base64.b64decode(answer["patch"]))
        mutated = apply_json_patch(pod, patch)
        assert mutated["spec"]["schedulerName"] == "vramfit-scheduler"
        assert mutated["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] == str(gpus)
        return self.fake.add_pod(mutated)

    def schedule(self, pod: dict[str, Any]) -> str:
        """One scheduling cycle as kube-scheduler runs it against the extender; returns bind's Error ("" = bound)."""
        wait(lambda: self.extender_sees(pod), what=f"the extender's watch of {pod['metadata']['name']}")
        current = self.fake.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        filtered = self.client.post("/filter", json={"Pod": current, "NodeNames": [NODE]}).json()
        if NODE not in (filtered.get("NodeNames") or []):
            return f"filtered out: {filtered.get('FailedNodes') or filtered.get('FailedAndUnresolvableNodes')}"
        self.client.post("/prioritize", json={"Pod": current, "NodeNames": [NODE]}).raise_for_status()
        meta = current["metadata"]
        bound = self.client.post("/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                "PodUID": meta["uid"], "Node": NODE}, timeout=30)
        return str(bound.json().get("Error") or "")

    def extender_sees(self, pod: dict[str, Any]) -> bool:
        store = self.server.config.app.state.services.store
        with store.lock:
            return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}" in store._pods  # noqa: SLF001

    # -- what the kubelet's pod worker does -------------------------------------------------------------------
    def kubelet_loop(self) -> None:
        while not self.stop.is_set():
            with self.fake._lock:  # noqa: SLF001 - a consistent read of the stand-in's storage
                pods = [copy.deepcopy(p) for p in self.fake.pods
                        if p["spec"].get("nodeName") == NODE and p["metadata"]["uid"] not in self.results]
            for result in self.kubelet.admit(pods):
                self.results[result.uid] = result
                ns, name = result.namespace, result.name
                if result.admitted:
                    self.fake.set_pod_status(ns, name, startTime="2026-12-03T10:00:00Z", phase="Running")
                else:
                    self.fake.set_pod_status(ns, name, phase="Failed", reason=result.reason, message=result.message)
            self.stop.wait(0.02)

    def units_of(self, pod: dict[str, Any]) -> list[str]:
        """What the kubelet gave the pod's container (the agent's answer)."""
        result = self.results[pod["metadata"]["uid"]]
        assert result.admitted, result.message
        return result.container("main").allocations[GPU_RESOURCE].envs["NVIDIA_VISIBLE_DEVICES"].split(",")

    def booked_units(self, pod: dict[str, Any]) -> list[str]:
        """What vramfit booked for it (the assignment the Binding wrote), as UUIDs."""
        stored = self.fake.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        assert stored is not None
        grants = json.loads(stored["metadata"]["annotations"]["vramfit.io/assignment"])["gpus"]
        by_mig = {f"{m['profile']}@{m['start']}": m["uuid"] for m in GPUS[0]["mig"]}
        return [by_mig[g["mig"]] if g["mig"] else GPUS[g["index"]]["uuid"] for g in grants]

    def delete(self, pod: dict[str, Any]) -> None:
        self.fake.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.kubelet.release(pod["metadata"]["uid"])


class _SigningBinder(KubeBinder):
    """The extender's binder with the signature `vramfit serve --signing-key` adds to its Binding."""

    def _create_binding(self, where: str, namespace: str, name: str, uid: str, resource_version: str, node: str,
                        annotations: dict[str, str]) -> ApiException | None:
        signed = {**annotations, ANN_SIGNATURE: sign(KEYS, uid, node, annotations[ANN_ASSIGNMENT])}
        return super()._create_binding(where, namespace, name, uid, resource_version, node, signed)


def signing_binder(api: Any) -> KubeBinder:
    if "keys" in inspect.signature(KubeBinder).parameters:
        return KubeBinder(api, emit_events=False, keys=KEYS)  # type: ignore[call-arg]
    return _SigningBinder(api, emit_events=False)


def _write_control(tmp: Path) -> str:
    control = tmp / "nvidia-cuda-mps-control"
    control.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{MPS_FAKE}" "$@"\n')
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    return str(control)


def start_agent(fake: FakeApiServer, tmp: Path, plugin_dir: Path, pr_socket: Path) -> NodeAgent:
    api = api_client(host=fake.url)
    inventory = tmp / "gpus.json"
    inventory.write_text(json.dumps(GPUS))
    config = AgentConfig.model_validate({"mps": {"root": str(tmp / "mps")}, "allocate_lookup_s": 3.0,
                                         "reconcile_interval_s": 3600})
    pods = ApiPods(api, NODE).start()
    options = AgentOptions(node_name=NODE, plugin_dir=str(plugin_dir), pod_resources_socket=str(pr_socket),
                           mps_control=_write_control(tmp), state_dir=str(tmp / "state"), trust=Trust(KEYS))
    agent = NodeAgent(options, config, FileInventory(inventory), pods, KubePublisher(api, NODE))
    agent.plugin.poll_s = 0.05
    return agent.start()


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    tmp = tmp_path_factory.mktemp("chain")
    sockets = short_socket_dir()
    (sockets / "dp").mkdir()
    (sockets / "pr").mkdir()
    fake = FakeApiServer(nodes=[{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}},
                                 "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}}]).start()
    kubelet = FakeKubelet(sockets / "dp", sockets / "pr").start()
    agent = start_agent(fake, tmp, sockets / "dp", sockets / "pr" / "kubelet.sock")
    kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
    api = api_client(host=fake.url)
    store = Store(load_catalog())
    source = KubeSource(api, store, backoff=lambda: Backoff(initial_s=0.01, max_s=0.05)).start()
    settings_ = Settings(admission_wait_s=8.0, admission_stale_s=60.0, emit_events=False)
    binder = signing_binder(api)
    binder.admission = AdmissionGate(store, binder, wait_s=settings_.admission_wait_s,
                                     stale_s=settings_.admission_stale_s)
    server = LocalServer(create_app(settings_, store, binder, ready=source.ready.is_set)).start()
    client = httpx.Client(base_url=server.url, timeout=30)
    c = Chain(fake, kubelet, agent, source, server, client)
    loop = threading.Thread(target=c.kubelet_loop, daemon=True)
    loop.start()
    # The agent published the hardware: the extender's node watch sees every GPU.
    wait(lambda: len(store.state.node(NODE).gpus) == 4 if store.state.has_node(NODE) else False,
         what="the published vramfit.io/gpus reaching the extender")
    try:
        yield c
    finally:
        c.stop.set()
        loop.join(timeout=5)
        client.close()
        server.stop()
        source.stop()
        agent.stop()
        agent.ctx.pods.stop()  # type: ignore[attr-defined]
        kubelet.stop()
        fake.stop()
        cleanup_socket_dir(sockets)
        for pid_file in (tmp / "mps").rglob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def test_published_inventory_is_what_the_extender_schedules_on(chain: Chain) -> None:
    node = chain.fake.get_node(NODE)
    assert node is not None
    published = json.loads(node["metadata"]["annotations"]["vramfit.io/gpus"])
    assert [g["uuid"] for g in published] == [g["uuid"] for g in GPUS]


def check_env(chain: Chain, pod: dict[str, Any], vram_mib: int) -> None:
    """The container's environment is what its units' modes prescribe (README, "What happens to a pod")."""
    envs = chain.results[pod["metadata"]["uid"]].container("main").allocations[GPU_RESOURCE].envs
    units = chain.units_of(pod)
    assert units == chain.booked_units(pod)
    modes = {GPUS[UNIT_GPU[u]]["mode"] for u in units}
    assert ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in envs) == ("mps" in modes)
    if "mps" in modes:
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{units.index('GPU-h100')}={vram_mib}M"
        assert envs["CUDA_MPS_PIPE_DIRECTORY"]
    assert (envs.get("VRAMFIT_VRAM_MIB") == str(vram_mib)) == ("timeslice" in modes)


def test_each_mode_end_to_end_then_released(chain: Chain) -> None:
    # A 2-GPU hardware pod would need a MIG instance beside the whole T4: units of two kinds, refused.
    two = chain.create("two-gpu", "9Gi", tenant="team-d", isolation="hardware", gpus=2)
    assert "one kind" in chain.schedule(two)
    chain.delete(two)
    # Sized so that each lands on a different kind of unit whatever the policy prefers among equals.
    specs = [("t4-pod", "9Gi", "team-d", "hardware", "Tesla-T4"), ("mig-pod", "30Gi", "team-a", "hardware", None),
             ("mps-pod", "12Gi", "team-b", "process", None), ("ts-pod", "6Gi", "team-c", "none", None)]
    pods = []
    for name, vram, tenant, iso, models in specs:
        p = chain.create(name, vram, tenant=tenant, isolation=iso, models=models)
        assert chain.schedule(p) == ""
        wait(lambda p=p: p["metadata"]["uid"] in chain.results, what=f"admission of {name}")
        check_env(chain, p, int(vram[:-2]) * 1024)
        pods.append(p)
    used_modes = {GPUS[UNIT_GPU[u]]["mode"] for p in pods for u in chain.units_of(p)}
    assert used_modes >= {"mig", "exclusive"}
    assert chain.agent.reconciler is not None and chain.agent.reconciler.run_once() == []
    for p in pods:
        chain.delete(p)


def test_a_burst_of_binds_to_one_node_is_admitted_one_at_a_time_each_with_its_own_unit(chain: Chain) -> None:
    pods = [chain.create(f"burst-{i}", "5Gi", tenant="team-burst", isolation="none") for i in range(6)]
    for p in pods:
        wait(lambda p=p: chain.extender_sees(p), what="watch")
    with ThreadPoolExecutor(max_workers=6) as pool:
        errors = list(pool.map(chain.schedule, pods))
    bound = [p for p, e in zip(pods, errors, strict=True) if e == ""]
    # Every pod either bound, or was told to retry because the node was admitting another one.
    assert all(e == "" or "admitting" in e or "no longer fits" in e for e in errors), errors
    for p in pods:
        if p not in bound:
            assert chain.schedule(p) == ""  # kube-scheduler's retry
            bound.append(p)
    for p in bound:
        wait(lambda p=p: p["metadata"]["uid"] in chain.results, what="admission")
        assert chain.units_of(p) == chain.booked_units(p)
    assert all(r.admitted for r in (chain.results[p["metadata"]["uid"]] for p in bound))
    for p in pods:
        chain.delete(p)


def test_agent_restart_and_kubelet_restart_mid_stream(chain: Chain, tmp_path: Path) -> None:
    first = chain.create("before-restarts", "5Gi", tenant="team-r")
    assert chain.schedule(first) == ""
    wait(lambda: first["metadata"]["uid"] in chain.results, what="admission")
    chain.kubelet.restart()
    chain.kubelet.wait_for_registration(GPU_RESOURCE, timeout_s=10)
    second = chain.create("after-kubelet-restart", "20Gi", tenant="team-r", isolation="hardware")
    assert chain.schedule(second) == ""
    wait(lambda: second["metadata"]["uid"] in chain.results, what="admission")
    assert chain.units_of(second) == chain.booked_units(second)
    for p in (first, second):
        chain.delete(p)


def test_a_pod_created_on_the_node_with_a_forged_assignment_gets_nothing(chain: Chain) -> None:
    victim = chain.create("victim", "30Gi", tenant="team-a", isolation="hardware")
    assert chain.schedule(victim) == ""
    wait(lambda: victim["metadata"]["uid"] in chain.results, what="admission of the victim")
    (unit,) = chain.booked_units(victim)
    stored = chain.fake.get_pod("team-a", "victim")
    assert stored is not None and ANN_SIGNATURE in stored["metadata"]["annotations"]
    # No scheduler, no Binding: nodeName, the phase, the victim's assignment (and even its signature) and a
    # plain vramfit.io/gpu limit, which the webhook's match conditions do not look at.
    thief = chain.fake.add_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "thief", "namespace": "evil", "annotations": {
            ANN_PHASE: "allocating", ANN_ASSIGNMENT: stored["metadata"]["annotations"][ANN_ASSIGNMENT],
            ANN_SIGNATURE: stored["metadata"]["annotations"][ANN_SIGNATURE]}},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {GPU_RESOURCE: "1"}}}]}})
    wait(lambda: thief["metadata"]["uid"] in chain.results, what="the kubelet's verdict on the forged pod")
    result = chain.results[thief["metadata"]["uid"]]
    assert not result.admitted and "evil/thief" in result.message and "does not verify" in result.message
    assert chain.units_of(victim) == [unit]
    chain.delete(thief)
    chain.delete(victim)


def test_mps_daemon_crash_then_an_mps_pod(chain: Chain) -> None:
    mps = chain.agent.mps
    assert mps is not None
    pid_file = Path(mps.pipe_dir("GPU-h100")) / "nvidia-cuda-mps-control.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    mps.check_once()
    wait(lambda: mps.health()["GPU-h100"]["restarts"] >= 1, what="MPS daemon restart")
    p = chain.create("mps-after-crash", "8Gi", tenant="team-m", isolation="process", models="NVIDIA-H100-80GB-HBM3")
    assert chain.schedule(p) == ""
    wait(lambda: p["metadata"]["uid"] in chain.results, what="admission")
    assert chain.units_of(p) == ["GPU-h100"]
    chain.delete(p)


pod_st = st.tuples(st.sampled_from(["team-x", "team-y", "team-z"]), st.sampled_from(["hardware", "process", "none"]),
                   st.sampled_from(["3Gi", "5Gi", "9Gi", "14Gi", "30Gi"]), st.integers(1, 2))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                               HealthCheck.too_slow])
@given(st.lists(pod_st, min_size=2, max_size=6))
def test_random_bursts_never_hand_out_another_pods_or_another_tenants_unit(chain: Chain,
                                                                        burst: list[tuple[str, str, str, int]]) -> None:
    test_random_bursts_never_hand_out_another_pods_or_another_tenants_unit.n += 1  # type: ignore[attr-defined]
    n = test_random_bursts_never_hand_out_another_pods_or_another_tenants_unit.n  # type: ignore[attr-defined]
    pods = [chain.create(f"h{n}-{i}", vram, tenant=tenant, isolation=iso, gpus=g)
            for i, (tenant, iso, vram, g) in enumerate(burst)]
    with ThreadPoolExecutor(max_workers=len(pods)) as pool:
        errors = list(pool.map(chain.schedule, pods))
    placed = [p for p, e in zip(pods, errors, strict=True) if e == ""]
    holders: dict[str, list[str]] = {}
    tenants: dict[int, set[str]] = {}
    for p in placed:
        wait(lambda p=p: p["metadata"]["uid"] in chain.results, what="admission")
        units = chain.units_of(p)
        assert units == chain.booked_units(p)  # its own pod's units, nothing else
        for u in units:
            holders.setdefault(u, []).append(p["metadata"]["name"])
            tenants.setdefault(UNIT_GPU[u], set()).add(p["metadata"]["namespace"])
    for u, names in holders.items():
        if UNIT_GPU[u] not in SHARED_MODES:
            assert len(names) == 1, f"{u} handed to {names}"  # a MIG instance or whole GPU: one pod
    for gpu, ts in tenants.items():
        if gpu in SHARED_MODES:
            assert len(ts) == 1, f"GPU {gpu} shared by tenants {ts}"  # one failure domain, one tenant
    for p in pods:
        chain.delete(p)
    for p in pods:
        wait(lambda p=p: not chain.extender_sees(p), what="deletion reaching the extender")


test_random_bursts_never_hand_out_another_pods_or_another_tenants_unit.n = 0  # type: ignore[attr-defined]
