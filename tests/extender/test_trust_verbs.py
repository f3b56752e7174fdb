"""What a verb decides comes from the pod itself and from the admins' namespaces (issue 26, items 1-4 and 8), over
HTTP against the real app: the Binding is signed, a forged filter call cannot change what a later bind books, a
pod naming a tenant its namespace does not allow is never placed, and `vramfit serve` refuses a cluster without
a signing key."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer
from serve_process import TEST_SIGNING_KEY, signing_key_file
from waiting import wait_for

from benchmarks.local_server import LocalServer
from extender.admission import AdmissionGate
from extender.app import create_app
from extender.binder import KubeBinder, MemoryBinder
from extender.cli import build_serve_parser, run_serve
from extender.config import Settings
from extender.kube import KubeSource
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import Backoff
from packing.catalog import load_catalog
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys, verify

CATALOG = load_catalog()
PREFIX = "/vramfit"
KEYS = SigningKeys.from_text(TEST_SIGNING_KEY)
H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                         "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def pending(name: str, ns: str = "team-a", vram_mib: int = 8192, *, tenant: str | None = None,
            isolation: str | None = None, uid: str | None = None) -> dict[str, Any]:
    ann = {"vramfit.io/isolation": isolation} if isolation else {}
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}", "annotations": ann,
                         "labels": {"vramfit.io/tenant": tenant} if tenant else {},
                         "creationTimestamp": "2026-05-04T08:00:00Z"},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "main", "resources": {"limits": {"vramfit.io/vram": str(vram_mib)}}}]},
            "status": {"phase": "Pending"}}


def wire_pod(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


class Client:
    def __init__(self, app: Any) -> None:
        self.server = LocalServer(app).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30)

    def filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        r = self.http.post(f"{PREFIX}/filter", json={"Pod": wire_pod(pod), "Nodes": None, "NodeNames": names})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def bind(self, pod: dict[str, Any], node_name: str) -> httpx.Response:
        meta = pod["metadata"]
        return self.http.post(f"{PREFIX}/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                      "PodUID": meta["uid"], "Node": node_name})

    def close(self) -> None:
        self.http.close()
        self.server.stop()


class Cluster(Client):
    """The real app in cluster mode (KubeBinder with a signing key and a bind gate) over the API stand-in."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.store = Store(CATALOG, signing_keys=KEYS)
        self.source = KubeSource(api_client(host=fake.url), self.store,
                                 backoff=lambda: Backoff(initial_s=0.01, max_s=0.05)).start()
        assert self.source.ready.wait(10)
        self.binder = KubeBinder(api_client(host=fake.url), keys=KEYS, emit_events=False)
        self.binder.admission = AdmissionGate(self.store, self.binder, wait_s=2.0, stale_s=60.0)
        super().__init__(create_app(Settings(url_prefix=PREFIX), self.store, self.binder,
                                    ready=self.source.ready.is_set))

    def close(self) -> None:
        super().close()
        self.source.stop()


@pytest.fixture
def fake(fake_api: Callable[..., FakeApiServer]) -> FakeApiServer:
    return fake_api(nodes=[node("ts", [{"index": 0, "product": H100, "mode": "timeslice", "replicas": 4}]),
                           node("mig", [{"index": 0, "product": H100, "mode": "mig",
                                         "mig": [{"profile": "7g.80gb", "start": 0}]}])],
                    namespaces=[{"metadata": {"name": "team-a"}}, {"metadata": {"name": "team-b"}},
                                {"metadata": {"name": "evil"}}])


@pytest.fixture
def cluster(fake: FakeApiServer) -> Iterator[Cluster]:
    c = Cluster(fake)
    yield c
    c.close()


def test_the_binding_is_signed_and_a_restart_books_it(fake: FakeApiServer, cluster: Cluster) -> None:
    p = fake.add_pod(pending("p", vram_mib=4096))
    wait_for(lambda: cluster.store.pod_object("team-a/p") is not None)
    assert cluster.filter(p, ["ts"])["NodeNames"] == ["ts"]
    assert cluster.bind(p, "ts").json() == {"Error": ""}
    (body,) = [r.json() for r in fake.recorded("POST", "/pods/p/binding")]
    ann = body["metadata"]["annotations"]
    assert verify(KEYS, "uid-team-a-p", "ts", ann["vramfit.io/assignment"], ann[ANN_SIGNATURE])
    wait_for(lambda: (cluster.store.pod_object("team-a/p") or {}).get("spec", {}).get("nodeName") == "ts")
    fresh = Store(CATALOG, signing_keys=KEYS)
    again = KubeSource(api_client(host=fake.url), fresh).start()
    try:
        assert again.ready.wait(10)
        assert fresh.state.holder("team-a/p") == cluster.store.state.holder("team-a/p")
    finally:
        again.stop()


def test_a_forged_filter_cannot_change_what_bind_books(fake: FakeApiServer, cluster: Cluster) -> None:
    """The probe's case: the real pod asks 40 GiB with hardware isolation; a filter call naming its UID and
    resourceVersion says 3 GiB and no isolation, which a time-sliced GPU would take."""
    real = fake.add_pod(pending("big", vram_mib=40960, isolation="hardware"))
    wait_for(lambda: cluster.store.pod_object("team-a/big") is not None)
    forged = json.loads(json.dumps(real))
    forged["spec"]["containers"][0]["resources"]["limits"]["vramfit.io/vram"] = "3072"
    forged["metadata"]["annotations"] = {}
    assert cluster.filter(forged, ["ts"])["NodeNames"] == ["ts"]  # what the forged body asks fits there
    assert cluster.filter(real, ["ts"])["NodeNames"] == []  # the same UID and version, the real content: no
    cluster.filter(forged, ["ts"])  # the last filter is the forged one
    out = cluster.bind(real, "ts").json()["Error"]
    assert "no longer fits" in out and "isolation hardware" in out
    assert cluster.store.state.holder("team-a/big") is None
    assert fake.recorded("POST", "/pods/big/binding") == []


