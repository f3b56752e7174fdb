"""First-install mistakes the live extender answers (issue 27): URL prefixes, unknown GPU models at filter,
nodes the node agent does not serve, why a pending pod waits, and a burst of binds to one node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from store_helpers import pending_demands

from benchmarks.local_server import LocalServer
from extender.app import create_app
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.store import Store
from packing.catalog import load_catalog
from packing.vendors import product_model

CATALOG = load_catalog()


def node(name: str, gpus: int = 2, product: str = "NVIDIA-A100-SXM4-80GB", *, agent: bool = True,
         mode: str = "exclusive") -> dict[str, Any]:
    described: list[dict[str, Any]] = [{"index": i, "product": product, "mode": mode} for i in range(gpus)]
    if product_model(CATALOG, product) is None:
        for gpu in described:
            gpu["memory_mib"] = 49152
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if agent:
        allocatable["vramfit.io/gpu"] = str(max(1, gpus) * 8)
    return {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name},
                                         "annotations": {"vramfit.io/gpus": json.dumps(described)} if gpus else {}},
            "spec": {}, "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


def pod(name: str, vram_mib: int = 8192, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations or {},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "main", "image": "busybox",
                 "resources": {"requests": {"vramfit.io/vram": str(vram_mib)},
                               "limits": {"vramfit.io/vram": str(vram_mib)}}}]},
            "status": {"phase": "Pending"}}


class Served:
    def __init__(self, objs: list[dict[str, Any]], settings: Settings, **store_kwargs: Any) -> None:
        self.store = Store.from_objects(objs, CATALOG, **store_kwargs)
        self.app = create_app(settings, self.store, MemoryBinder())
        self.server = LocalServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)

    def filter(self, p: dict[str, Any], names: list[str], prefix: str = "/vramfit") -> httpx.Response:
        return self.client.post(f"{prefix}/filter", json={"Pod": p, "Nodes": None, "NodeNames": names})

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served([node("n1")], Settings(planning=False))
    yield s
    s.close()


# ---- URL prefix ----------------------------------------------------------------------------------------


def test_without_a_config_the_verbs_answer_under_the_charts_prefix_and_without_one(served: Served) -> None:
    for prefix in ("/vramfit", ""):
        r = served.filter(pod("p"), ["n1"], prefix)
        assert r.status_code == 200 and r.json()["NodeNames"] == ["n1"], (prefix, r.text)


def test_a_configured_prefix_is_the_only_one() -> None:
    s = Served([node("n1")], Settings(url_prefix="/x", planning=False))
    try:
        assert s.filter(pod("p"), ["n1"], "/x").json()["NodeNames"] == ["n1"]
        assert s.filter(pod("p"), ["n1"], "").status_code == 404
        assert s.filter(pod("p"), ["n1"], "/vramfit").status_code == 404
    finally:
        s.close()


# ---- vramfit.io/gpu-models naming no GPU ---------------------------------------------------------------


def test_filter_refuses_a_pod_whose_gpu_models_name_no_known_gpu(served: Served) -> None:
    r = served.filter(pod("p", annotations={"vramfit.io/gpu-models": "A100-80G"}), ["n1"])
    body = r.json()
    assert r.status_code == 200 and body["NodeNames"] == []
    reason = body["FailedAndUnresolvableNodes"]["n1"]
    assert "metadata.annotations[vramfit.io/gpu-models]" in reason and "did you mean" in reason
    # A known model, and a product only the cluster has (not the catalog), both pass.
    ok = served.filter(pod("q", annotations={"vramfit.io/gpu-models": "A100-80GB"}), ["n1"]).json()
    assert ok["NodeNames"] == ["n1"]


def test_a_product_the_cluster_has_but_the_catalog_lacks_is_known() -> None:
    s = Served([node("n1"), node("n2", product="Acme-X9-48GB")], Settings(planning=False))
    try:
        body = s.filter(pod("p", annotations={"vramfit.io/gpu-models": "Acme-X9-48GB"}), ["n1", "n2"]).json()
        assert body["NodeNames"] == ["n2"], body
    finally:
        s.close()


# ---- admission_wait_s within kube-scheduler's bind timeout ---------------------------------------------


@pytest.mark.parametrize(("text", "ok"), [
    ("admission_wait_s: 8\n", True),
    ("admission_wait_s: 9\n", False),
    ("admission_wait_s: 12\n", False),
    ("admission_wait_s: 28\nscheduler_http_timeout_s: 30\n", True),
    ("scheduler_http_timeout_s: 6\n", False),  # the default 5 s wait no longer fits
])
def test_admission_wait_must_leave_room_in_the_schedulers_bind_timeout(tmp_path: Any, text: str, ok: bool) -> None:
    from extender.config import ConfigError, load_settings

    path = tmp_path / "config.yaml"
    path.write_text(text)
    if ok:
        load_settings(path)
        return
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    message = str(err.value)
    assert message.startswith(f"config {path}: admission_wait_s: ") and "httpTimeout" in message
    assert "Value error" not in message and "\n" not in message


# ---- why a pending pod waits, from every node ----------------------------------------------------------


def test_never_fits_is_explained_from_every_node_not_the_first_alphabetically() -> None:
    from extender.view import cluster_view

    store = Store.from_objects([node("a-cpu", gpus=0), node("b-t4", gpus=1, product="Tesla-T4"),
                                node("c-t4", gpus=1, product="Tesla-T4")], CATALOG)
    big = pod("big", vram_mib=40_000)
    store.apply("pods", "ADDED", big)
    demand = pending_demands(store)[0]
    (view,) = cluster_view(store.state, [demand]).pending
    reason = view.reason
    assert reason.startswith("never fits: none of 3 nodes could hold it"), reason
    # The GPU nodes' reason comes first (two of them, and the most promising), the CPU-only node's after it.
    assert reason.index("b-t4") < reason.index("a-cpu") and "2 node(s) (b-t4, c-t4)" in reason, reason
    assert "1 node(s) (a-cpu): node has no GPUs vramfit knows of" in reason


def test_full_now_names_the_nodes_that_could_hold_it_once_units_free() -> None:
    from extender.view import cluster_view

    store = Store.from_objects([node("a-cpu", gpus=0), node("b-a100", gpus=1)], CATALOG)
    store.apply("pods", "ADDED", {**pod("holder"), "spec": {**pod("holder")["spec"], "nodeName": "b-a100"},
                                  "status": {"phase": "Running"}})
    store.apply("pods", "ADDED", pod("next"))
    (view,) = cluster_view(store.state, [d for d in pending_demands(store) if d.key == "default/next"]).pending
    assert view.reason.startswith("full now: 0/2 nodes fit now, 1 could hold it once units free: 1 node(s) (b-a100)"), \
        view.reason
    assert "a-cpu" not in view.reason


# ---- only nodes the node agent serves (or the config names) are vramfit capacity -----------------------


def test_a_gpu_node_without_the_node_agent_is_not_capacity_and_is_listed_as_such() -> None:
    from extender.store import agent_rule

    s = Served([node("served"), node("operator-only", agent=False)], Settings(planning=False), serves=agent_rule())
    try:
        body = s.filter(pod("p"), ["served", "operator-only"]).json()
        assert body["NodeNames"] == ["served"]
        why = body["FailedAndUnresolvableNodes"]["operator-only"]
        assert "not vramfit capacity" in why and "no vramfit.io/gpu in status.allocatable" in why
        state = s.client.get("/state").json()
        assert [n["name"] for n in state["nodes"]] == ["served"]
        assert "no vramfit.io/gpu" in state["nodes_not_served"]["operator-only"]
        metrics = s.client.get("/metrics").text
        assert 'vramfit_nodes_not_counted{reason="no_agent"} 1.0' in metrics
        assert "vramfit_nodes 1.0" in metrics
        page = s.client.get("/").text
        assert "Not counted as vramfit capacity" in page and "operator-only" in page
    finally:
        s.close()


def test_the_config_names_nodes_to_count_without_the_agent() -> None:
    from extender.store import agent_rule

    settings = Settings(planning=False, nodes_without_agent=["other-plugin"])
    s = Served([node("other-plugin", agent=False), node("plain", agent=False)], settings,
               serves=agent_rule(settings.nodes_without_agent))
    try:
        assert s.filter(pod("p"), ["other-plugin", "plain"]).json()["NodeNames"] == ["other-plugin"]
        assert list(s.client.get("/state").json()["nodes_not_served"]) == ["plain"]
    finally:
        s.close()


def test_a_node_gains_the_agent_and_becomes_capacity() -> None:
    from extender.store import agent_rule

    store = Store.from_objects([node("n1", agent=False)], CATALOG, serves=agent_rule())
    assert not store.state.has_node("n1") and "n1" in store.unserved
    store.apply("nodes", "MODIFIED", node("n1"))
    assert store.state.has_node("n1") and store.unserved == {}
    store.apply("nodes", "MODIFIED", node("n1", agent=False))
    assert not store.state.has_node("n1") and "n1" in store.unserved
