"""First-install mistakes the CLI answers (issue 27): nodes without the node agent, unknown fields inside a
Node or a Pod, pending pods the webhook would refuse or that appear twice, flags that answer nothing, the
default what-if answering as `vramfit serve` does, and `inspect` against a live cluster (the API stand-in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.apiserver import FakeApiServer, namespace_object
from queue_objects import A100, T4

from kubeio.files import load_snapshot
from vramfit.cli import main
from vramfit.demo import DEMO_CLUSTER, DEMO_PODS, compare
from vramfit.whatif import load_catalog_arg

AGENT = {"vramfit.io/gpu": "8"}


def node(name: str, product: str = A100, n: int = 1, agent: bool = True) -> dict[str, Any]:
    gpus = [{"index": i, "product": product, "mode": "exclusive"} for i in range(n)]
    alloc: dict[str, str] = {"cpu": "64", "memory": "512Gi", **(AGENT if agent else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "status": {"allocatable": alloc, "capacity": alloc}}


def pod(name: str, vram: int = 8000, namespace: str = "default", node_name: str | None = None,
        annotations: dict[str, str] | None = None, spec_extra: dict[str, Any] | None = None,
        limits: bool = True) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"vramfit.io/vram": str(vram)}}
    if limits:
        res["limits"] = {"vramfit.io/vram": str(vram)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox", "resources": res}],
                            **(spec_extra or {})}
    if node_name:
        spec["nodeName"] = node_name
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                        "annotations": dict(annotations or {})},
                           "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}
    return obj


def write(tmp_path: Path, name: str, objs: list[dict[str, Any]]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def whatif_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = cli(capsys, "whatif", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------------------- 27.4: the agent rule
def test_a_gpu_node_without_the_agent_is_not_counted_and_is_named(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    snap = write(tmp_path, "cluster.yaml", [node("served"), node("operator-only", agent=False)])
    pods = write(tmp_path, "pending.yaml", [pod("a", 70000), pod("b", 70000)])
    doc = whatif_json(capsys, "--snapshot", snap, "--pods", pods)
    # kube-scheduler never offers operator-only to vramfit pods: the second pod waits, as it would live.
    assert [p["node"] for p in doc["placements"]] == ["served", None]
    assert doc["nodes"]["counted"] == ["served"] and list(doc["nodes"]["not_counted"]) == ["operator-only"]
    assert any("operator-only not counted" in w and "vramfit.io/gpu" in w for w in doc["warnings"])
    cap = whatif_json(capsys, "--snapshot", snap, "--capacity", "70000")
    assert cap["capacity"]["total"] == 1 and "operator-only" not in cap["capacity"]["nodes"]


def test_a_cluster_before_install_counts_every_node_and_says_so(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    snap = write(tmp_path, "cluster.yaml", [node("n1", agent=False), node("n2", agent=False)])
    cap = whatif_json(capsys, "--snapshot", snap, "--capacity", "70000")
    assert cap["capacity"]["total"] == 2 and cap["nodes"]["counted"] == ["n1", "n2"]
    assert any("no node advertises vramfit.io/gpu" in w for w in cap["warnings"])


def test_the_demo_cluster_has_vramfit_installed() -> None:
    snap = load_snapshot(str(DEMO_CLUSTER), load_catalog_arg(None))
    assert snap.unserved == {} and snap.warnings == []


# ---------------------------------------------------------------------------------------- 27.10: unknown fields
def test_a_typo_of_node_name_is_a_warning_with_did_you_mean(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    typo = pod("runner", 70000)
    typo["spec"]["nodeNmae"] = "n1"
    typo["status"]["phase"] = "Running"
    typo["metadata"]["annotation"] = {}
    typo["spec"]["containers"][0]["resources"]["limit"] = {}
    snap = write(tmp_path, "cluster.yaml", [node("n1"), typo])
    code, _, err = cli(capsys, "whatif", "--snapshot", snap, "--capacity", "70000")
    assert code == 0
    assert f"{snap}: items[1] (pod default/runner): field spec.nodeNmae: unknown to Kubernetes (did you mean " \
           "nodeName?)" in err
    assert "field metadata.annotation: unknown to Kubernetes (did you mean annotations?)" in err
    assert "field spec.containers[0].resources.limit: unknown to Kubernetes (did you mean limits?)" in err
    # Node fields too, by the API's own names.
    bad = node("n2")
    bad["spec"] = {"unschedulabel": True}
    snap = write(tmp_path, "nodes.yaml", [bad])
    code, _, err = cli(capsys, "whatif", "--snapshot", snap, "--capacity", "1Gi")
    assert code == 0 and "field spec.unschedulabel: unknown to Kubernetes (did you mean unschedulable?)" in err


# ---------------------------------------------------------------------------------------- 27.11: pending pods
@pytest.mark.parametrize(("pods", "expect"), [
    ([pod("a"), pod("a")], ["items[1] (pod default/a)", "field metadata.name", "already at items[0]"]),
    ([pod("a", limits=False)], ["pod default/a", "field spec.containers[0].resources.limits[vramfit.io/vram]",
                                "missing"]),
    ([pod("a", annotations={"vramfit.io/gpu-models": "A10O"})],
     ["pod default/a", "field metadata.annotations[vramfit.io/gpu-models]"]),
])
def test_pending_pods_the_cluster_would_refuse_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          pods: list[dict[str, Any]], expect: list[str]) -> None:
    snap = write(tmp_path, "cluster.yaml", [node("n1", n=2)])
    path = write(tmp_path, "pending.yaml", pods)
    for extra in ((), ("--online",)):
        code, out, err = cli(capsys, "whatif", "--snapshot", snap, "--pods", path, *extra)
        assert code == 2 and out == "" and len(err.splitlines()) == 1
        assert err.count(path) == 1 and all(e in err for e in expect), err


def test_a_pending_pod_named_as_a_running_one_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assignment = json.dumps({"gpus": [{"index": 0, "mig": None, "vram_mib": 8000}]})
    snap = write(tmp_path, "cluster.yaml", [node("n1", n=2), pod("a", node_name="n1",
                                                                 annotations={"vramfit.io/assignment": assignment})])
    path = write(tmp_path, "pending.yaml", [pod("a")])
    code, _, err = cli(capsys, "whatif", "--snapshot", snap, "--pods", path)
    assert code == 2 and "pod default/a already runs on n1" in err and "field metadata.name" in err


@pytest.mark.parametrize(("argv", "flag"), [
    (("--pods", str(DEMO_PODS), "--tenant", "team-a"), "--tenant"),
    (("--pods", str(DEMO_PODS), "--isolation", "hardware"), "--isolation"),
    (("--pods", str(DEMO_PODS), "--gpus", "2"), "--gpus"),
    (("--capacity", "14Gi", "--policy", "best-fit"), "--policy"),
    (("--capacity", "14Gi", "--online"), "--online"),
    (("--capacity", "14Gi", "--time-limit", "3"), "--time-limit"),
    (("--pods", str(DEMO_PODS), "--online", "--time-limit", "3"), "--time-limit"),
])
def test_flags_that_answer_nothing_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                                    flag: str) -> None:
    code, out, err = cli(capsys, "whatif", "--snapshot", str(DEMO_CLUSTER), *argv)
    assert code == 2 and out == "" and f"field {flag}:" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------- 27.12: as serve does
def test_the_default_answer_plans_the_queue_as_serve_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The flexible pod, first in line, would take the only T4 online; the plan gives it the A100.
    snap = write(tmp_path, "cluster.yaml", [node("t4-node", T4), node("a100-node", A100)])
    path = write(tmp_path, "pending.yaml", [pod("flex", annotations={"vramfit.io/gpu-models": f"{T4},{A100}"}),
                                            pod("t4-only", annotations={"vramfit.io/gpu-models": T4})])
    doc = whatif_json(capsys, "--snapshot", snap, "--pods", path)
    assert doc["summary"]["planning"] == "queue" and doc["summary"]["placed"] == 2
    assert doc["summary"]["online_placed"] == 1 and doc["summary"]["by_plan"] == 2
    assert {p["pod"]: p["node"] for p in doc["placements"]} == {"default/flex": "a100-node",
                                                                "default/t4-only": "t4-node"}
    online = whatif_json(capsys, "--snapshot", snap, "--pods", path, "--online")
    assert online["summary"]["planning"] == "off" and online["summary"]["placed"] == 1
    left = next(p for p in online["placements"] if p["node"] is None)
    assert left["reason"].startswith("0/2 nodes fit: ") and len(left["reason"]) > len("0/2 nodes fit: ")
    code, table, _ = cli(capsys, "whatif", "--snapshot", snap, "--pods", path)
    assert code == 0 and "queue planned then followed as `vramfit serve` does" in table


def test_the_demo_answers_as_serve_does() -> None:
    runs = compare("vramfit")
    assert runs["vramfit"]["summary"]["planning"] == "queue"
    assert runs["whole-gpu"]["summary"]["planning"] == "off"  # the baseline is a policy, not the extender
    assert compare("vramfit", planning=False)["vramfit"]["summary"]["planning"] == "off"


# ---------------------------------------------------------------------------------------- inspect, live (27.4, 27.5)
def kubeconfig(tmp_path: Path, urls: dict[str, str], current: str) -> str:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": current,
           "clusters": [{"name": n, "cluster": {"server": u}} for n, u in urls.items()],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in urls]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_inspect_live_counts_served_nodes_reads_tenancy_and_takes_context_and_namespace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = FakeApiServer(nodes=[node("elsewhere")]).start()
    fake = FakeApiServer(nodes=[node("served"), node("operator-only", agent=False)],
                         pods=[pod("wait-a", 70000, namespace="team-a"), pod("wait-b", 90000, namespace="team-b")],
                         namespaces=[namespace_object("team-a", labels={"vramfit.io/tenant": "blue"}),
                                     namespace_object("team-b")]).start()
    try:
        cfg = kubeconfig(tmp_path, {"other": other.url, "mine": fake.url}, current="other")
        code, out, err = cli(capsys, "inspect", "--kubeconfig", cfg, "--context", "mine")
        assert code == 0, err
        assert "served" in out and "elsewhere" not in out
        # Only the served node is capacity; the other is listed apart, with why.
        assert "NOT COUNTED AS VRAMFIT CAPACITY\n  operator-only: no vramfit.io/gpu" in out
        assert "operator-only" in err  # and warned once
        assert "default/" not in out and "team-a/wait-a" in out and "team-b/wait-b" in out
        assert "blue" in out  # the tenant comes from the Namespace's label, as the extender reads it
        code, out, _ = cli(capsys, "inspect", "--kubeconfig", cfg, "--context", "mine", "-n", "team-b")
        assert code == 0 and "team-b/wait-b" in out and "team-a/wait-a" not in out
        code, out, err = cli(capsys, "inspect", "--kubeconfig", cfg, "--context", "nope")
        assert code == 2 and out == "" and "--context nope" in err and cfg in err
    finally:
        fake.stop()
        other.stop()


def test_inspect_context_with_a_snapshot_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "inspect", "--snapshot", str(DEMO_CLUSTER), "--context", "x")
    assert code == 2 and out == "" and "--context" in err