def test_a_pod_naming_another_tenant_is_refused_at_filter_and_never_shares_its_gpu(
        fake: FakeApiServer, cluster: Cluster) -> None:
    mate = fake.add_pod(pending("mate", vram_mib=4096))
    wait_for(lambda: cluster.store.pod_object("team-a/mate") is not None)
    assert cluster.bind(mate, "ts").json()["Error"] != ""  # not filtered yet
    assert cluster.filter(mate, ["ts"])["NodeNames"] == ["ts"] and cluster.bind(mate, "ts").json()["Error"] == ""
    fake.set_pod_status("team-a", "mate", startTime="2026-05-04T08:01:00Z", phase="Running")  # its kubelet admits it
    wait_for(lambda: (cluster.store.pod_object("team-a/mate") or {}).get("status", {}).get("startTime"))
    intruder = fake.add_pod(pending("x", ns="evil", vram_mib=4096, tenant="team-a"))
    wait_for(lambda: cluster.store.pod_object("evil/x") is not None)
    out = cluster.filter(intruder, ["ts", "mig"])
    assert out["NodeNames"] == []
    assert "namespace evil does not allow tenant 'team-a'" in out["FailedAndUnresolvableNodes"]["ts"]
    assert "team-a" not in {e.pod.tenant for e in cluster.store.queued()}
    error = cluster.bind(intruder, "ts").json()["Error"]
    assert "does not allow tenant" in error or "unknown to vramfit" in error
    assert cluster.store.state.holder("evil/x") is None
    # An admin allows it: the pod now counts as team-a's, and may join team-a's GPU.
    fake.patch_namespace("evil", {"metadata": {"annotations": {"vramfit.io/allowed-tenants": "team-a"}}})
    wait_for(lambda: cluster.store.tenancy.of("evil").permits("team-a"))
    assert cluster.filter(intruder, ["ts"])["NodeNames"] == ["ts"]
    assert cluster.bind(intruder, "ts").json()["Error"] == ""
    h = cluster.store.state.holder("evil/x")
    assert h is not None and h.pod.tenant == "team-a"


def test_a_non_string_scheduler_name_never_makes_bind_answer_500() -> None:
    store = Store.from_objects([node("ts", [{"index": 0, "product": H100, "mode": "exclusive"}])], CATALOG)
    c = Client(create_app(Settings(url_prefix=PREFIX), store, MemoryBinder()))
    try:
        for weird in ({"a": 1}, ["x"], 7):
            p = pending(f"p{len(str(weird))}")
            p["spec"]["schedulerName"] = weird
            c.http.post(f"{PREFIX}/filter", json={"Pod": wire_pod(p), "NodeNames": ["ts"]})
            r = c.bind(p, "ts")
            assert r.status_code == 200 and r.json()["Error"], r.text
    finally:
        c.close()


def test_the_bind_refusal_reads_the_scheduler_name_safely() -> None:
    """The root of item 8: the filter memory may hold any JSON value as the scheduler name."""
    from extender.metrics import Metrics
    from extender.verbs.bind import Bind
    from extender.verbs.filter import FilterMemory
    from extender.verbs.shared import Shared
    from packing.model import PodDemand
    from packing.policies import get_policy

    store = Store(CATALOG)
    metrics = Metrics(store)
    memory = FilterMemory(60)
    memory.note(PodDemand(key="a/p", vram_mib=1, uid="u1"), {"spec": {"schedulerName": {"x": [1]}}})
    bind = Bind(Shared(store, get_policy("best-fit"), metrics), memory, MemoryBinder(), metrics,
                ["vramfit-scheduler"])
    refusal = bind._bind_refusal("a/p", "u1")  # noqa: SLF001
    assert refusal is not None and refusal[0] == "wrong_scheduler" and "not a string" in refusal[1]


# ---- vramfit serve: cluster mode needs a key ------------------------------------------------------------


def serve_args(tmp_path: Path, *extra: str) -> Any:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))
    return build_serve_parser().parse_args(["--kubeconfig", str(kubeconfig), "--port", "18888", *extra])


def test_serve_refuses_a_cluster_without_a_signing_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_serve(serve_args(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--signing-key" in err[0] and "signing_key_file" in err[0]


@pytest.mark.parametrize("content", [None, "short\n", ""])
def test_serve_names_an_unusable_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          content: str | None) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    assert run_serve(serve_args(tmp_path, "--signing-key", str(path))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]


def test_serve_reads_the_key_file_from_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With a key from the config (or allow_unsigned), serve gets past the check: assembling the replica is
    stubbed here, so nothing listens."""
    import extender.replica

    seen: list[Any] = []

    def stop_here(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("keys"))
        raise ValueError("stopped by the test")

    monkeypatch.setattr(extender.replica, "cluster_replica", stop_here)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"signing_key_file: {signing_key_file(tmp_path)}\n")
    assert run_serve(serve_args(tmp_path, "--config", str(cfg))) == 2
    cfg.write_text("allow_unsigned: true\n")
    assert run_serve(serve_args(tmp_path, "--config", str(cfg))) == 2
    assert [k is not None for k in seen] == [True, False]
    assert "stopped by the test" in capsys.readouterr().err
