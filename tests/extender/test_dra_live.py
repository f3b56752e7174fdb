"""vramfit as the DRA allocator against the fake API server (resource.k8s.io/v1 as the real server behaves):
gate -> finalizer (plain update) -> allocation (status, resourceVersion) -> gate removed -> kube-scheduler (its
emulation) reserves and binds; restart rebuilds the books from the claims; a pod deleted before binding gives its
claim back; a pod that does not fit keeps its gate and says why."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dra_builders import claim as new_claim
from dra_builders import gated_pod
from fakes.apiserver import FakeApiServer, parse_field_selector
from fakes.dra_controllers import SchedulerEmulator, create_template_claims
from fakes.dra_schema import validate_object
from waiting import wait_for

from extender.dra.allocator import DraAllocator
from extender.dra.writer import CONDITION, ClaimWriter
from extender.kube import KubeSource
from extender.store import Store
from kubeio.client import api_client
from kubeio.reflector import DRA_KINDS, KINDS, Backoff
from packing.catalog import load_catalog
from packing.dra.objects import FINALIZER, GATE
from packing.policies import get_policy

FIXTURES = Path(__file__).parents[1] / "fixtures" / "dra"
_ALL = parse_field_selector("pods", "", None)
MIG_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
             "spec": {"selectors": [{"cel": {"expression":
                      "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}


def _examples() -> list[dict[str, Any]]:
    text = (FIXTURES / "dra-examples.md").read_text()
    return [o for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for o in yaml.safe_load_all(block) if o]


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


class Live:
    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake
        self.api = api_client(host=fake.url)
        self.store = Store(load_catalog())
        self.store.enable_dra(["gpu.nvidia.com", "mig.nvidia.com"])
        self.source = KubeSource(self.api, self.store, kinds=KINDS + DRA_KINDS,
                                 backoff=lambda: Backoff(initial_s=0.01, max_s=0.05)).start()
        assert self.source.ready.wait(10)
        self.allocator = DraAllocator(self.store, ClaimWriter(self.api), get_policy("vramfit"))

    def settle(self) -> None:
        """Let the watches deliver what the fake holds: every pod and claim is in the store as stored (same
        resourceVersion), then the store's version stops moving."""
        def caught_up() -> bool:
            book = self.store.dra
            assert book is not None
            with self.store.lock:
                pods = {k: (o.get("metadata") or {}).get("resourceVersion") for k, o in self.store.pod_items()}
                claims = {k: (o.get("metadata") or {}).get("resourceVersion") for k, o in book.claim_objs.items()}
            want_pods = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
                         for o in self.fake.list_objects("pods", _ALL)["items"]}
            want_claims = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
                           for o in self.fake.list_objects("resourceclaims", _ALL)["items"]}
            return pods == want_pods and claims == want_claims

        wait_for(caught_up, timeout_s=10, poll_s=0.05)
        last = [-1]

        def quiet() -> bool:
            now = self.store.generation
            done = now == last[0]
            last[0] = now
            return done

        wait_for(quiet, timeout_s=5, poll_s=0.15)

    def stop(self) -> None:
        self.source.stop()


@pytest.fixture
def cluster(fake_api: Callable[..., FakeApiServer]) -> Iterator[Live]:
    objs = _examples()
    fake = fake_api(nodes=[_node("node-a"), _node("node-mig")])
    for o in objs:
        if o["kind"] == "ResourceSlice":
            fake.add_slice(o)
        elif o["kind"] == "DeviceClass":
            fake.add_device_class(o)
    fake.add_device_class(MIG_CLASS)
    live = Live(fake)
    yield live
    live.stop()


