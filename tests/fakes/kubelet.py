"""A fake kubelet: the real device plugin (v1beta1) and pod-resources (v1) gRPC APIs over unix sockets.

It behaves as the kubelet's device manager does (kubernetes/kubernetes `pkg/kubelet/cm/devicemanager`:
`plugin/v1beta1/server.go`, `handler.go`, `client.go`, `manager.go`, `pod_devices.go`; admission from
`pkg/kubelet/kubelet.go` HandlePodAdditions and `pkg/kubelet/cm/admission`; pod-resources from
`pkg/kubelet/apis/podresources/server_v1.go`):

* `Register` on `<device_plugin_dir>/kubelet.sock` checks the version and the extended resource name, then
  dials `<device_plugin_dir>/<endpoint>`, asks GetDevicePluginOptions (these options, not the ones in the
  RegisterRequest, decide GetPreferredAllocation / PreStartContainer) and answers only after that, as the
  kubelet's synchronous connectClient does. A ListAndWatch stream then replaces the resource's device list on
  every message; when the stream ends every device of the resource turns unhealthy.
* Admission: pods sorted by creation time, one at a time; init containers, then app containers; only
  `resources.limits` is read; devices of non-restartable init containers are reusable by later containers of
  the same pod; GetPreferredAllocation when offered; one ContainerAllocateRequest per Allocate. Any error
  rejects the pod (phase Failed, reason UnexpectedAdmissionError, message "Allocate failed due to ..., which
  is unexpected") and frees what it had been given.
* Checkpoint: allocations and registered resources go to `kubelet_internal_checkpoint` in the device plugin
  dir (the upstream JSON layout, checksum not computed); `restart()` drops all in-memory state, reloads that
  file and deletes every other file of the dir, so plugins must register again, and containers already
  allocated are not re-Allocated.

Not modelled: the topology manager (every device counts as "no affinity"), the 5-minute grace period after a
plugin disconnects, container restarts, the pluginwatcher registration path, CPU / memory / DRA resources.
Where the kubelet iterates Go maps (random order) this fake sorts, so tests are deterministic.

AF_UNIX paths are limited to 107 bytes: put the socket dirs under /tmp (`short_socket_dir()`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import grpc

from nodeagent.api import deviceplugin_v1beta1_pb2 as dp
from nodeagent.api import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from nodeagent.api import podresources_v1_pb2 as pr
from nodeagent.api import podresources_v1_pb2_grpc as pr_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
REASON_UNEXPECTED = "UnexpectedAdmissionError"
NODE_WITHOUT_TOPOLOGY = -1
PRE_START_TIMEOUT_S = 30.0  # the kubelet's KubeletPreStartContainerRPCTimeoutInSecs
MAX_UNIX_PATH = 107

PodLike = Mapping[str, Any]


def short_socket_dir(prefix: str = "vf") -> Path:
    """A fresh directory under /tmp whose socket paths stay well below the AF_UNIX limit."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


# ---------------------------------------------------------------------------------------------- result types


@dataclass(frozen=True)
class Registration:
    """One Register call as the kubelet saw it; `error` is None when it was accepted."""

    sequence: int
    incarnation: int
    resource_name: str
    endpoint: str
    version: str
    request_options: dp.DevicePluginOptions
    options: dp.DevicePluginOptions | None
    error: str | None


@dataclass(frozen=True)
class RpcCall:
    """A call the kubelet made to a plugin (GetDevicePluginOptions, GetPreferredAllocation, ...)."""

    method: str
    resource: str
    request: Any
    response: Any
    error: str | None


