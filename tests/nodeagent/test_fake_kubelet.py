"""The fake kubelet against a tiny device plugin written here with the generated stubs.

Everything goes over real unix sockets and the real method paths; waits are bounded, nothing times speed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fakes.kubelet import (
    CHECKPOINT_FILE,
    HEALTHY,
    KUBELET_SOCKET,
    REASON_UNEXPECTED,
    UNHEALTHY,
    FakeKubelet,
    cleanup_socket_dir,
    is_extended_resource_name,
    quantity_value,
    short_socket_dir,
)

from nodeagent.api import deviceplugin_v1beta1_pb2 as dp
from nodeagent.api import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from nodeagent.api import podresources_v1_pb2 as pr
from nodeagent.api import podresources_v1_pb2_grpc as pr_grpc

RESOURCE = "vramfit.io/gpu"
WAIT_S = 10.0


# ------------------------------------------------------------------------------------------- the test plugin


class _PathRecorder(grpc.ServerInterceptor):
    """Records the method path of every call the plugin receives (the kubelet's side of the wire)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        self.paths.append(details.method)
        return continuation(details)


class Servicer(dp_grpc.DevicePluginServicer):
    """A device plugin with knobs: device health, an Allocate failure, a preferred answer."""

    def __init__(self, ids: list[str], options: dp.DevicePluginOptions | None = None,
                 numa: dict[str, int] | None = None) -> None:
        self.options = options or dp.DevicePluginOptions()
        self._numa = numa or {}
        self._health = dict.fromkeys(ids, HEALTHY)
        self._version = 0
        self._cond = threading.Condition()
        self.allocate_requests: list[dp.AllocateRequest] = []
        self.preferred_requests: list[dp.PreferredAllocationRequest] = []
        self.pre_start_requests: list[dp.PreStartContainerRequest] = []
        self.fail_allocate: grpc.StatusCode | None = None
        self.preferred: list[str] = []

    def set_health(self, device_id: str, health: str) -> None:
        with self._cond:
            self._health[device_id] = health
            self._version += 1
            self._cond.notify_all()

    def _device_list(self) -> list[dp.Device]:
        out = []
        for d, h in self._health.items():
            dev = dp.Device(ID=d, health=h)
            if d in self._numa:
                dev.topology.nodes.add(ID=self._numa[d])
            out.append(dev)
        return out

    def GetDevicePluginOptions(  # noqa: N802
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        return self.options

    def ListAndWatch(  # noqa: N802
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        sent = -1
        while context.is_active():
            with self._cond:
                if sent == self._version:
                    self._cond.wait(timeout=0.05)
                    continue
                sent = self._version
                devices = self._device_list()
            yield dp.ListAndWatchResponse(devices=devices)  # the full list, every time

    def GetPreferredAllocation(  # noqa: N802
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        self.preferred_requests.append(request)
        answers = [dp.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)
                   for _ in request.container_requests]
        return dp.PreferredAllocationResponse(container_responses=answers)

    def Allocate(  # noqa: N802
        self, request: dp.AllocateRequest, context: grpc.ServicerContext
    ) -> dp.AllocateResponse:
        self.allocate_requests.append(request)
        if self.fail_allocate is not None:
            context.abort(self.fail_allocate, "no unit booked for these devices")
        return dp.AllocateResponse(container_responses=[
            dp.ContainerAllocateResponse(
                envs={"VRAMFIT_UNITS": ",".join(r.devices_ids)},
                annotations={"vramfit.io/units": ",".join(r.devices_ids)},
                mounts=[dp.Mount(container_path="/run/vf", host_path="/run/vf", read_only=True)],
                devices=[dp.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0",
                                       permissions="rw")],
                cdi_devices=[dp.CDIDevice(name=f"vramfit.io/gpu={d}") for d in r.devices_ids],
            )
            for r in request.container_requests
        ])

    def PreStartContainer(  # noqa: N802
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        self.pre_start_requests.append(request)
        return dp.PreStartContainerResponse()


class Plugin:
    """Serves a Servicer on <dir>/<endpoint> and registers; re-registers when the kubelet wipes its socket,
    which is how a restarted kubelet tells plugins to come back (NVIDIA's plugin watches kubelet.sock)."""

    def __init__(self, kubelet_dir: Path, servicer: Servicer, endpoint: str = "vf.sock",
                 resource: str = RESOURCE) -> None:
        self.dir, self.servicer, self.endpoint, self.resource = kubelet_dir, servicer, endpoint, resource
        self.recorder = _PathRecorder()
        self.registrations = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def socket(self) -> Path:
        return self.dir / self.endpoint

    def serve(self) -> None:
        from concurrent import futures

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[self.recorder])
        dp_grpc.add_DevicePluginServicer_to_server(self.servicer, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def register(self, version: str = "v1beta1", resource: str | None = None) -> None:
        with grpc.insecure_channel(f"unix://{self.dir / KUBELET_SOCKET}") as channel:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(version=version, endpoint=self.endpoint,
                                   resource_name=resource or self.resource, options=self.servicer.options),
                timeout=WAIT_S,
            )
        self.registrations += 1

    def start(self, watch: bool = True) -> Plugin:
        self.serve()
        self.register()
        if watch:
            self._watcher = threading.Thread(target=self._watch, daemon=True)
            self._watcher.start()
        return self

    def _kubelet_socket_identity(self) -> tuple[int, int] | None:
        try:
            st = (self.dir / KUBELET_SOCKET).stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def _watch(self) -> None:
        seen = self._kubelet_socket_identity()
        while not self._stop.wait(0.02):
            now = self._kubelet_socket_identity()
            if now is None or (now == seen and self.socket.exists()):
                continue
            # kubelet.sock was re-created (and our socket wiped): serve again and register again.
            self.stop_server()
            try:
                self.serve()
                self.register()
                seen = now
            except (grpc.RpcError, RuntimeError):
                self.stop_server()  # the kubelet is not serving yet: try again on the next tick

    def stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=WAIT_S)
        self.stop_server()


# ------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    root = short_socket_dir()
    yield root / "dp", root / "pr"
    cleanup_socket_dir(root)


@pytest.fixture
def admitted() -> list[str]:
    return []


@pytest.fixture
def kubelet(dirs: tuple[Path, Path], admitted: list[str]) -> Iterator[FakeKubelet]:
    k = FakeKubelet(dirs[0], dirs[1], on_admitted=lambda pod: admitted.append(pod["metadata"]["name"]))
    with k:
        yield k


@pytest.fixture
def plugins() -> Iterator[list[Plugin]]:
    started: list[Plugin] = []
    yield started
    for p in started:
        p.stop()


def start_plugin(kubelet: FakeKubelet, plugins: list[Plugin], servicer: Servicer, **kw: Any) -> Plugin:
    plugin = Plugin(kubelet.device_plugin_dir, servicer, **kw).start()
    plugins.append(plugin)
    kubelet.wait_for_devices(plugin.resource, timeout_s=WAIT_S)
    return plugin


def pod(name: str, created: str, *, gpus: int | None = 1, init_gpus: int | None = None,
        requests_only: bool = False) -> dict[str, Any]:
    def container(cname: str, n: int | None) -> dict[str, Any]:
        if n is None:
            return {"name": cname, "image": "busybox"}
        key = "requests" if requests_only else "limits"
        return {"name": cname, "image": "busybox", "resources": {key: {RESOURCE: str(n), "cpu": "100m"}}}

    spec: dict[str, Any] = {"containers": [container("main", gpus)]}
    if init_gpus is not None:
        spec["initContainers"] = [container("prep", init_gpus)]
    return {
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": spec,
    }


# -------------------------------------------------------------------------------------------------- the tests


def test_method_paths_on_the_wire(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0"], dp.DevicePluginOptions(get_preferred_allocation_available=True,
                                                        pre_start_required=True))
    plugin = start_plugin(kubelet, plugins, servicer)
    kubelet.admit([pod("a", "2026-01-01T00:00:00Z")])
    assert set(plugin.recorder.paths) == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",  # asked even with one free device, as upstream does
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    # The kubelet's own services answer the literal upstream paths (a wrong one would be UNIMPLEMENTED).
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as ch:
        list_call = ch.unary_unary("/v1.PodResourcesLister/List",
                                   request_serializer=pr.ListPodResourcesRequest.SerializeToString,
                                   response_deserializer=pr.ListPodResourcesResponse.FromString)
        assert len(list_call(pr.ListPodResourcesRequest(), timeout=WAIT_S).pod_resources) == 1
        alloc_call = ch.unary_unary("/v1.PodResourcesLister/GetAllocatableResources",
                                    request_serializer=pr.AllocatableResourcesRequest.SerializeToString,
                                    response_deserializer=pr.AllocatableResourcesResponse.FromString)
        assert len(alloc_call(pr.AllocatableResourcesRequest(), timeout=WAIT_S).devices) == 1
        get_call = ch.unary_unary("/v1.PodResourcesLister/Get",
                                  request_serializer=pr.GetPodResourcesRequest.SerializeToString,
                                  response_deserializer=pr.GetPodResourcesResponse.FromString)
        got = get_call(pr.GetPodResourcesRequest(pod_name="a", pod_namespace="team-a"), timeout=WAIT_S)
        assert got.pod_resources.name == "a"
    with grpc.insecure_channel(f"unix://{kubelet.kubelet_socket}") as ch:
        register = ch.unary_unary("/v1beta1.Registration/Register",
                                  request_serializer=dp.RegisterRequest.SerializeToString,
                                  response_deserializer=dp.Empty.FromString)
        register(dp.RegisterRequest(version="v1beta1", endpoint=plugin.endpoint, resource_name=RESOURCE),
                 timeout=WAIT_S)
    assert dp.DESCRIPTOR.package == "v1beta1" and pr.DESCRIPTOR.package == "v1"
    plugin_methods = dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name
    assert plugin_methods["GetPreferredAllocation"].full_name == "v1beta1.DevicePlugin.GetPreferredAllocation"
    assert pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name["Get"].full_name \
        == "v1.PodResourcesLister.Get"