def test_gated_claim_is_allocated_written_in_order_and_ungated(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "chat-14gi", "gpu.nvidia.com", "14Gi"))
    fake.add_pod(gated_pod("team-a", "chat-0", claim="chat-14gi"))
    cluster.settle()
    out = cluster.allocator.round()
    assert out.allocated == ["team-a/chat-0"]
    claim = fake.get_claim("team-a", "chat-14gi")
    assert claim is not None
    assert FINALIZER in claim["metadata"]["finalizers"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    # least VRAM stranded: the shared A100 (gpu-1), not the exclusive H100 (gpu-0)
    assert (result["pool"], result["device"]) == ("node-a", "gpu-1")
    assert re.fullmatch(r"[0-9a-f-]{36}", result["shareID"])
    assert result["consumedCapacity"] == {"memory": "14Gi"}
    validate_object(claim)
    pod = fake.get_pod("team-a", "chat-0")
    assert pod is not None and not pod["spec"].get("schedulingGates")
    SchedulerEmulator(cluster.api).schedule("team-a", "chat-0", "node-a")
    assert fake.get_claim("team-a", "chat-14gi")["status"]["reservedFor"][0]["name"] == "chat-0"  # type: ignore[index]


def test_two_tenants_never_share_the_shared_gpu_and_hardware_pods_avoid_it(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "a", "gpu.nvidia.com", "10Gi"))
    fake.add_claim(new_claim("team-b", "b", "gpu.nvidia.com", "10Gi"))
    fake.add_claim(new_claim("team-c", "c", "mig.nvidia.com", "15Gi"))
    fake.add_pod(gated_pod("team-a", "pa", claim="a"))
    fake.add_pod(gated_pod("team-b", "pb", claim="b"))
    fake.add_pod(gated_pod("team-c", "pc", claim="c", annotations={"vramfit.io/isolation": "hardware"}))
    cluster.settle()
    out = cluster.allocator.round()
    devices = {}
    for ns, name in (("team-a", "a"), ("team-b", "b"), ("team-c", "c")):
        c = fake.get_claim(ns, name)
        assert c is not None and c["status"].get("allocation"), (name, out.waiting)
        r = c["status"]["allocation"]["devices"]["results"][0]
        devices[name] = (r["pool"], r["device"])
    assert devices["a"] != devices["b"]  # one tenant per shared GPU
    assert devices["c"][0] == "node-mig" and "-mig-" in devices["c"][1]


def test_restart_rebuilds_books_from_claims_and_never_reuses_a_device(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "x", "gpu.nvidia.com"))  # whole GPU, no memory asked
    fake.add_pod(gated_pod("team-a", "px", claim="x"))
    cluster.settle()
    cluster.allocator.round()
    first = fake.get_claim("team-a", "x")["status"]["allocation"]["devices"]["results"][0]["device"]  # type: ignore[index]
    cluster.stop()
    again = Live(fake)  # a new leader: nothing in memory
    try:
        fake.add_claim(new_claim("team-a", "y", "gpu.nvidia.com"))
        fake.add_pod(gated_pod("team-a", "py", claim="y"))
        again.settle()
        again.allocator.round()
        second = fake.get_claim("team-a", "y")["status"]["allocation"]["devices"]["results"][0]["device"]  # type: ignore[index]
        assert first != second
    finally:
        again.stop()


def test_unplaceable_pod_keeps_its_gate_and_says_why(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "huge", "gpu.nvidia.com", "200Gi"))
    fake.add_pod(gated_pod("team-a", "big", claim="huge"))
    cluster.settle()
    out = cluster.allocator.round()
    assert "team-a/big" in out.waiting
    pod = fake.get_pod("team-a", "big")
    assert pod is not None and pod["spec"]["schedulingGates"] == [{"name": GATE}]
    assert any(c.get("type") == CONDITION for c in pod["status"].get("conditions", []))
    assert any(e["reason"] == "FailedAllocation" for e in fake.events_posted())


def test_pod_deleted_before_binding_gives_its_claim_back(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "z", "gpu.nvidia.com", "8Gi"))
    fake.add_pod(gated_pod("team-a", "pz", claim="z"))
    cluster.settle()
    cluster.allocator.round()
    assert fake.get_claim("team-a", "z")["status"].get("allocation")  # type: ignore[index]
    fake.delete_pod("team-a", "pz")
    cluster.settle()
    out = cluster.allocator.round()
    assert out.released == ["team-a/z"]
    claim = fake.get_claim("team-a", "z")
    assert claim is not None and not claim.get("status", {}).get("allocation")
    assert FINALIZER not in (claim["metadata"].get("finalizers") or [])


