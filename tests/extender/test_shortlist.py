"""Filter's shortlist (config shortlist_k): the best K fitting nodes by the policy pass, the other fitting nodes
fail saying so, a pod fitting few nodes gets them all, the plan's node stays, and prioritize over the shortlist
ranks first the node it ranks first over every fitting node."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.shortlist_check import Plan, StubPlanner
from extender import wire
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.metrics import Metrics
from extender.service import Extender
from extender.store import Store
from extender.verbs import shortlist
from extender.verbs.filter import Filter
from packing import fit
from packing.catalog import load_catalog
from packing.policies import get_policy

KINDS: dict[str, list[dict[str, Any]]] = {
    "excl": [{"index": i, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"} for i in range(2)],
    "mps": [{"index": i, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mps", "replicas": 4} for i in range(2)],
    "ts": [{"index": i, "product": "NVIDIA-L40S", "mode": "timeslice", "replicas": 4} for i in range(2)],
    "mig": [{"index": i, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mig",
             "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]} for i in range(2)],
}
VRAMS = (4096, 8192, 14336, 20000, 30720)


def node(k: int, kind: str) -> dict[str, Any]:
    name = f"node-{k:03d}"
    return {"kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(100 + k),
                         "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"vramfit.io/gpus": json.dumps(KINDS[kind])}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(j: int, vram: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{j}", "namespace": "default", "uid": f"pod-uid-{j}"},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [{"name": "c", "resources": {
                "requests": {"cpu": "1", "vramfit.io/vram": str(vram)},
                "limits": {"vramfit.io/vram": str(vram)}}}]},
            "status": {"phase": "Pending"}}


class Cluster:
    """An extender on `kinds` nodes, `placed` pods bound by the full-list verbs first (so scores differ)."""

    def __init__(self, kinds: list[str], placed: list[int]) -> None:
        self.store = Store.from_objects([node(k, kind) for k, kind in enumerate(kinds)], load_catalog())
        self.metrics = Metrics(self.store)
        self.ext = Extender(self.store, MemoryBinder(), get_policy("vramfit"), self.metrics, planner=StubPlanner())
        self.names = list(self.store.state.node_names)
        for j, vram in enumerate(placed):
            obj = pod(10_000 + j, vram)
            passed = self.ext.filter(wire.ExtenderArgs(Pod=obj, NodeNames=self.names))["NodeNames"]
            if passed:
                best = self.best(self.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=passed)))
                self.ext.bind(wire.ExtenderBindingArgs(PodName=obj["metadata"]["name"], PodNamespace="default",
                                                       PodUID=obj["metadata"]["uid"], Node=best))

    def shortlisted(self, k: int) -> Filter:
        return Filter(self.ext.shared, self.ext.memory, self.metrics, shortlist_k=k)

    def best(self, answer: bytes) -> str:
        """kube-scheduler's pick from a prioritize answer alone: the highest score, ties by cluster order."""
        rows = self.store.node_index()
        top = max(json.loads(answer), key=lambda h: (h["Score"], -rows[h["Host"]]))
        return str(top["Host"])

    def ranking(self, obj: dict[str, Any]) -> list[str]:
        """Brute force: every fitting node, best first by `policy.score` over the feasible mask, ties by row."""
        state = self.store.state
        demand = self.ext.shared.demand(obj)
        assert demand is not None
        mask = fit.feasible(state, demand, self.ext.policy.whole_gpu).now
        scores = np.asarray(self.ext.policy.score(state, demand, mask), dtype=np.float64)
        rows = sorted(np.flatnonzero(mask).tolist(), key=lambda i: (-scores[i], i))
        return [self.names[i] for i in rows]

    def planner(self) -> StubPlanner:
        planner = self.ext.shared.planner
        assert isinstance(planner, StubPlanner)
        return planner


clusters = st.lists(st.sampled_from(sorted(KINDS)), min_size=8, max_size=40)
placed = st.lists(st.sampled_from(VRAMS), max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=clusters, before=placed, vram=st.sampled_from(VRAMS), k=st.integers(1, 12), by_nodes=st.booleans())
def test_filter_passes_exactly_the_best_k_and_prioritize_picks_the_same(kinds: list[str], before: list[int],
                                                                         vram: int, k: int, by_nodes: bool) -> None:
    c = Cluster(kinds, before)
    obj = pod(1, vram)
    args = (wire.ExtenderArgs(Pod=obj, Nodes=wire.NodeList(items=[node(i, kind) for i, kind in enumerate(kinds)]))
            if by_nodes else wire.ExtenderArgs(Pod=obj, NodeNames=c.names))
    answer = c.shortlisted(k)(args)
    ranked = c.ranking(obj)  # after filter: it teaches a learning policy the pod first
    passed = ([n["metadata"]["name"] for n in answer["Nodes"]["items"]] if by_nodes else answer["NodeNames"])
    failed = answer["FailedNodes"] or {}
    if len(ranked) > 2 * k:
        assert set(passed) == set(ranked[:k])
        # kube-scheduler drops a node missing from the answer: no failed node is listed, none is needed
        assert failed == {} and not answer["FailedAndUnresolvableNodes"]
    else:  # few fit: the full list
        assert set(passed) == set(ranked)
    assert passed == [n for n in c.names if n in set(passed)]  # request order kept
    if ranked:
        full = c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=ranked)))
        short = c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=passed)))
        assert short == full == ranked[0]
        scores = {h["Host"]: h["Score"] for h in json.loads(c.ext.prioritize(wire.ExtenderArgs(Pod=obj,
                                                                                             NodeNames=passed)))}
        assert scores[ranked[0]] == wire_max()


