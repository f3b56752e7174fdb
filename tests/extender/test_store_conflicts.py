"""No pod is forgotten: a bound pod whose units clash with another holder's (or are not on its node any more)
is kept as conflicted, its units are offered to no other pod, and it is recorded in the same update that frees
them. A restart (a new Store fed the same API objects, in any order) rebuilds the same holders and conflicts."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest
from prometheus_client import generate_latest
from store_helpers import flush_reports

from extender.metrics import Metrics
from extender.store import Conflict, NoFit, Store
from packing import fit
from packing.catalog import load_catalog
from packing.model import GpuGrant, Isolation, PodDemand
from packing.policies import get_policy

CAT = load_catalog()
H100 = "NVIDIA-H100-80GB-HBM3"
FULL_MIG = [{"profile": "7g.80gb", "start": 0}]
SMALL_MIG = [{"profile": "1g.10gb", "start": s} for s in range(7)]


def node(name: str = "n1", mig: list[dict[str, Any]] | None = None, extra_gpus: int = 1) -> dict[str, Any]:
    """GPU 0 in MIG mode (one 7g.80gb instance unless told), then `extra_gpus` exclusive H100s."""
    gpus: list[dict[str, Any]] = [{"index": 0, "product": H100, "mode": "mig", "mig": mig or FULL_MIG}]
    gpus += [{"index": i, "product": H100, "mode": "exclusive"} for i in range(1, 1 + extra_gpus)]
    return {"kind": "Node", "metadata": {"name": name, "annotations": {"vramfit.io/gpus": json.dumps(gpus)}}}


def bound(name: str, gpus: list[dict[str, Any]], bound_at: str, node_name: str = "n1", ns: str = "team-a",
          vram: int = 70000) -> dict[str, Any]:
    """A vramfit pod as the API shows it after its bind: assignment and bound-at annotations, running."""
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "1",
                         "creationTimestamp": "2026-05-04T08:00:00Z",
                         "annotations": {"vramfit.io/assignment": json.dumps({"gpus": gpus}),
                                         "vramfit.io/bound-at": bound_at, "vramfit.io/isolation": "hardware",
                                         "vramfit.io/gpus": str(len(gpus))}},
            "spec": {"nodeName": node_name, "schedulerName": "vramfit-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {"vramfit.io/vram": str(vram)}}}]},
            "status": {"phase": "Running", "startTime": bound_at}}


SEVEN_G = [{"index": 0, "mig": "7g.80gb@0", "vram_mib": 70000}]


def pod_a() -> dict[str, Any]:
    return bound("a", SEVEN_G, "2026-05-04T09:00:00Z")


def pod_b() -> dict[str, Any]:
    return bound("b", SEVEN_G, "2026-05-04T09:05:00Z")  # bound after a: a got the instance first


def big() -> PodDemand:
    return PodDemand(key="team-c/big", vram_mib=60000, tenant="team-c", isolation=Isolation.HARDWARE, uid="uid-big")


def instance_free(store: Store) -> bool:
    """Would a new pod be offered the 7g.80gb instance (or any unit of GPU 0)?"""
    with store.lock:
        return any(o.grant.index == 0 for o in fit.explain(store.state, "n1", big()).options)


def holder_unit(store: Store, key: str) -> tuple[GpuGrant, ...] | None:
    h = store.state.holder(key)
    return None if h is None else h.assignment.gpus


def view(store: Store) -> tuple[list[tuple[str, str, tuple[GpuGrant, ...], bool]], list[tuple[str, str, str]]]:
    """Everything a restart must rebuild: who holds which units, and who is conflicted where and why."""
    with store.lock:
        holders = sorted((h.pod.key, h.assignment.node, h.assignment.gpus, h.reserved)
                         for h in store.state.holders())
        conflicts = sorted((c.key, c.node, c.reason) for c in store.conflicted.values())
    return holders, conflicts


def test_two_pods_claiming_one_instance_one_holds_one_conflicted_then_it_takes_over() -> None:
    reports: list[Conflict] = []
    store = Store(CAT, on_conflict=reports.append)
    store.replace("nodes", [node(extra_gpus=0)])  # the 7g.80gb instance is the node's only unit
    store.replace("pods", [pod_a(), pod_b()])
    assert holder_unit(store, "team-a/a") == (GpuGrant(0, 70000, mig="7g.80gb@0"),)
    assert store.state.holder("team-a/b") is None
    assert list(store.conflicted) == ["team-a/b"]
    (entry,) = store.conflicted_view()
    assert entry["node"] == "n1" and "7g.80gb@0 is held by team-a/a" in entry["reason"] and entry["held"] == []
    # The instance is not offered: filter says full, and a bind cannot book it.
    assert not instance_free(store)
    with pytest.raises(NoFit):
        store.reserve(big(), "n1", get_policy("best-fit"))
    # Reported once, as a warning Event would be, off the store's lock.
    assert flush_reports(store)
    assert [(c.namespace, c.name, c.uid) for c in reports] == [("team-a", "b", "uid-b")]
    assert "7g.80gb@0" in reports[0].message and "offered to another pod" in reports[0].message
    text = generate_latest(Metrics(store).registry).decode()
    assert "vramfit_conflicted_pods 1.0" in text
    # The holder is deleted: in that same update the conflicted pod holds the instance.
    gen = store.generation
    store.apply("pods", "DELETED", pod_a())
    assert store.generation == gen + 1
    assert holder_unit(store, "team-a/b") == (GpuGrant(0, 70000, mig="7g.80gb@0"),)
    assert store.conflicted == {} and not instance_free(store)
    assert "vramfit_conflicted_pods 0.0" in generate_latest(Metrics(store).registry).decode()
    flush_reports(store)
    assert len(reports) == 1  # the clearing is no new conflict


def test_the_earlier_bound_pod_holds_whatever_order_the_events_come_in() -> None:
    first = Store(CAT)
    first.replace("nodes", [node()])
    first.replace("pods", [])
    first.apply("pods", "ADDED", pod_b())  # b is seen first, but a was bound first
    assert holder_unit(first, "team-a/b") is not None
    first.apply("pods", "ADDED", pod_a())
    assert holder_unit(first, "team-a/a") is not None and list(first.conflicted) == ["team-a/b"]
    second = Store.from_objects([node(), pod_b(), pod_a()], CAT)
    assert view(second) == view(first)


def test_the_unit_is_never_seen_free_while_its_holder_changes() -> None:
    store = Store(CAT)
    store.replace("nodes", [node()])
    store.replace("pods", [pod_a(), pod_b()])
    seen_free: list[int] = []
    stop = threading.Event()

    def poll() -> None:  # a filter running beside the watch
        while not stop.is_set():
            if instance_free(store):
                seen_free.append(store.generation)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(150):
            store.apply("pods", "DELETED", pod_a())  # b takes over
            store.apply("pods", "ADDED", pod_a())  # a is back (bound earlier): a holds, b waits again
    finally:
        stop.set()
        t.join()
    assert seen_free == []
    assert holder_unit(store, "team-a/a") is not None and list(store.conflicted) == ["team-a/b"]


def test_restart_rebuilds_the_same_holders_and_conflicts() -> None:
    nodes = [node("n1"), node("n2", extra_gpus=2)]
    pods = [
        pod_a(), pod_b(),
        bound("c", [{"index": 0, "mig": "7g.80gb@0", "vram_mib": 70000}, {"index": 1, "vram_mib": 70000}],
              "2026-05-04T09:10:00Z", ns="team-c"),  # clashes on GPU 0; GPU 1 it holds meanwhile
        bound("d", [{"index": 2, "vram_mib": 70000}], "2026-05-04T09:01:00Z", node_name="n2"),
        bound("e", [{"index": 2, "vram_mib": 70000}], "2026-05-04T09:02:00Z", node_name="n2", ns="team-e"),
        bound("f", [{"index": 1, "vram_mib": 70000}], "2026-05-04T09:03:00Z", node_name="n2"),
    ]
    live = Store(CAT)
    live.replace("nodes", nodes)
    live.replace("pods", [])
    for obj in reversed(pods):  # the watch delivers them in some order of its own
        live.apply("pods", "ADDED", copy.deepcopy(obj))
    assert sorted(live.conflicted) == ["team-a/b", "team-c/c", "team-e/e"]
    assert live.conflicted["team-c/c"].held == (GpuGrant(1, 70000),)
    for order in (pods, list(reversed(pods)), sorted(pods, key=lambda p: p["metadata"]["namespace"])):
        fresh = Store.from_objects([*nodes, *copy.deepcopy(order)], CAT)
        assert view(fresh) == view(live)
    # The same after pods leave: d's unit goes to e in the deleting update, on both.
    live.apply("pods", "DELETED", pods[3])
    assert holder_unit(live, "team-e/e") == (GpuGrant(2, 70000),)
    fresh = Store.from_objects([*nodes, *[p for p in pods if p is not pods[3]]], CAT)
    assert view(fresh) == view(live)


def test_a_partly_clashing_pod_keeps_its_other_units_booked() -> None:
    c = bound("c", [{"index": 0, "mig": "7g.80gb@0", "vram_mib": 70000}, {"index": 1, "vram_mib": 70000}],
              "2026-05-04T09:10:00Z", ns="team-c")
    store = Store.from_objects([node(), pod_a(), c], CAT)
    assert holder_unit(store, "team-c/c") == (GpuGrant(1, 70000),)  # the exclusive GPU: not offered to anyone
    whole = PodDemand(key="team-z/z", vram_mib=1000, tenant="team-z", uid="uid-z")
    assert not fit.explain(store.state, "n1", whole).fits
    store.apply("pods", "DELETED", pod_a())
    assert holder_unit(store, "team-c/c") == (GpuGrant(0, 70000, mig="7g.80gb@0"), GpuGrant(1, 70000))
    assert store.conflicted == {}


def test_node_repartition_displaces_and_the_old_layout_brings_it_back() -> None:
    reports: list[Conflict] = []
    store = Store.from_objects([node(), pod_a()], CAT, on_conflict=reports.append)
    assert holder_unit(store, "team-a/a") is not None
    store.apply("nodes", "MODIFIED", node(mig=SMALL_MIG))  # re-partitioned under it
    assert store.state.holder("team-a/a") is None
    (entry,) = store.conflicted_view()
    assert entry["pod"] == "team-a/a" and "no MIG instance 7g.80gb@0" in entry["reason"]
    flush_reports(store)
    assert [c.key for c in reports] == ["team-a/a"]
    # Its instance does not exist any more: the new ones are not its units, and may be offered.
    small = PodDemand(key="team-c/s", vram_mib=5000, tenant="team-c", isolation=Isolation.HARDWARE, uid="uid-s")
    assert fit.explain(store.state, "n1", small).fits
    store.apply("nodes", "MODIFIED", node())
    assert holder_unit(store, "team-a/a") == (GpuGrant(0, 70000, mig="7g.80gb@0"),)
    assert store.conflicted == {}


def test_pod_waiting_for_a_node_without_its_units_becomes_conflicted() -> None:
    store = Store(CAT)
    store.replace("nodes", [])
    beyond = bound("g", [{"index": 3, "vram_mib": 70000}], "2026-05-04T09:00:00Z", node_name="n3")
    store.replace("pods", [beyond])
    assert store.waiting_view() == {"n3": ["team-a/g"]} and store.conflicted == {}
    store.apply("nodes", "ADDED", node("n3"))  # GPUs 0 and 1 only
    assert store.waiting_view() == {}
    (entry,) = store.conflicted_view()
    assert entry["node"] == "n3" and "has no GPU 3" in entry["reason"]
    # The node leaves and returns: the pod waits, then is conflicted again; never forgotten.
    store.apply("nodes", "DELETED", node("n3"))
    assert store.conflicted == {} and store.waiting_view() == {"n3": ["team-a/g"]}
    store.apply("nodes", "ADDED", node("n3", extra_gpus=3))
    assert holder_unit(store, "team-a/g") == (GpuGrant(3, 70000),) and store.conflicted == {}


def test_a_node_whose_description_breaks_keeps_its_pods_for_its_return() -> None:
    store = Store.from_objects([node(), pod_a()], CAT)
    broken = node()
    broken["metadata"]["annotations"]["vramfit.io/gpus"] = "[not json"
    store.apply("nodes", "MODIFIED", broken)
    assert "n1" in store.bad_nodes and store.waiting_view() == {"n1": ["team-a/a"]}
    store.apply("nodes", "MODIFIED", node())
    assert holder_unit(store, "team-a/a") is not None


def test_a_clash_with_a_reservation_clears_when_the_bind_fails() -> None:
    store = Store.from_objects([node()], CAT)
    pending = PodDemand(key="team-c/big", vram_mib=60000, tenant="team-c", isolation=Isolation.HARDWARE,
                        uid="uid-big")
    assignment = store.reserve(pending, "n1", get_policy("best-fit"))
    assert assignment.gpus[0].mig == "7g.80gb@0"
    store.apply("pods", "ADDED", pod_a())  # bound by someone else onto the reserved instance
    assert list(store.conflicted) == ["team-a/a"]
    store.release("uid-big")  # the bind failed: the instance goes to the pod that really runs on it
    assert holder_unit(store, "team-a/a") == (GpuGrant(0, 70000, mig="7g.80gb@0"),)
    assert store.conflicted == {}


def test_reports_found_before_the_callback_is_set_are_delivered_and_failures_are_contained() -> None:
    store = Store.from_objects([node(), pod_a(), pod_b()], CAT)
    got: list[str] = []

    def flaky(c: Conflict) -> None:
        got.append(c.key)
        raise RuntimeError("API down")

    store.on_conflict = flaky
    assert flush_reports(store)
    assert got == ["team-a/b"]
    store.apply("pods", "ADDED", bound("h", SEVEN_G, "2026-05-04T09:20:00Z"))
    assert flush_reports(store)
    assert got == ["team-a/b", "team-a/h"]


def test_a_conflicted_pod_that_finishes_or_is_deleted_leaves_the_list() -> None:
    store = Store.from_objects([node(), pod_a(), pod_b()], CAT)
    done = pod_b()
    done["status"]["phase"] = "Succeeded"
    store.apply("pods", "MODIFIED", done)
    assert store.conflicted == {}
    store.apply("pods", "DELETED", done)
    store.apply("pods", "DELETED", pod_a())
    assert store.state.holders() == [] and instance_free(store)


def test_state_shows_the_conflicted_pod() -> None:
    from extender.app import state_view

    store = Store(CAT)
    store.replace("nodes", [node()])
    store.replace("pods", [pod_a(), pod_b()])
    shown = state_view(store)["conflicted"]
    assert [c["pod"] for c in shown] == ["team-a/b"]  # the later-bound one; a holds the instance
    assert "team-a/a" in shown[0]["reason"]