def test_template_claim_waits_for_the_controller_then_is_allocated(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim_template({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                             "metadata": {"name": "mig-1g", "namespace": "team-d"},
                             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                 "deviceClassName": "mig.nvidia.com"}}]}}}})
    fake.add_pod(gated_pod("team-d", "pt", template="mig-1g"))
    cluster.settle()
    out = cluster.allocator.round()
    assert "team-d/pt" in out.waiting  # the claim is not made yet
    create_template_claims(cluster.api, "team-d", "pt")
    cluster.settle()
    out = cluster.allocator.round()
    assert out.allocated == ["team-d/pt"]


def test_webhook_gates_pods_whose_claims_ask_for_a_managed_class(cluster: Live) -> None:
    import base64
    import json

    from extender.dra.gate import needs_gate
    from extender.webhook import handle

    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "gpu-claim", "gpu.nvidia.com", "4Gi"))
    fake.add_claim(new_claim("team-a", "nic-claim", "nic.example.com"))
    cluster.settle()
    book = cluster.store.dra
    assert book is not None

    def gate(pod: dict[str, Any], ns: str) -> bool:
        with cluster.store.lock:
            return needs_gate(pod, ns, book.classes_of, book.managed)

    def admitted(pod: dict[str, Any]) -> list[dict[str, Any]]:
        pod = {**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "schedulingGates"}}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
            "namespace": "team-a", "name": pod["metadata"]["name"], "object": pod,
            "userInfo": {"username": "alice"}}}).encode()
        status, out = handle(body, "vramfit-scheduler", dra_gate=gate)
        response = json.loads(out)["response"]
        assert status == 200 and response["allowed"], response
        return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []

    assert admitted(gated_pod("team-a", "p1", claim="gpu-claim")) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    assert admitted(gated_pod("team-a", "p2", claim="nic-claim")) == []  # not a class vramfit allocates
    assert admitted(gated_pod("team-a", "p3", claim="not-seen-yet")) != []  # unknown: gated, ungated at once if nothing to do


def test_a_claim_two_pods_share_is_allocated_once_and_both_run_on_its_node(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "shared", "gpu.nvidia.com", "20Gi"))
    fake.add_pod(gated_pod("team-a", "p1", claim="shared"))
    fake.add_pod(gated_pod("team-a", "p2", claim="shared"))
    cluster.settle()
    out = cluster.allocator.round()
    assert sorted(out.allocated) == ["team-a/p1", "team-a/p2"]
    claim = fake.get_claim("team-a", "shared")
    assert claim is not None and len(claim["status"]["allocation"]["devices"]["results"]) == 1
    writes = [r for r in fake.recorded("PUT", "/status") if "resourceclaims/shared" in r.path]
    assert len(writes) == 1
    emulator = SchedulerEmulator(cluster.api)
    emulator.schedule("team-a", "p1", "node-a")
    emulator.schedule("team-a", "p2", "node-a")


