"""Issue 13: the extender sees the pending queue, plans it with CP-SAT off the request path (extender/planning/planner.py)
and follows the plan safely in prioritize and bind (packing/planning/follow.py). No wall-clock asserts: waits are on
conditions with timeouts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from fakes.apiserver import FakeApiServer
from prometheus_client.parser import text_string_to_metric_families
from queue_objects import A100, CATALOG, T4, node, pod, wait_for
from solver_fixtures import planned_node

from benchmarks.local_server import LocalServer
from extender.app import create_app
from extender.binder import KubeBinder, MemoryBinder
from extender.config import Settings
from extender.kube import KubeSource
from extender.planning.planner import Planner
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import Backoff
from packing.planning import follow


def informer(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "kind"}


class Served:
    """A snapshot-mode extender over HTTP (planner built, its thread started only when asked)."""

    def __init__(self, objs: list[dict[str, Any]], **settings: Any) -> None:
        self.store = Store.from_objects(objs, CATALOG)
        self.app = create_app(Settings(**settings), self.store, MemoryBinder())
        self.svc = self.app.state.services
        self.planner: Planner | None = self.svc.planner
        self.server = LocalServer(self.app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=30)

    def close(self) -> None:
        if self.planner is not None:
            self.planner.stop()
        self.client.close()
        self.server.stop()

    def cycle(self, p: dict[str, Any], names: list[str]) -> tuple[list[dict[str, Any]], str | None, str]:
        """filter -> prioritize -> bind to the top score (ties: first) -> (scores, node, bind error)."""
        r = self.client.post("/filter", json={"Pod": informer(p), "Nodes": None, "NodeNames": names})
        passed = r.json()["NodeNames"] or []
        if not passed:
            return [], None, "unschedulable"
        scores = self.client.post("/prioritize", json={"Pod": informer(p), "Nodes": None,
                                                       "NodeNames": passed}).json()
        best = max(scores, key=lambda s: s["Score"])["Host"]
        m = p["metadata"]
        err = self.client.post("/bind", json={"PodName": m["name"], "PodNamespace": m["namespace"],
                                              "PodUID": m["uid"], "Node": best}).json()["Error"]
        return scores, best, err

    def metric(self, name: str, **labels: str) -> float | None:
        text = self.client.get("/metrics").text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return None


def t4_story() -> list[dict[str, Any]]:
    return [node("t4-node", T4), node("a100-node", A100),
            pod("flex", models=f"{T4},{A100}", created="2026-05-04T10:00:00Z"),
            pod("t4-only", models=T4, created="2026-05-04T10:00:05Z")]


@pytest.fixture
def served() -> Any:
    made: list[Served] = []

    def make(objs: list[dict[str, Any]], **settings: Any) -> Served:
        s = Served(objs, **settings)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_snapshot_queue_and_plan_place_both_pods(served: Callable[..., Served]) -> None:
    s = served(t4_story())
    assert [e.pod.key for e in s.store.queued()] == ["default/flex", "default/t4-only"]
    assert s.planner is not None
    s.planner.start()
    wait_for(lambda: s.planner.plan is not None and s.planner.plan.placed == 2)
    plan = s.planner.plan
    assert planned_node(plan, "default/flex") == "a100-node" and planned_node(plan, "default/t4-only") == "t4-node"
    # The flexible pod arrives first; the plan sends it to the A100, so the T4-only pod still fits.
    scores, best, err = s.cycle(t4_story()[2], ["t4-node", "a100-node"])
    assert (best, err) == ("a100-node", "")
    assert {x["Host"]: x["Score"] for x in scores}["a100-node"] == follow.TOP
    assert max(x["Score"] for x in scores if x["Host"] != "a100-node") < follow.TOP
    assert s.store.state.holder("default/flex").assignment == plan.assignments["default/flex"]
    _, best, err = s.cycle(t4_story()[3], ["t4-node", "a100-node"])
    assert (best, err) == ("t4-node", "")
    assert s.metric("vramfit_queue_binds_total", via="plan") == 2
    assert s.metric("vramfit_queue_binds_total", via="fallback") == 0
    wait_for(lambda: s.metric("vramfit_pending_queue_pods") == 0)


def test_a_standby_does_not_plan_until_it_serves(served: Callable[..., Served]) -> None:
    s = served(t4_story())
    assert s.planner is not None
    serving = threading.Event()
    s.planner.active = serving.is_set
    s.planner.start()
    s.planner.request_replan()
    time.sleep(0.5)  # a planner that ignored `active` would have planned by now (the queue changed)
    assert s.planner.plan is None and s.planner.solves == 0
    serving.set()  # it leads now
    s.planner.request_replan()
    wait_for(lambda: s.planner.plan is not None and s.planner.plan.placed == 2)


def test_without_the_queue_the_flexible_pod_takes_the_t4(served: Callable[..., Served]) -> None:
    s = served(t4_story(), planning=False)
    assert s.planner is None
    assert s.cycle(t4_story()[2], ["t4-node", "a100-node"])[1] == "t4-node"
    assert s.cycle(t4_story()[3], ["t4-node", "a100-node"])[2] == "unschedulable"


def test_stale_plan_falls_back_and_asks_for_a_replan(served: Callable[..., Served]) -> None:
    # plan_repack: the one pod fits, so without it the plan would leave it to the online policy (no units).
    s = served([node("a100-node", A100, 2), pod("a")], plan_repack=True)
    assert s.planner is not None
    plan = s.planner.plan_now()
    planned = plan.assignments["default/a"]
    # A pod outside the plan takes the planned units (bound by someone else, seen by the watch).
    other = pod("intruder", node_name="a100-node",
                assignment={"gpus": [g.to_json() for g in planned.gpus]})
    s.store.apply("pods", "ADDED", other)
    assert s.planner.changed()
    _, best, err = s.cycle(pod("a"), ["a100-node"])
    assert (best, err) == ("a100-node", "")
    got = s.store.state.holder("default/a").assignment
    assert {g.index for g in got.gpus}.isdisjoint({g.index for g in planned.gpus})
    assert s.metric("vramfit_queue_binds_total", via="fallback") == 1
    assert s.metric("vramfit_queue_binds_total", via="plan") == 0


def test_pods_the_plan_leaves_to_the_online_policy_bind_as_without_a_plan(served: Callable[..., Served]) -> None:
    """Without plan_repack, pods of a part where the online placement places every pod get no planned units:
    the verbs place them exactly as with planning off."""
    objs = [node("a100-node", A100, 2), pod("a"), pod("b", created="2026-05-04T10:00:09Z")]
    s = served(objs)
    assert s.planner is not None
    plan = s.planner.plan_now()
    assert plan.assignments == {} and plan.online == {"default/a", "default/b"} and plan.placed == 2
    off = served(objs, planning=False)
    for p in objs[1:]:
        on_scores, on_best, on_err = s.cycle(p, ["a100-node"])
        off_scores, off_best, off_err = off.cycle(p, ["a100-node"])
        assert (on_scores, on_best, on_err) == (off_scores, off_best, off_err) and on_err == ""
        assert s.store.state.holder(f"default/{p['metadata']['name']}").assignment == \
            off.store.state.holder(f"default/{p['metadata']['name']}").assignment
    assert s.metric("vramfit_queue_binds_total", via="unplanned") == 2
    assert s.metric("vramfit_queue_binds_total", via="plan") == 0
    state = s.client.get("/state").json()
    assert state["plan"]["online"] == ["default/a", "default/b"]


def test_unplanned_pods_avoid_planned_units_on_a_tie() -> None:
    scores = [10, 10, 4, 0]
    names = ["n0", "n1", "n2", "n3"]
    assert follow.follow_scores(scores, names, None, {"n0"}).tolist() == [9, 10, 4, 0]
    assert follow.follow_scores(scores, names, None, {"n0", "n1"}).tolist() == [10, 10, 4, 0]
    assert follow.follow_scores(scores, names, "n2").tolist() == [9, 9, 10, 0]
    assert follow.follow_scores(scores, names, "n3").tolist() == [10, 10, 4, 0]  # infeasible: no word
    assert follow.follow_scores(scores, names, "elsewhere").tolist() == [10, 10, 4, 0]


def test_state_metrics_and_post_queue(served: Callable[..., Served]) -> None:
    s = served([node("a100-node", A100, 2)], plan_repack=True)  # planned units for pods that all fit
    assert s.planner is not None
    state = s.client.get("/state").json()
    assert state["plan"]["status"] == "none"
    r = s.client.post("/queue", json=[informer(pod("q1")), informer(pod("q2", created="2026-05-04T10:01:00Z"))])
    assert r.status_code == 200, r.text
    assert [a["pod"] for a in r.json()["added"]] == ["default/q1", "default/q2"]
    assert [e.pod.key for e in s.store.queued()] == ["default/q1", "default/q2"]
    s.planner.plan_now()
    state = s.client.get("/state").json()
    assert state["plan"]["placed"] == 2 and state["plan"]["status"] in ("optimal", "feasible", "greedy")
    assert state["plan"]["assignments"]["default/q1"]["node"] == "a100-node"
    text = s.client.get("/metrics").text
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"vramfit_plan_age_seconds", "vramfit_plan_solve_seconds", "vramfit_plan_status",
            "vramfit_pending_queue_pods", "vramfit_queue_binds"} <= families
    assert s.metric("vramfit_pending_queue_pods") == 2
    assert s.metric("vramfit_plan_status", status=state["plan"]["status"]) == 1
    for bad, why in [(b"{", "JSON"), (json.dumps({"metadata": {}}).encode(), "metadata.name"),
                     (json.dumps({"kind": "Node", "metadata": {"name": "x"}}).encode(), "Pod"),
                     (json.dumps(informer(pod("bound", node_name="a100-node"))).encode(), "nodeName"),
                     (json.dumps({"metadata": {"name": "cpu"}, "spec": {"containers": []}}).encode(), "VRAM"),
                     (json.dumps(informer(pod("bad", models=" , "))).encode(), "gpu-models")]:
        r = s.client.post("/queue", content=bad, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (bad, r.text)
        assert why in r.json()["Error"], r.text


def test_cluster_queue_follows_the_pod_watch(fake_api: Callable[..., FakeApiServer],
                                             fast_backoff: Callable[[], Backoff]) -> None:
    fake = fake_api(nodes=[informer(node("a100-node", A100, 2))],
                    pods=[informer(pod("w1")), informer(pod("w2", created="2026-05-04T10:00:09Z"))])
    other = informer(pod("other-scheduler"))
    other["spec"]["schedulerName"] = "default-scheduler"
    fake.add_pod(other)
    store = Store(CATALOG)
    api = api_client(host=fake.url)
    app = create_app(Settings(plan_repack=True), store, KubeBinder(api))  # planned units though both pods fit
    planner = app.state.services.planner
    assert planner is not None
    source = KubeSource(api, store, backoff=fast_backoff).start()
    try:
        assert source.ready.wait(10)
        wait_for(lambda: [e.pod.key for e in store.queued()] == ["default/w1", "default/w2"])
        planner.start()
        wait_for(lambda: planner.plan is not None and planner.plan.placed == 2)
        fake.delete_pod("default", "w2")
        wait_for(lambda: [e.pod.key for e in store.queued()] == ["default/w1"])
        grant = planner.plan.assignments["default/w1"].gpus[0]
        fake.patch_pod("default", "w1", {"spec": {"nodeName": "a100-node"}, "metadata": {"annotations": {
            "vramfit.io/assignment": json.dumps({"gpus": [grant.to_json()]})}}})
        wait_for(lambda: store.queued() == [])
        wait_for(lambda: planner.plan is not None and planner.plan.queue_size == 0)
    finally:
        planner.stop()
        source.stop()
    assert not planner.running


def test_reserve_assignment_refuses_taken_units() -> None:
    from extender.store import NoFit

    store = Store.from_objects([node("a100-node", A100, 1), pod("p")], CATALOG)
    plan = Planner(store, repack=True).plan_now()
    asg = plan.assignments["default/p"]
    p = store.demand_for("default", "p", "uid-p")
    q = store.demand_for("default", "p", "uid-p")
    assert p is not None and q is not None
    store.reserve_assignment(p, asg)
    assert store.state.holder("default/p").reserved
    with pytest.raises(NoFit):
        store.reserve_assignment(replace(q, key="default/q", uid="uid-q"), asg)


def test_whatif_queue_replays_the_extender_cycle(tmp_path: Any, capsys: Any) -> None:
    from vramfit.cli import main

    story = t4_story()
    (tmp_path / "cluster.json").write_text(json.dumps({"kind": "List", "items": story[:2]}))
    (tmp_path / "pending.json").write_text(json.dumps({"kind": "List", "items": story[2:]}))
    args = ["whatif", "--snapshot", str(tmp_path / "cluster.json"), "--pods", str(tmp_path / "pending.json"),
            "--queue", "--time-limit", "5"]
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["online_placed"] == 1  # online alone: the flexible pod took the T4
    assert doc["summary"]["placed"] == 2 and doc["summary"]["planning"] == "queue"  # the default: as serve does
    assert doc["summary"]["queue"]["placed"] == 2 and doc["summary"]["queue"]["by_plan"] == 2
    assert {p["pod"]: (p["node"], p["via"]) for p in doc["placements_queue"]} == {
        "default/flex": ("a100-node", "plan"), "default/t4-only": ("t4-node", "plan")}
    assert main(args) == 0
    assert "with the queue visible" in capsys.readouterr().out


def test_the_planner_takes_the_live_policy_and_plan_repack_from_the_config(served: Any) -> None:
    s = served(t4_story(), planning=True, plan_repack=False, policy_params={"fgd_share": 0.25})
    assert s.planner is not None and s.planner.repack is False
    assert s.planner.policy is s.svc.extender.policy  # the verbs' own object: its mix and parameters
    assert s.planner.policy.fgd_share == 0.25
    plan = s.planner.plan_now()
    assert plan.placed == 2 and planned_node(plan, "default/t4-only") == "t4-node"