def test_field_numbers_are_the_upstream_wire_format() -> None:
    fields = {f.name: f.number for f in pr.ContainerResources.DESCRIPTOR.fields}
    assert fields == {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5}
    fields = {f.name: f.number for f in dp.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    fields = {f.name: f.number for f in dp.RegisterRequest.DESCRIPTOR.fields}
    assert fields == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert {f.name: f.number for f in pr.DynamicResource.DESCRIPTOR.fields} == {
        "claim_name": 2, "claim_namespace": 3, "claim_resources": 4}


def test_registration_connects_and_uses_the_plugins_own_options(kubelet: FakeKubelet,
                                                                 plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1"], dp.DevicePluginOptions(get_preferred_allocation_available=True))
    start_plugin(kubelet, plugins, servicer)
    reg = kubelet.wait_for_registration(RESOURCE, timeout_s=WAIT_S)
    assert reg.error is None and reg.version == "v1beta1" and reg.endpoint == "vf.sock"
    assert reg.incarnation == kubelet.incarnation == 1
    assert kubelet.options(RESOURCE) == servicer.options
    assert kubelet.is_connected(RESOURCE)
    assert kubelet.devices(RESOURCE) == {"u0": HEALTHY, "u1": HEALTHY}
    assert [c.method for c in kubelet.calls(resource=RESOURCE)][:1] == ["GetDevicePluginOptions"]


@pytest.mark.parametrize("version, resource, endpoint, needle", [
    ("v1alpha", RESOURCE, "vf.sock", "not supported by kubelet"),
    ("v1beta1", "gpu", "vf.sock", "is invalid"),
    ("v1beta1", "kubernetes.io/gpu", "vf.sock", "is invalid"),
    ("v1beta1", RESOURCE, "missing.sock", "does not exist"),
    ("v1beta1", RESOURCE, "../vf.sock", "not a plain file name"),
])
def test_registration_rejections(kubelet: FakeKubelet, plugins: list[Plugin], version: str, resource: str,
                                 endpoint: str, needle: str) -> None:
    plugin = Plugin(kubelet.device_plugin_dir, Servicer(["u0"]), endpoint=endpoint)
    plugins.append(plugin)
    if endpoint == "vf.sock":
        plugin.serve()
    with pytest.raises(grpc.RpcError) as err:
        plugin.register(version=version, resource=resource)
    assert err.value.code() == grpc.StatusCode.UNKNOWN and needle in err.value.details()
    assert kubelet.registrations()[-1].error is not None
    assert not kubelet.is_connected(resource)


def test_resource_name_rules() -> None:
    assert is_extended_resource_name("vramfit.io/gpu")
    assert is_extended_resource_name("nvidia.com/mig-1g.10gb")
    for bad in ["gpu", "kubernetes.io/gpu", "requests.vramfit.io/gpu", "Vramfit.io/gpu", "a/b/c",
                "vramfit.io/"]:
        assert not is_extended_resource_name(bad), bad
    assert quantity_value("2") == 2 and quantity_value(3) == 3 and quantity_value("500m") == 1


def test_list_and_watch_health_changes_and_disconnect(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1"])
    plugin = start_plugin(kubelet, plugins, servicer)
    servicer.set_health("u1", UNHEALTHY)
    kubelet.wait_for_devices(RESOURCE, lambda d: d["u1"] == UNHEALTHY, timeout_s=WAIT_S)
    assert kubelet.healthy_devices(RESOURCE) == {"u0"}
    servicer.set_health("u1", HEALTHY)
    kubelet.wait_for_devices(RESOURCE, lambda d: d["u1"] == HEALTHY, timeout_s=WAIT_S)
    assert kubelet.device_updates(RESOURCE) >= 3
    # The plugin going away ends the stream: the kubelet counts every device unhealthy.
    plugin.stop()
    kubelet.wait_for_devices(RESOURCE, lambda d: set(d.values()) == {UNHEALTHY}, timeout_s=WAIT_S)
    kubelet.wait_for(lambda: not kubelet.is_connected(RESOURCE), WAIT_S)


def test_admission_by_creation_time_one_at_a_time(kubelet: FakeKubelet, plugins: list[Plugin],
                                                  admitted: list[str]) -> None:
    servicer = Servicer(["u0", "u1"])
    start_plugin(kubelet, plugins, servicer)
    pods = [pod("late", "2026-01-01T00:00:03Z"), pod("early", "2026-01-01T00:00:01Z"),
            pod("mid", "2026-01-01T00:00:02Z")]
    results = kubelet.admit(pods)
    assert [r.name for r in results] == ["early", "mid", "late"]
    assert [r.admitted for r in results] == [True, True, False]
    assert admitted == ["early", "mid"]
    late = results[2]
    assert late.phase == "Failed" and late.reason == REASON_UNEXPECTED
    assert late.message == (
        "Allocate failed due to requested number of devices unavailable for vramfit.io/gpu. "
        "Requested: 1, Available: 0, which is unexpected"
    )
    # One ContainerAllocateRequest per Allocate, devices only.
    assert [list(r.container_requests[0].devices_ids) for r in servicer.allocate_requests] == [["u0"], ["u1"]]
    assert all(len(r.container_requests) == 1 for r in servicer.allocate_requests)
    main = results[0].container("main").allocations[RESOURCE]
    assert main.device_ids == ("u0",) and main.envs == {"VRAMFIT_UNITS": "u0"}
    assert main.cdi_devices == ["vramfit.io/gpu=u0"] and main.annotations == {"vramfit.io/units": "u0"}
    assert main.mounts[0].read_only and main.devices[0].permissions == "rw"
    # A finished pod frees its device for the next one.
    kubelet.release("uid-early")
    again = kubelet.admit([pod("late", "2026-01-01T00:00:03Z")])[0]
    assert again.admitted and again.container("main").allocations[RESOURCE].device_ids == ("u0",)


def test_allocate_error_rejects_the_pod_and_frees_its_devices(kubelet: FakeKubelet, plugins: list[Plugin],
                                                              admitted: list[str]) -> None:
    servicer = Servicer(["u0", "u1"])
    start_plugin(kubelet, plugins, servicer)
    rejected: list[str] = []
    kubelet.on_rejected = lambda p, r: rejected.append(r.reason)
    servicer.fail_allocate = grpc.StatusCode.FAILED_PRECONDITION
    [result] = kubelet.admit([pod("a", "2026-01-01T00:00:00Z", init_gpus=1)])
    assert not result.admitted and result.phase == "Failed" and result.reason == REASON_UNEXPECTED
    assert result.message == ("Allocate failed due to rpc error: code = FailedPrecondition "
                              "desc = no unit booked for these devices, which is unexpected")
    assert rejected == [REASON_UNEXPECTED] and admitted == []
    assert kubelet.allocated_device_ids(RESOURCE) == frozenset() and kubelet.allocations() == {}
    assert kubelet.active_pods() == []


def test_init_devices_are_reused_and_only_limits_count(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1", "u2"])
    start_plugin(kubelet, plugins, servicer)
    [r] = kubelet.admit([pod("a", "2026-01-01T00:00:00Z", gpus=2, init_gpus=1)])
    assert r.admitted
    assert r.container("prep").init and r.container("prep").allocations[RESOURCE].device_ids == ("u0",)
    # The app container takes the init container's device first, as the device manager does.
    assert r.container("main").allocations[RESOURCE].device_ids == ("u0", "u1")
    assert kubelet.allocated_device_ids(RESOURCE) == {"u0", "u1"}
    # Requests without limits never reach the device manager.
    [r2] = kubelet.admit([pod("b", "2026-01-01T00:00:01Z", requests_only=True)])
    assert r2.admitted and r2.container("main").allocated_now == () and len(servicer.allocate_requests) == 2


def test_preferred_allocation_is_a_hint(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1", "u2"], dp.DevicePluginOptions(get_preferred_allocation_available=True))
    start_plugin(kubelet, plugins, servicer)
    servicer.preferred = ["u2"]
    [r] = kubelet.admit([pod("a", "2026-01-01T00:00:00Z")])
    assert r.container("main").allocations[RESOURCE].device_ids == ("u2",)
    [req] = servicer.preferred_requests[0].container_requests
    assert list(req.available_deviceIDs) == ["u0", "u1", "u2"] and req.allocation_size == 1
    assert list(req.must_include_deviceIDs) == []
    # An answer naming unknown or taken devices is ignored: the kubelet falls back to what is free.
    servicer.preferred = ["nope", "u2"]
    [r2] = kubelet.admit([pod("b", "2026-01-01T00:00:01Z")])
    assert r2.container("main").allocations[RESOURCE].device_ids == ("u0",)


def test_pre_start_container_when_required(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1"], dp.DevicePluginOptions(pre_start_required=True))
    start_plugin(kubelet, plugins, servicer)
    [r] = kubelet.admit([pod("a", "2026-01-01T00:00:00Z", gpus=2)])
    assert r.admitted and r.container("main").pre_start_error is None
    assert [list(q.devices_ids) for q in servicer.pre_start_requests] == [["u0", "u1"]]


def test_restart_requires_reregistration_and_keeps_the_checkpoint(kubelet: FakeKubelet,
                                                                  plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1"])
    plugin = start_plugin(kubelet, plugins, servicer)
    first = kubelet.admit([pod("a", "2026-01-01T00:00:00Z")])[0]
    assert first.admitted and len(servicer.allocate_requests) == 1
    (kubelet.device_plugin_dir / "stale-file").write_text("x")

    kubelet.restart()
    assert kubelet.incarnation == 2
    assert (kubelet.device_plugin_dir / CHECKPOINT_FILE).exists()
    assert not (kubelet.device_plugin_dir / "stale-file").exists()
    reg = kubelet.wait_for_registration(RESOURCE, timeout_s=WAIT_S)
    assert reg.incarnation == 2
    kubelet.wait_for(lambda: plugin.registrations == 2, WAIT_S, "the plugin's second Register to return")
    kubelet.wait_for_devices(RESOURCE, lambda d: d == {"u0": HEALTHY, "u1": HEALTHY}, timeout_s=WAIT_S)
    # The kubelet re-admits its pods after a restart without calling Allocate again.
    readmitted = kubelet.admit([pod("a", "2026-01-01T00:00:00Z")])[0]
    assert readmitted.admitted and readmitted.container("main").allocated_now == ()
    assert readmitted.container("main").allocations[RESOURCE].device_ids == ("u0",)
    assert len(servicer.allocate_requests) == 1
    # ...and still counts u0 as taken.
    second = kubelet.admit([pod("b", "2026-01-01T00:00:01Z")])[0]
    assert second.container("main").allocations[RESOURCE].device_ids == ("u1",)


def test_restart_without_the_plugin_rejects_new_pods(dirs: tuple[Path, Path], plugins: list[Plugin]) -> None:
    with FakeKubelet(dirs[0], dirs[1]) as kubelet:
        plugin = Plugin(kubelet.device_plugin_dir, Servicer(["u0"]))
        plugins.append(plugin)
        plugin.start(watch=False)  # this plugin never notices the restart
        kubelet.wait_for_devices(RESOURCE, timeout_s=WAIT_S)
        kubelet.restart()
        assert not plugin.socket.exists()
        [r] = kubelet.admit([pod("a", "2026-01-01T00:00:00Z")])
        assert not r.admitted and "no healthy devices present" in r.message


def test_pod_resources_list_get_and_allocatable(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    servicer = Servicer(["u0", "u1", "u2"], numa={"u0": 0, "u1": 1})
    start_plugin(kubelet, plugins, servicer)
    a, b = kubelet.admit([pod("a", "2026-01-01T00:00:00Z", gpus=2),
                          pod("b", "2026-01-01T00:00:01Z", gpus=None)])
    assert a.admitted and b.admitted
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as ch:
        stub = pr_grpc.PodResourcesListerStub(ch)
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
        assert [(p.name, p.namespace) for p in listed.pod_resources] == [("a", "team-a"), ("b", "team-a")]
        [main] = listed.pod_resources[0].containers
        assert main.name == "main"
        shown = [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
                 for d in main.devices]
        assert shown == [(RESOURCE, ["u0"], [0]), (RESOURCE, ["u1"], [1])]
        assert [list(c.devices) for c in listed.pod_resources[1].containers] == [[]]
        got = stub.Get(pr.GetPodResourcesRequest(pod_name="a", pod_namespace="team-a"), timeout=WAIT_S)
        assert got.pod_resources == listed.pod_resources[0]
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(pr.GetPodResourcesRequest(pod_name="zz", pod_namespace="team-a"), timeout=WAIT_S)
        assert "pod zz in namespace team-a not found" in err.value.details()
        alloc = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT_S)
        assert [(list(d.device_ids), d.HasField("topology")) for d in alloc.devices] == [
            (["u0"], True), (["u1"], True), (["u2"], False)]
        kubelet.release("uid-a")
        remaining = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S).pod_resources
        assert [p.name for p in remaining] == ["b"]


def test_socket_paths_are_checked_for_the_unix_limit() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        FakeKubelet("/tmp/" + "d" * 120)


def test_kubernetes_client_pods_are_accepted(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    import datetime as dt

    from kubernetes.client import V1Container, V1ObjectMeta, V1Pod, V1PodSpec, V1ResourceRequirements

    start_plugin(kubelet, plugins, Servicer(["u0"]))
    v1pod = V1Pod(
        metadata=V1ObjectMeta(name="k", namespace="team-a", uid="uid-k",
                              creation_timestamp=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
        spec=V1PodSpec(containers=[V1Container(name="main", image="busybox",
                                               resources=V1ResourceRequirements(limits={RESOURCE: "1"}))]),
    )
    [r] = kubelet.admit([v1pod])
    assert r.admitted and r.uid == "uid-k" and r.container("main").allocations[RESOURCE].device_ids == ("u0",)