def test_the_leader_loop_allocates_a_burst_without_being_asked(cluster: Live) -> None:
    import threading

    fake = cluster.fake
    stop = threading.Event()
    cluster.allocator.window_s = 0.02
    t = threading.Thread(target=cluster.allocator.run, args=(stop,), daemon=True)
    t.start()
    try:
        for i in range(6):
            fake.add_claim(new_claim("team-a", f"b{i}", "gpu.nvidia.com", "6Gi"))
            fake.add_pod(gated_pod("team-a", f"burst-{i}", claim=f"b{i}"))

        def all_ungated() -> bool:
            return all(not (fake.get_pod("team-a", f"burst-{i}") or {}).get("spec", {}).get("schedulingGates")
                       for i in range(6))

        wait_for(all_ungated, timeout_s=20)
    finally:
        stop.set()
        t.join(5)
    total = 0
    for i in range(6):
        c = fake.get_claim("team-a", f"b{i}")
        assert c is not None
        total += 6 if c["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1" else 0
    assert total <= 80  # the shared A100 is never over-committed


def test_an_allocation_kube_scheduler_clears_is_made_again(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "again", "gpu.nvidia.com", "12Gi"))
    fake.add_pod(gated_pod("team-a", "pa", claim="again"))
    cluster.settle()
    assert cluster.allocator.round().allocated == ["team-a/pa"]
    pod = fake.get_pod("team-a", "pa")
    assert pod is not None
    # No node fits the pod (say, CPU): kube-scheduler's PostFilter clears the allocation of its claim.
    assert SchedulerEmulator(cluster.api).deallocate("team-a", "again", pod["metadata"]["uid"])
    cluster.settle()
    out = cluster.allocator.round()
    assert out.allocated == ["team-a/pa"]  # ungated already: allocated again, no gate to remove
    claim = fake.get_claim("team-a", "again")
    assert claim is not None and claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"


def test_a_claim_whose_devices_are_gone_is_given_back_when_no_pod_holds_it(cluster: Live) -> None:
    fake = cluster.fake
    fake.add_claim(new_claim("team-c", "migc", "mig.nvidia.com", "15Gi"))
    fake.add_pod(gated_pod("team-c", "pm", claim="migc"))
    cluster.settle()
    cluster.allocator.round()
    assert fake.get_claim("team-c", "migc")["status"]["allocation"]["nodeSelector"]  # type: ignore[index]
    # The MIG node's driver goes away: its slice is deleted.
    mig_slice = next(o for o in fake.list_objects("resourceslices", _ALL)["items"]
                     if o["spec"]["nodeName"] == "node-mig")
    fake.delete_slice(mig_slice["metadata"]["name"])
    wait_for(lambda: cluster.store.dra is not None and "node-mig" not in cluster.store.dra.inventory.nodes,
             timeout_s=10)
    out = cluster.allocator.round()
    assert out.released == ["team-c/migc"]  # unreserved, its devices gone: deallocated so it can go elsewhere
    cluster.settle()
    out = cluster.allocator.round()
    assert "team-c/pm" in out.waiting  # no MIG device is left anywhere: the pod waits and says so


def test_a_replica_that_is_not_the_leader_writes_nothing(cluster: Live) -> None:
    from extender.dra.writer import WriteFailed

    fake = cluster.fake
    fake.add_claim(new_claim("team-a", "fenced", "gpu.nvidia.com", "4Gi"))
    fake.add_pod(gated_pod("team-a", "pf", claim="fenced"))
    cluster.settle()
    cluster.allocator.writer.fence = lambda: False  # its lease is no longer fresh
    out = cluster.allocator.round()
    assert out.allocated == []
    claim = fake.get_claim("team-a", "fenced")
    assert claim is not None and not (claim.get("status") or {}).get("allocation")
    assert not (claim["metadata"].get("finalizers") or [])
    book = cluster.store.dra
    assert book is not None and "team-a/fenced" not in book.booked  # nothing stays booked for it
    try:
        cluster.allocator.writer.protect(claim)
    except WriteFailed as err:
        assert err.code == 0
    else:
        raise AssertionError("a fenced writer wrote")


def test_dra_nodes_are_not_offered_to_device_plugin_pods(cluster: Live) -> None:
    from extender.store import NoFit
    from packing.model import PodDemand
    from packing.policies import get_policy as policy

    store = cluster.store
    with store.lock:
        assert store.state.has_node("node-a") and store.is_dra_node("node-a")
        assert "node-a" not in store.node_index()  # the verbs' rows: filter answers it as never, with the reason
    try:
        store.reserve(PodDemand(key="team-a/vram-pod", vram_mib=1024, uid="u-vram"), "node-a", policy("vramfit"))
    except NoFit as err:
        assert "DRA node" in str(err)
    else:
        raise AssertionError("a vramfit.io/vram pod was booked on a DRA node")
