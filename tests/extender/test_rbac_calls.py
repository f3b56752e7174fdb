"""Least privilege, checked against the code: every API call the extender and the node agent make (recorded by
the API stand-in while they run their real paths) is granted to their ServiceAccount, and every grant is used.
The extender runs in DRA mode (the manifests hold the DRA role: `dra` is not false by default), so its allocator's
calls are checked too."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import yaml
from dra_builders import GPU_CLASS, ONE_GPU_SLICE, gated_pod
from dra_builders import claim as new_claim
from fakes.apiserver import FakeApiServer, Recorded, status

from benchmarks.local_server import LocalServer
from extender.config import Settings
from extender.leader import LeaseConfig
from extender.replica import cluster_replica
from kubeio.client import api_client
from kubeio.reflector import Backoff
from nodeagent.agent import AgentOptions, NodeAgent
from nodeagent.config import AgentConfig
from nodeagent.inventory import FileInventory
from nodeagent.pods import ApiPods
from nodeagent.publish import KubePublisher
from nodeagent.reconcile import Divergence
from packing.catalog import Catalog
from packing.dra.objects import FINALIZER

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def granted(service_account: str) -> set[Grant]:
    """What the manifests' (Cluster)RoleBindings give this ServiceAccount."""
    docs = [d for p in sorted(MANIFESTS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[Grant] = set()
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == service_account for s in b["subjects"]):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for rule in role["rules"]:
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


# Discovery (`GET /api`, `/apis`, `/apis/{group}/{version}`) is not a resource request: the default ClusterRoles
# system:discovery and system:basic-user let every authenticated user read it, so no grant of ours is involved.
def _discovery(parts: list[str]) -> bool:
    return (parts[0] == "api" and len(parts) <= 2) or (parts[0] == "apis" and len(parts) <= 3)


# With the DRAResourceClaimGranularStatusAuthorization gate on, the API server also authorizes a write of
# `resourceclaims/status` as the synthetic subresource `resourceclaims/binding` with the same verb (no request of
# its own; see the chart's DRA role): the status write uses that grant too.
IMPLIED = {("resource.k8s.io", "resourceclaims/status", v): ("resource.k8s.io", "resourceclaims/binding", v)
           for v in ("update", "patch")}


def called(requests: list[Recorded]) -> set[Grant]:
    """Each recorded request as the authorizer sees it: (apiGroup, resource[/subresource], verb)."""
    out: set[Grant] = set()
    for r in requests:
        parts = [unquote(p) for p in r.path.strip("/").split("/")]
        if r.method == "GET" and _discovery(parts):
            continue
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if len(rest) > 2 and rest[0] == "namespaces":  # a namespaced path; /namespaces[/{name}] are Namespaces
            rest = rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        named = len(rest) > 1
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(r.method)
        if verb is None:
            verb = "watch" if r.query.get("watch") == ["true"] else ("get" if named else "list")
        out.add((group, resource, verb))
        if (group, resource, verb) in IMPLIED:
            out.add(IMPLIED[(group, resource, verb)])
    return out


def wait(cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def node() -> dict[str, Any]:
    gpus = [{"index": 0, "uuid": "GPU-1", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "annotations": {"vramfit.io/gpus": json.dumps(gpus)}},
            "status": {"allocatable": {"vramfit.io/gpu": "1"}}}  # the node agent runs there


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"schedulerName": "vramfit-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"vramfit.io/vram": "4096", "vramfit.io/gpu": "1"}}}]}}


# DRA mode: one node whose one whole GPU the driver publishes, the class vramfit allocates, claims and gated pods.

def exercise_dra(fake: FakeApiServer) -> None:
    """The allocator's every kind of write, through its own thread: allocate (finalizer update, status update, pod
    update without the gate), cannot place (Event, pods/status patch), deallocate (status update, finalizer off)."""
    fake.add_claim(new_claim("team-a", "whole"))
    fake.add_pod(gated_pod("team-a", "d1", claim="whole"))

    def allocated() -> bool:
        claim, pod = fake.get_claim("team-a", "whole"), fake.get_pod("team-a", "d1")
        return bool(claim and (claim.get("status") or {}).get("allocation")) and not (pod or {})["spec"].get(
            "schedulingGates")

    wait(allocated)
    assert FINALIZER in fake.get_claim("team-a", "whole")["metadata"]["finalizers"]  # type: ignore[index]
    fake.add_claim(new_claim("team-a", "huge", memory="500Gi"))  # more memory than any device has
    fake.add_pod(gated_pod("team-a", "d2", claim="huge"))
    wait(lambda: any(c.get("type") == "vramfit.io/ClaimsAllocated"
                     for c in (fake.get_pod("team-a", "d2") or {}).get("status", {}).get("conditions", [])))
    assert any(e["reason"] == "FailedAllocation" for e in fake.events_posted())
    fake.delete_pod("team-a", "d1")  # before kube-scheduler bound it: the claim is given back

    def released() -> bool:
        claim = fake.get_claim("team-a", "whole") or {}
        return not (claim.get("status") or {}).get("allocation") and FINALIZER not in (
            claim["metadata"].get("finalizers") or ())

    wait(released)


def test_the_extenders_calls_are_exactly_its_grants(catalog: Catalog, fast_backoff: Callable[[], Backoff]) -> None:
    fake = FakeApiServer(nodes=[node()]).start()
    fake.add_slice(ONE_GPU_SLICE)
    fake.add_device_class(GPU_CLASS)
    try:
        lease = LeaseConfig(namespace="vramfit-system", identity="r1", lease_duration_s=1.5, renew_deadline_s=1.0,
                            retry_period_s=0.2)
        replica = cluster_replica(api_client(host=fake.url), Settings(dra=True), catalog, lease=lease,
                                  backoff=fast_backoff).start()
        with LocalServer(replica.asgi) as server, httpx.Client(base_url=server.url, timeout=20) as c:
            wait(lambda: c.get("/readyz").status_code == 200)
            p = fake.add_pod(pod("p1"))
            wait(lambda: "team-a/p1" in replica.store._pods)  # noqa: SLF001
            assert c.post("/filter", json={"Pod": p, "NodeNames": ["n1"]}).json()["NodeNames"] == ["n1"]
            # The pod changed after the store saw it: the Binding's resourceVersion precondition fails once,
            # the binder re-reads the pod (get) and binds again; a VramfitAssigned Event follows.
            stale = [True]

            def once(rec: Recorded) -> tuple[int, dict[str, Any]] | None:
                if not stale:
                    return None
                stale.clear()
                return 409, status(409, "Conflict", 'Operation cannot be fulfilled on pods "p1": Precondition '
                                   "failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: 2")

            fake.on_binding = once
            out = c.post("/bind", json={"PodName": "p1", "PodNamespace": "team-a", "PodUID": p["metadata"]["uid"],
                                        "Node": "n1"}).json()
            assert out == {"Error": ""}
            exercise_dra(fake)
        replica.stop(release=True)  # hands the Lease back: get + update
    finally:
        fake.stop()
    calls = called(fake.requests)
    assert calls == granted("vramfit"), (sorted(calls), sorted(granted("vramfit")))


def test_the_node_agents_calls_are_exactly_its_grants(tmp_path: Path) -> None:
    fake = FakeApiServer(nodes=[{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}]).start()
    try:
        inventory = tmp_path / "gpus.json"
        inventory.write_text(json.dumps(json.loads(node()["metadata"]["annotations"]["vramfit.io/gpus"])))
        api = api_client(host=fake.url)
        pods = ApiPods(api, "n1").start()
        agent = NodeAgent(AgentOptions(node_name="n1", plugin_dir=str(tmp_path / "dp"), pod_resources_socket=None,
                                       state_dir=None),
                          AgentConfig(), FileInventory(inventory), pods, KubePublisher(api, "n1"))
        (tmp_path / "dp").mkdir()
        agent.refresh_inventory()  # publishes the node annotations (patch)
        pods.refresh()  # Allocate's re-read (list, field-selected)
        wait(lambda: pods.sink.synced.is_set())  # the watch (list + watch)
        agent._report_divergence(Divergence("team-a", "p1", "c", ("GPU-1::0",), None))  # noqa: SLF001 - an Event
        wait(lambda: any(r.query.get("watch") == ["true"] for r in fake.requests))
        pods.stop()
    finally:
        fake.stop()
    assert fake.get_node("n1") is not None
    calls = called(fake.requests)
    assert calls == granted("vramfit-node"), (sorted(calls), sorted(granted("vramfit-node")))
    # Read-only on pods, and every read of pods is selected to its own node.
    assert all("spec.nodeName=n1" in (r.query.get("fieldSelector") or [""])[0]
               for r in fake.requests if r.path.endswith("/pods"))


def test_discovery_needs_no_grant_and_a_claim_status_write_is_also_a_binding_write() -> None:
    def rec(method: str, path: str) -> Recorded:
        return Recorded(method, path, {}, {}, b"")

    assert called([rec("GET", "/api"), rec("GET", "/apis"), rec("GET", "/apis/resource.k8s.io/v1/"),
                   rec("GET", "/api/v1")]) == set()
    claim = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c1"
    assert called([rec("PUT", claim + "/status")]) == {("resource.k8s.io", "resourceclaims/status", "update"),
                                                        ("resource.k8s.io", "resourceclaims/binding", "update")}
    assert called([rec("PATCH", claim + "/status")]) == {("resource.k8s.io", "resourceclaims/status", "patch"),
                                                          ("resource.k8s.io", "resourceclaims/binding", "patch")}
    assert called([rec("PUT", claim)]) == {("resource.k8s.io", "resourceclaims", "update")}