def wire_max() -> int:
    from packing.cycle import MAX_PRIORITY
    return MAX_PRIORITY


def test_key_zero_answers_as_without_a_shortlist() -> None:
    c = Cluster(["excl", "mps", "ts", "mig"] * 10, [8192] * 12)
    args = wire.ExtenderArgs(Pod=pod(1, 4096), NodeNames=c.names)
    assert c.shortlisted(0)(args) == c.ext.filter(args)
    assert len(c.ext.filter(args)["NodeNames"]) == len(c.ranking(pod(1, 4096)))


def test_the_plans_node_is_kept_and_still_ranked_first() -> None:
    c = Cluster(["excl", "mps", "ts", "mig"] * 10, [14336, 4096, 30720] * 4)
    obj = pod(1, 8192)
    demand = c.ext.shared.demand(obj)
    assert demand is not None
    c.ext.filter(wire.ExtenderArgs(Pod=obj, NodeNames=c.names))  # the policy learns the pod before it is ranked
    ranked = c.ranking(obj)
    worst = ranked[-1]  # the planner may place the pod where the online policy would not
    asg = fit.choose_units(c.store.state, worst, demand, False)
    assert asg is not None
    c.planner().plan = Plan({demand.key: asg})
    answer = c.shortlisted(4)(wire.ExtenderArgs(Pod=obj, NodeNames=c.names))
    passed = answer["NodeNames"]
    assert set(passed) == set(ranked[:4]) | {worst}
    full = c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=ranked)))
    assert c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=passed))) == full == worst


def test_the_follow_rules_free_top_node_is_kept_when_the_top_ties_run_past_k() -> None:
    # An empty cluster: every node ties; the first ones hold units planned for other pods, so prioritize drops
    # them one point and picks the first free one, past the K lowest rows.
    c = Cluster(["excl"] * 30, [])
    obj = pod(1, 8192)
    state = c.store.state
    other = [fit.choose_units(state, n, d, False) for n, d in
             ((c.names[i], c.ext.shared.demand(pod(500 + i, 4096))) for i in range(5)) if d is not None]
    c.planner().plan = Plan({f"default/other-{i}": a for i, a in enumerate(other) if a is not None})
    passed = c.shortlisted(3)(wire.ExtenderArgs(Pod=obj, NodeNames=c.names))["NodeNames"]
    assert passed == c.names[:3] + [c.names[5]]
    full = c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=c.names)))
    assert c.best(c.ext.prioritize(wire.ExtenderArgs(Pod=obj, NodeNames=passed))) == full == c.names[5]


def test_a_pod_fitting_few_nodes_gets_them_all() -> None:
    c = Cluster(["excl"] * 6 + ["ts"] * 34, [])
    obj = pod(1, 70000)  # only the A100s hold it
    answer = c.shortlisted(3)(wire.ExtenderArgs(Pod=obj, NodeNames=c.names))
    assert answer["NodeNames"] == c.names[:6]
    assert set(answer["FailedNodes"] or {}) | set(answer["FailedAndUnresolvableNodes"] or {}) == set(c.names[6:])


@given(scores=st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0, np.inf, np.nan]), min_size=1, max_size=40),
       k=st.integers(0, 45), seed=st.integers(0, 2**16))
def test_best_k_is_the_top_of_a_full_sort(scores: list[float], k: int, seed: int) -> None:
    rows = np.arange(len(scores), dtype=np.int64)
    random.Random(seed).shuffle(rows)  # type: ignore[arg-type]
    s = np.asarray(scores, dtype=np.float64)
    keep = shortlist.best_k(s, rows, k)
    key = np.where(np.isnan(s), -np.inf, s)
    brute = sorted(rows.tolist(), key=lambda r: (-key[r], r))[:k]
    assert sorted(rows[keep].tolist()) == sorted(brute)


def test_the_config_key_defaults_on_and_refuses_negatives() -> None:
    assert Settings().shortlist_k > 0
    assert Settings(shortlist_k=0).shortlist_k == 0
    try:
        Settings(shortlist_k=-1)
    except ValueError:
        pass
    else:
        raise AssertionError("shortlist_k=-1 accepted")