@dataclass(frozen=True)
class ContainerAllocation:
    """The checkpointed answer for one (pod, container, resource)."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    numa: Mapping[int, tuple[str, ...]]
    response: dp.ContainerAllocateResponse

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs)

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.response.annotations)

    @property
    def mounts(self) -> list[dp.Mount]:
        return list(self.response.mounts)

    @property
    def devices(self) -> list[dp.DeviceSpec]:
        return list(self.response.devices)

    @property
    def cdi_devices(self) -> list[str]:
        return [d.name for d in self.response.cdi_devices]


@dataclass(frozen=True)
class ContainerResult:
    """What admission did for one container: `allocated_now` names the resources Allocate was called for."""

    name: str
    init: bool
    allocations: Mapping[str, ContainerAllocation]
    allocated_now: tuple[str, ...]
    pre_start_error: str | None = None


@dataclass(frozen=True)
class AdmitResult:
    """Per-pod admission outcome. Admitted pods stay `Pending` (the fake runs no containers)."""

    uid: str
    name: str
    namespace: str
    admitted: bool
    phase: str
    reason: str = ""
    message: str = ""
    containers: tuple[ContainerResult, ...] = ()

    def container(self, name: str) -> ContainerResult:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


class AdmissionError(Exception):
    """A device manager error: it rejects the pod being admitted."""


# ---------------------------------------------------------------------------------------------- pod helpers


def _as_dict(pod: Any) -> Mapping[str, Any]:
    if isinstance(pod, Mapping):
        return pod
    # A kubernetes.client model: its wire (camelCase) form is what a real kubelet decodes.
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(pod)


def _meta(pod: PodLike) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def pod_uid(pod: PodLike) -> str:
    uid = _meta(pod).get("uid")
    if not uid:
        raise ValueError(f"pod {_meta(pod).get('name')!r} has no metadata.uid")
    return str(uid)


def _created(pod: PodLike) -> dt.datetime:
    raw = _meta(pod).get("creationTimestamp")
    if raw is None:
        return dt.datetime.min.replace(tzinfo=dt.UTC)  # Go's zero time sorts first
    if isinstance(raw, dt.datetime):
        return raw if raw.tzinfo else raw.replace(tzinfo=dt.UTC)
    return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))


def _containers(pod: PodLike) -> Iterator[tuple[Mapping[str, Any], bool]]:
    spec = pod.get("spec") or {}
    for c in spec.get("initContainers") or []:
        yield c, True
    for c in spec.get("containers") or []:
        yield c, False


def _restartable(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"  # a sidecar: it keeps its devices


_SUFFIX: dict[str, Decimal | int] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")


def quantity_value(q: Any) -> int:
    """resource.Quantity.Value(): the value rounded up to an integer."""
    if isinstance(q, int):
        return q
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"unparsable quantity {q!r}")
    try:
        return math.ceil(Decimal(m.group(1)) * _SUFFIX[m.group(2)])
    except InvalidOperation as e:
        raise ValueError(f"unparsable quantity {q!r}") from e


def pod_requests(pod: PodLike, resource: str) -> int:
    """resourcehelper.PodRequests for one resource, as kube-scheduler's NodeResourcesFit and the kubelet's
    predicate admission read it: the app containers' sum plus sidecars (restartable init containers), or a
    plain init container's own request plus the sidecars started before it, whichever is larger; plus the
    pod's `spec.overhead` (RuntimeClass). Requests of an extended resource are defaulted from, and must
    equal, its limits."""
    def request(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        q = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        return 0 if q is None else quantity_value(q)

    spec = pod.get("spec") or {}
    total = sum(request(c) for c in spec.get("containers") or [])
    sidecars = 0
    init_max = 0
    for c in spec.get("initContainers") or []:
        if _restartable(c):
            total += request(c)
            sidecars += request(c)
            init_max = max(init_max, sidecars)
        else:
            init_max = max(init_max, request(c) + sidecars)
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(total, init_max) + (0 if overhead is None else quantity_value(overhead))


# ---------------------------------------------------------------------------------- resource name validation

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: domain-prefixed, outside kubernetes.io, valid as a quota name."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = ("requests." + name).split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    return (
        0 < len(prefix) <= 253 and bool(_DNS1123_SUBDOMAIN.match(prefix))
        and 0 < len(short) <= 63 and bool(_QUALIFIED_NAME.match(short))
    )


# --------------------------------------------------------------------------------------------- internal state


@dataclass
class _Endpoint:
    """A connected plugin, or (socket None) a stopped one restored from the checkpoint after a restart."""

    resource: str
    socket: Path | None = None
    channel: grpc.Channel | None = None
    stub: dp_grpc.DevicePluginStub | None = None
    options: dp.DevicePluginOptions | None = None
    stream: Any = None
    thread: threading.Thread | None = None
    stopped: bool = False
    superseded: bool = False

    def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        if self.channel is not None:
            self.channel.close()


@dataclass
class _State:
    """Everything a kubelet restart loses (it keeps only the checkpoint file and the pods)."""

    endpoints: dict[str, _Endpoint] = field(default_factory=dict)
    all_devices: dict[str, dict[str, dp.Device]] = field(default_factory=dict)
    healthy: dict[str, set[str]] = field(default_factory=dict)
    unhealthy: dict[str, set[str]] = field(default_factory=dict)
    updates: dict[str, int] = field(default_factory=dict)
    # pod uid -> container name -> resource -> allocation (the device manager's podDevices)
    pod_devices: dict[str, dict[str, dict[str, ContainerAllocation]]] = field(default_factory=dict)


def _numa_of(device: dp.Device | None) -> list[int]:
    if device is None or not device.topology.nodes:
        return [NODE_WITHOUT_TOPOLOGY]
    return [n.ID for n in device.topology.nodes]


def _copy_options(options: dp.DevicePluginOptions) -> dp.DevicePluginOptions:
    copy = dp.DevicePluginOptions()
    copy.CopyFrom(options)
    return copy


def _rpc_error_text(e: grpc.RpcError) -> str:
    # The text a Go gRPC status error prints; the kubelet wraps it into the rejection message.
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    name = "".join(w.capitalize() for w in code.name.split("_")) if code is not None else "Unknown"
    return f"rpc error: code = {name} desc = {details}"


# ---------------------------------------------------------------------------------------------- the servicers


class _RegistrationServicer(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:  # noqa: N802
        error = self._kubelet._register(request)
        if error is not None:
            # A Go handler returning an error answers codes.Unknown with the error text.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class _PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(  # noqa: N802
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=self._kubelet._pod_resources_list())

    def Get(  # noqa: N802
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        found = self._kubelet._pod_resources_get(request.pod_namespace, request.pod_name)
        if found is None:
            missing = f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            context.abort(grpc.StatusCode.UNKNOWN, missing)
        return pr.GetPodResourcesResponse(pod_resources=found)

    def GetAllocatableResources(  # noqa: N802
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(devices=self._kubelet._allocatable_devices())


# ------------------------------------------------------------------------------------------------ the kubelet


class FakeKubelet:
    """See the module docstring. Start it (or use it as a context manager) before plugins register."""

    def __init__(
        self,
        device_plugin_dir: str | os.PathLike[str],
        pod_resources_dir: str | os.PathLike[str] | None = None,
        *,
        on_admitted: Callable[[PodLike], None] | None = None,
        on_rejected: Callable[[PodLike, AdmitResult], None] | None = None,
        dial_timeout_s: float = 5.0,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        self.device_plugin_dir = Path(device_plugin_dir)
        self.pod_resources_dir = Path(pod_resources_dir) if pod_resources_dir is not None else None
        for sock in (self.kubelet_socket, self.pod_resources_socket):
            if sock is not None and len(os.fsencode(sock)) > MAX_UNIX_PATH:
                raise ValueError(f"socket path {sock} exceeds {MAX_UNIX_PATH} bytes; use short_socket_dir()")
        self.on_admitted = on_admitted
        self.on_rejected = on_rejected
        self.dial_timeout_s = dial_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._cond = threading.Condition()
        self._admit_lock = threading.Lock()  # the kubelet admits one pod at a time
        self._state = _State()
        self._pods: dict[str, PodLike] = {}  # active (admitted, not released) pods, in admission order
        self._registrations: list[Registration] = []
        self._calls: list[RpcCall] = []
        self._incarnation = 0
        self._servers: list[grpc.Server] = []
        self._running = False

    # -- paths and lifecycle ---------------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / KUBELET_SOCKET

    @property
    def pod_resources_socket(self) -> Path | None:
        return self.pod_resources_dir / KUBELET_SOCKET if self.pod_resources_dir is not None else None

    @property
    def checkpoint_path(self) -> Path:
        return self.device_plugin_dir / CHECKPOINT_FILE

    @property
    def incarnation(self) -> int:
        """1 after the first start, +1 per restart()."""
        return self._incarnation

    def start(self) -> FakeKubelet:
        if self._running:
            return self
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        with self._cond:
            self._state = _State()
            self._read_checkpoint()
            self._incarnation += 1
        self._remove_dir_contents()
        self._serve()
        self._running = True
        return self

    def stop(self) -> None:
        """The kubelet process going away: servers stop, plugin streams drop, files stay on disk."""
        if not self._running:
            return
        self._running = False
        for server in self._servers:
            server.stop(grace=None).wait()
        self._servers.clear()
        with self._cond:
            endpoints = list(self._state.endpoints.values())
            for ep in endpoints:
                ep.superseded = True  # a dead kubelet marks nothing unhealthy
            self._cond.notify_all()
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            if ep.thread is not None:
                ep.thread.join(timeout=5.0)

    def restart(self) -> None:
        """Stop, then start as a new kubelet would: checkpoint reloaded, other files of the dir deleted."""
        self.stop()
        self.start()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _remove_dir_contents(self) -> None:
        # ManagerImpl.removeContents / CleanupPluginDirectory: every non-directory except the checkpoint.
        # Deleting the plugins' sockets is the signal upstream gives them to register again.
        for entry in self.device_plugin_dir.iterdir():
            if entry.name == CHECKPOINT_FILE:
                continue
            try:
                if stat.S_ISDIR(entry.stat().st_mode):
                    continue
            except FileNotFoundError:
                continue
            entry.unlink(missing_ok=True)

    def _serve(self) -> None:
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fk-reg"))
        dp_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), reg)
        reg.add_insecure_port(f"unix://{self.kubelet_socket}")
        reg.start()
        self._servers.append(reg)
        if self.pod_resources_dir is not None:
            self.pod_resources_dir.mkdir(parents=True, exist_ok=True)
            sock = self.pod_resources_socket
            assert sock is not None
            sock.unlink(missing_ok=True)
            podres = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fk-podres"))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesServicer(self), podres)
            podres.add_insecure_port(f"unix://{sock}")
            podres.start()
            self._servers.append(podres)

    # -- checkpoint ------------------------------------------------------------------------------------------

    def _write_checkpoint(self) -> None:
        """Caller holds self._cond. The upstream JSON layout; Checksum is not computed (nothing reads it)."""
        entries = []
        for uid, containers in self._state.pod_devices.items():
            for cname, by_resource in containers.items():
                for resource, alloc in by_resource.items():
                    entries.append({
                        "PodUID": uid,
                        "ContainerName": cname,
                        "ResourceName": resource,
                        "DeviceIDs": {str(n): list(ids) for n, ids in alloc.numa.items()},
                        "AllocResp": base64.b64encode(alloc.response.SerializeToString()).decode(),
                    })
        registered = {r: sorted(ids) for r, ids in self._state.healthy.items()}
        doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}, "Checksum": 0}
        tmp = self.checkpoint_path.with_name(CHECKPOINT_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.checkpoint_path)

    def _read_checkpoint(self) -> None:
        """Caller holds self._cond. Registered resources come back with no devices and a stopped endpoint."""
        if not self.checkpoint_path.exists():
            return
        data = json.loads(self.checkpoint_path.read_text())["Data"]
        for e in data.get("PodDeviceEntries") or []:
            resp = dp.ContainerAllocateResponse.FromString(base64.b64decode(e["AllocResp"]))
            numa = {int(n): tuple(ids) for n, ids in (e.get("DeviceIDs") or {}).items()}
            ids = tuple(sorted({i for group in numa.values() for i in group}))
            alloc = ContainerAllocation(e["PodUID"], e["ContainerName"], e["ResourceName"], ids, numa, resp)
            self._state.pod_devices.setdefault(e["PodUID"], {}).setdefault(e["ContainerName"], {})[
                e["ResourceName"]
            ] = alloc
        for resource in data.get("RegisteredDevices") or {}:
            self._state.healthy[resource] = set()
            self._state.unhealthy[resource] = set()
            self._state.endpoints[resource] = _Endpoint(resource=resource, stopped=True)

    # -- registration and ListAndWatch ---------------------------------------------------------------------

    def _register(self, request: dp.RegisterRequest) -> str | None:
        """The Register handler; returns the error text, or None when the plugin is connected."""
        error = self._validate_registration(request)
        endpoint: _Endpoint | None = None
        if error is None:
            endpoint, error = self._connect(request)
        with self._cond:
            self._registrations.append(Registration(
                sequence=len(self._registrations) + 1,
                incarnation=self._incarnation,
                resource_name=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                request_options=_copy_options(request.options),
                options=endpoint.options if endpoint is not None else None,
                error=error,
            ))
            self._cond.notify_all()
        return error

    def _validate_registration(self, request: dp.RegisterRequest) -> str | None:
        if request.version != API_VERSION:
            return (f"requested API version {request.version!r} is not supported by kubelet. "
                    f"Supported versions are [{API_VERSION!r}]")
        if not is_extended_resource_name(request.resource_name):
            return f"the ResourceName {request.resource_name!r} is invalid"
        # The kubelet would just time out dialling a missing socket; the fake says why, at once.
        if not request.endpoint or os.path.basename(request.endpoint) != request.endpoint:
            return f"failed to dial device plugin: endpoint {request.endpoint!r} is not a plain file name"
        sock = self.device_plugin_dir / request.endpoint
        try:
            if not stat.S_ISSOCK(sock.stat().st_mode):
                return f"failed to dial device plugin: {sock} is not a socket"
        except FileNotFoundError:
            return f"failed to dial device plugin: {sock} does not exist"
        return None

    def _connect(self, request: dp.RegisterRequest) -> tuple[_Endpoint | None, str | None]:
        """Dial, GetDevicePluginOptions, then run ListAndWatch in the background (connectClient + Run)."""
        sock = self.device_plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{sock}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            return None, "failed to dial device plugin: context deadline exceeded"
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=self.rpc_timeout_s)
            self._log_call("GetDevicePluginOptions", request.resource_name, dp.Empty(), options, None)
        except grpc.RpcError as e:
            channel.close()
            text = _rpc_error_text(e)
            self._log_call("GetDevicePluginOptions", request.resource_name, dp.Empty(), None, text)
            return None, f"failed to get device plugin options: {text}"
        ep = _Endpoint(request.resource_name, socket=sock, channel=channel, stub=stub, options=options)
        with self._cond:
            old = self._state.endpoints.get(request.resource_name)
            if old is not None:
                old.superseded = True  # the newest registration wins; the old stream's end changes nothing
            self._state.endpoints[request.resource_name] = ep
            ep.stream = stub.ListAndWatch(dp.Empty())
            ep.thread = threading.Thread(target=self._watch, args=(ep,), daemon=True, name="fk-law")
            ep.thread.start()
        if old is not None:
            old.close()
        return ep, None

    def _watch(self, ep: _Endpoint) -> None:
        try:
            for response in ep.stream:
                self._on_device_list(ep, response)
        except grpc.RpcError:
            pass  # the stream ended: the plugin went away, or the kubelet did
        with self._cond:
            ep.stopped = True
            if not ep.superseded and self._state.endpoints.get(ep.resource) is ep:
                # PluginDisconnected -> markResourceUnhealthy.
                healthy = self._state.healthy.setdefault(ep.resource, set())
                self._state.unhealthy.setdefault(ep.resource, set()).update(healthy)
                healthy.clear()
            self._cond.notify_all()

    def _on_device_list(self, ep: _Endpoint, response: dp.ListAndWatchResponse) -> None:
        # genericDeviceUpdateCallback: the message replaces the resource's whole device list.
        with self._cond:
            if ep.superseded:
                return
            r = ep.resource
            self._state.all_devices[r] = {d.ID: d for d in response.devices}
            self._state.healthy[r] = {d.ID for d in response.devices if d.health == HEALTHY}
            self._state.unhealthy[r] = {d.ID for d in response.devices if d.health != HEALTHY}
            self._state.updates[r] = self._state.updates.get(r, 0) + 1
            self._write_checkpoint()
            self._cond.notify_all()

    def _log_call(self, method: str, resource: str, request: Any, response: Any, error: str | None) -> None:
        with self._cond:
            self._calls.append(RpcCall(method, resource, request, response, error))

    # -- admission -----------------------------------------------------------------------------------------

    def admit(self, pods: Iterable[Any]) -> list[AdmitResult]:
        """HandlePodAdditions: admit pods oldest first, one at a time. Results come in admission order.

        A pod already admitted (e.g. again after restart()) goes through admission again; containers that
        hold checkpointed devices are not re-Allocated.
        """
        ordered = sorted((_as_dict(p) for p in pods), key=_created)  # stable: ties keep the given order
        return [self._admit_one(p) for p in ordered]

    def _admit_one(self, pod: PodLike) -> AdmitResult:
        uid = pod_uid(pod)
        meta = _meta(pod)
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace") or "default")
        with self._admit_lock:
            with self._cond:
                self._pods[uid] = pod  # pending admission counts as active (setPodPendingAdmission)
            try:
                allocated_now = self._allocate_pod(pod)
            except AdmissionError as e:
                result = self._reject(pod, uid, name, namespace, str(e))
            else:
                result = self._accept(pod, uid, name, namespace, allocated_now)
        if result.admitted and self.on_admitted is not None:
            self.on_admitted(pod)
        if result.admitted:
            result = self._pre_start(result)
        elif self.on_rejected is not None:
            self.on_rejected(pod, result)
        return result

    def _reject(self, pod: PodLike, uid: str, name: str, namespace: str, error: str) -> AdmitResult:
        with self._cond:
            self._pods.pop(uid, None)
            # A rejected pod is not active: UpdateAllocatedDevices frees whatever it was given.
            self._state.pod_devices.pop(uid, None)
            self._write_checkpoint()
            self._cond.notify_all()
        return AdmitResult(uid, name, namespace, admitted=False, phase="Failed", reason=REASON_UNEXPECTED,
                           message=f"Allocate failed due to {error}, which is unexpected")

    def _accept(
        self, pod: PodLike, uid: str, name: str, namespace: str, allocated_now: dict[str, list[str]]
    ) -> AdmitResult:
        with self._cond:
            containers = tuple(
                ContainerResult(
                    name=c["name"],
                    init=init,
                    allocations=dict(self._state.pod_devices.get(uid, {}).get(c["name"], {})),
                    allocated_now=tuple(allocated_now.get(c["name"], [])),
                )
                for c, init in _containers(pod)
            )
            self._cond.notify_all()
        return AdmitResult(uid, name, namespace, admitted=True, phase="Pending", containers=containers)

    def _allocate_pod(self, pod: PodLike) -> dict[str, list[str]]:
        """ManagerImpl.Allocate per container; returns container -> resources Allocate was called for."""
        uid = pod_uid(pod)
        reusable: dict[str, set[str]] = {}
        allocated_now: dict[str, list[str]] = {}
        for container, init in _containers(pod):
            allocated_now[container["name"]] = self._allocate_container(uid, container, reusable)
            mine = self._container_devices(uid, container["name"])
            for resource, ids in mine.items():
                if init and not _restartable(container):
                    reusable.setdefault(resource, set()).update(ids)  # addContainerAllocatedResources
                else:
                    reusable.get(resource, set()).difference_update(ids)  # removeContainerAllocatedResources
        return allocated_now

    def _container_devices(self, uid: str, cname: str) -> dict[str, tuple[str, ...]]:
        with self._cond:
            return {r: a.device_ids for r, a in self._state.pod_devices.get(uid, {}).get(cname, {}).items()}

    def _is_device_plugin_resource(self, resource: str) -> bool:
        with self._cond:
            return resource in self._state.healthy or resource in self._allocated_resources()

    def _allocated_resources(self) -> set[str]:
        return {r for cs in self._state.pod_devices.values() for rs in cs.values() for r in rs}

    def _in_use(self, resource: str) -> set[str]:
        """Caller holds self._cond. allocatedDevices, recomputed from podDevices."""
        return {
            i for cs in self._state.pod_devices.values() for rs in cs.values()
            for r, a in rs.items() if r == resource for i in a.device_ids
        }

    def _allocate_container(
        self, uid: str, container: Mapping[str, Any], reusable: dict[str, set[str]]
    ) -> list[str]:
        """allocateContainerResources. Limits only: extended resources have requests == limits."""
        cname = container["name"]
        limits = (container.get("resources") or {}).get("limits") or {}
        called: list[str] = []
        for resource, quantity in limits.items():
            if not self._is_device_plugin_resource(resource):
                continue  # not a device plugin resource: the predicate admission handles it
            devices = self._devices_to_allocate(uid, cname, resource, quantity_value(quantity),
                                                reusable.get(resource, set()))
            if not devices:
                continue
            self._call_allocate(uid, cname, resource, devices)
            called.append(resource)
        return called

    def _devices_to_allocate(
        self, uid: str, cname: str, resource: str, required: int, reusable: set[str]
    ) -> list[str] | None:
        with self._cond:
            healthy = self._healthy_unless_allocated(uid, cname, resource, required)
            if healthy is None or required == 0:
                return None
            chosen: list[str] = []
            if _take(chosen, sorted(reusable), required):
                return chosen
            available = healthy - self._in_use(resource)
            needed = required - len(chosen)
            if len(available) < needed:
                raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                     f"Requested: {needed}, Available: {len(available)}")
            ep = self._state.endpoints.get(resource)
            snapshot = list(chosen)
        preferred = self._preferred(ep, resource, sorted(available | set(snapshot)), snapshot, required)
        if _take(chosen, (d for d in preferred if d in available), required):
            return chosen
        if _take(chosen, sorted(available), required):
            return chosen
        raise AdmissionError(f"unexpectedly allocated less resources than required. "
                             f"Requested: {required}, Got: {len(chosen)}")

    def _healthy_unless_allocated(self, uid: str, cname: str, resource: str, required: int) -> set[str] | None:
        """The resource's healthy devices, or None when this container already holds its devices (a kubelet
        restart: never Allocate twice). Caller holds the lock."""
        existing = self._state.pod_devices.get(uid, {}).get(cname, {}).get(resource)
        if existing is not None:
            if len(existing.device_ids) != required:
                raise AdmissionError(f"pod {uid!r} container {cname!r} changed request for resource "
                                     f"{resource!r} from {len(existing.device_ids)} to {required}")
            return None
        if resource not in self._state.healthy:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        healthy = self._state.healthy[resource]
        if not healthy:
            raise AdmissionError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        return healthy

    def _preferred(
        self, ep: _Endpoint | None, resource: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        """callGetPreferredAllocationIfAvailable: an RPC error rejects the pod; any answer is only a hint."""
        if ep is None:
            raise AdmissionError(f"endpoint not found in cache for a registered resource: {resource}")
        if ep.options is None or not ep.options.get_preferred_allocation_available or ep.stub is None:
            return []
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size)])
        try:
            response = ep.stub.GetPreferredAllocation(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as e:
            self._log_call("GetPreferredAllocation", resource, request, None, _rpc_error_text(e))
            text = _rpc_error_text(e)
            raise AdmissionError(f"device plugin GetPreferredAllocation rpc failed with err: {text}") from e
        self._log_call("GetPreferredAllocation", resource, request, response, None)
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    def _call_allocate(self, uid: str, cname: str, resource: str, devices: list[str]) -> None:
        with self._cond:
            ep = self._state.endpoints.get(resource)
        if ep is None:
            raise AdmissionError(f"unknown Device Plugin {resource}")
        if ep.stopped or ep.stub is None:
            raise AdmissionError(f"endpoint {resource} has been stopped")
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=devices)])
        try:
            response = ep.stub.Allocate(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as e:
            self._log_call("Allocate", resource, request, None, _rpc_error_text(e))
            raise AdmissionError(_rpc_error_text(e)) from e
        self._log_call("Allocate", resource, request, response, None)
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        with self._cond:
            numa: dict[int, list[str]] = {}
            for d in devices:
                for node in _numa_of(self._state.all_devices.get(resource, {}).get(d)):
                    numa.setdefault(node, []).append(d)
            alloc = ContainerAllocation(
                pod_uid=uid, container=cname, resource=resource, device_ids=tuple(sorted(devices)),
                numa={n: tuple(ids) for n, ids in sorted(numa.items())},
                response=response.container_responses[0],
            )
            self._state.pod_devices.setdefault(uid, {}).setdefault(cname, {})[resource] = alloc
            self._write_checkpoint()

    def _pre_start(self, result: AdmitResult) -> AdmitResult:
        """PreStartContainer, at container start (after admission), for containers allocated just now."""
        containers = []
        for c in result.containers:
            error = None
            for resource in c.allocated_now:
                with self._cond:
                    ep = self._state.endpoints.get(resource)
                if ep is None or ep.options is None or not ep.options.pre_start_required or ep.stub is None:
                    continue
                request = dp.PreStartContainerRequest(devices_ids=list(c.allocations[resource].device_ids))
                try:
                    response = ep.stub.PreStartContainer(request, timeout=min(PRE_START_TIMEOUT_S,
                                                                              self.rpc_timeout_s))
                    self._log_call("PreStartContainer", resource, request, response, None)
                except grpc.RpcError as e:
                    self._log_call("PreStartContainer", resource, request, None, _rpc_error_text(e))
                    error = f"device plugin PreStartContainer rpc failed with err: {_rpc_error_text(e)}"
                    break
            containers.append(ContainerResult(c.name, c.init, c.allocations, c.allocated_now, error))
        return AdmitResult(result.uid, result.name, result.namespace, result.admitted, result.phase,
                           result.reason, result.message, tuple(containers))

    def scheduler_fit(self, pod: Any, resource: str) -> str | None:
        """kube-scheduler's NodeResourcesFit for one device-plugin resource on this node (the kubelet's
        predicate admission checks the same): None when the pod fits, else the plugin's reason,
        "Insufficient <resource>" (InsufficientResource.Reason; the figures are in the scheduler's log only).
        Allocatable is the count of healthy devices (what the kubelet publishes in node status); used is the
        requests of the node's active pods other than this one."""
        p = _as_dict(pod)
        uid = _meta(p).get("uid")
        with self._cond:
            allocatable = len(self._state.healthy.get(resource, set()))
            used = sum(pod_requests(other, resource) for u, other in self._pods.items() if u != uid)
        wanted = pod_requests(p, resource)
        if wanted and used + wanted > allocatable:
            return f"Insufficient {resource}"
        return None

    def release(self, pod_uid: str) -> None:
        """The pod finished (or was deleted): it is no longer active and its devices are free."""
        with self._cond:
            self._pods.pop(pod_uid, None)
            if self._state.pod_devices.pop(pod_uid, None) is not None:
                self._write_checkpoint()
            self._cond.notify_all()

    # -- pod-resources -------------------------------------------------------------------------------------

    def _container_resources(self, uid: str, container: Mapping[str, Any]) -> pr.ContainerResources:
        """Caller holds self._cond. podDevices.getContainerDevices: one ContainerDevices per NUMA node."""
        devices = []
        held = self._state.pod_devices.get(uid, {}).get(container["name"], {})
        for resource, alloc in sorted(held.items()):
            for node, ids in sorted(alloc.numa.items()):
                cd = pr.ContainerDevices(resource_name=resource, device_ids=list(ids))
                if node != NODE_WITHOUT_TOPOLOGY:
                    cd.topology.nodes.add(ID=node)
                devices.append(cd)
        return pr.ContainerResources(name=container["name"], devices=devices)

    def _pod_resources(self, uid: str, pod: PodLike) -> pr.PodResources:
        """Caller holds self._cond. Restartable init containers, then app containers, as upstream lists."""
        meta = _meta(pod)
        listed = [c for c, init in _containers(pod) if not init or _restartable(c)]
        return pr.PodResources(
            name=str(meta.get("name", "")), namespace=str(meta.get("namespace") or "default"),
            containers=[self._container_resources(uid, c) for c in listed],
        )

    def _pod_resources_list(self) -> list[pr.PodResources]:
        with self._cond:
            return [self._pod_resources(uid, pod) for uid, pod in self._pods.items()]

    def _pod_resources_get(self, namespace: str, name: str) -> pr.PodResources | None:
        with self._cond:
            for uid, pod in self._pods.items():
                meta = _meta(pod)
                if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                    return self._pod_resources(uid, pod)
        return None

    def _allocatable_devices(self) -> list[pr.ContainerDevices]:
        """GetAllocatableDevices: healthy devices only, one entry per device and NUMA node."""
        out = []
        with self._cond:
            for resource in sorted(self._state.healthy):
                for d in sorted(self._state.healthy[resource]):
                    for node in _numa_of(self._state.all_devices.get(resource, {}).get(d)):
                        cd = pr.ContainerDevices(resource_name=resource, device_ids=[d])
                        if node != NODE_WITHOUT_TOPOLOGY:
                            cd.topology.nodes.add(ID=node)
                        out.append(cd)
        return out

    # -- inspection and bounded waits ----------------------------------------------------------------------

    def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition"
    ) -> None:
        """Wait (bounded) until predicate() holds; it is re-checked on every state change of the kubelet."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake kubelet: {what} not reached within {timeout_s} s")
                self._cond.wait(timeout=min(left, 0.1))

    def wait_for_registration(
        self, resource: str, timeout_s: float = 10.0, after_sequence: int = 0
    ) -> Registration:
        """The newest accepted registration of `resource` in this incarnation, after `after_sequence`."""
        found: list[Registration] = []

        def registered() -> bool:
            found[:] = [r for r in self._registrations if r.resource_name == resource and r.error is None
                        and r.incarnation == self._incarnation and r.sequence > after_sequence]
            return bool(found)

        self.wait_for(registered, timeout_s, f"registration of {resource}")
        return found[-1]

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, str]], bool] | None = None,
        timeout_s: float = 10.0,
    ) -> dict[str, str]:
        """Wait until a ListAndWatch list arrived in this incarnation and predicate(id -> health) holds."""
        def ready() -> bool:
            if self._state.updates.get(resource, 0) == 0:
                return False
            return predicate is None or predicate(self._devices(resource))

        self.wait_for(ready, timeout_s, f"device list of {resource}")
        return self.devices(resource)

    def _devices(self, resource: str) -> dict[str, str]:
        healthy = self._state.healthy.get(resource, set())
        return {d: (HEALTHY if d in healthy else UNHEALTHY)
                for d in sorted(healthy | self._state.unhealthy.get(resource, set()))}

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> "Healthy" / "Unhealthy", as the kubelet currently counts them."""
        with self._cond:
            return self._devices(resource)

    def healthy_devices(self, resource: str) -> frozenset[str]:
        with self._cond:
            return frozenset(self._state.healthy.get(resource, set()))

    def device_updates(self, resource: str) -> int:
        """ListAndWatch messages received for `resource` in this incarnation."""
        with self._cond:
            return self._state.updates.get(resource, 0)

    def options(self, resource: str) -> dp.DevicePluginOptions | None:
        """The GetDevicePluginOptions answer of the connected plugin (None before it registers)."""
        with self._cond:
            ep = self._state.endpoints.get(resource)
            return ep.options if ep is not None else None

    def is_connected(self, resource: str) -> bool:
        with self._cond:
            ep = self._state.endpoints.get(resource)
            return ep is not None and not ep.stopped

    def registrations(self, resource: str | None = None) -> list[Registration]:
        with self._cond:
            return [r for r in self._registrations if resource is None or r.resource_name == resource]

    def calls(self, method: str | None = None, resource: str | None = None) -> list[RpcCall]:
        with self._cond:
            return [
                c for c in self._calls
                if (method is None or c.method == method) and (resource is None or c.resource == resource)
            ]

    def allocation(self, pod_uid: str, container: str) -> dict[str, ContainerAllocation]:
        """resource -> checkpointed allocation for one container ({} when it holds none)."""
        with self._cond:
            return dict(self._state.pod_devices.get(pod_uid, {}).get(container, {}))

    def allocations(self) -> dict[tuple[str, str], dict[str, ContainerAllocation]]:
        """(pod uid, container) -> resource -> allocation, for every active pod."""
        with self._cond:
            return {(uid, c): dict(rs) for uid, cs in self._state.pod_devices.items() for c, rs in cs.items()}

    def allocated_device_ids(self, resource: str) -> frozenset[str]:
        with self._cond:
            return frozenset(self._in_use(resource))

    def active_pods(self) -> list[PodLike]:
        with self._cond:
            return list(self._pods.values())


def cleanup_socket_dir(path: str | os.PathLike[str]) -> None:
    """Remove a directory made by short_socket_dir()."""
    shutil.rmtree(path, ignore_errors=True)


def _take(chosen: list[str], candidates: Iterable[str], required: int) -> bool:
    """Add candidates to `chosen` (no repeats) until it holds `required`; whether it does."""
    for d in candidates:
        if len(chosen) == required:
            break
        if d not in chosen:
            chosen.append(d)
    return len(chosen) == required
