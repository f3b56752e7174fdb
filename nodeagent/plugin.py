"""The kubelet device plugin (API v1beta1) for `vramfit.io/gpu`, on a unix socket in the plugin directory.

Lifecycle, as the kubelet's device manager expects it:
    serve DevicePlugin on <dir>/vramfit.sock -> Register with <dir>/kubelet.sock -> the kubelet dials back,
    asks the options and opens ListAndWatch (the full device list now, again on every change).
When the kubelet restarts it wipes the directory's sockets and re-creates kubelet.sock: the watcher sees our
socket gone (or kubelet.sock replaced), serves a fresh socket and registers again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from nodeagent.allocate import (
    GPU_RESOURCE,
    AllocateRefused,
    AnswerSettings,
    ContainerAnswer,
    PodInAdmission,
    Trust,
    UnitUnavailable,
    answer_for,
    node_units,
    prepare_host_paths,
    select,
)
from nodeagent.api import deviceplugin_v1beta1_pb2 as pb
from nodeagent.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from nodeagent.devices import DeviceTable, gpu_of
from nodeagent.ledger import Ledger
from nodeagent.metrics import AgentMetrics
from nodeagent.pods import PodSource

log = logging.getLogger("vramfit.node.plugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
PLUGIN_SOCKET = "vramfit.sock"
REPEAT_LOG_S = 60.0  # a condition that persists (no kubelet, a socket that cannot bind) is logged again this often


class _Said:
    """Logs a persisting condition once, then again only every `every_s` seconds or when it changes."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: tuple[str, float] | None = None

    def __call__(self, level: int, message: str) -> None:
        now = time.monotonic()
        if self._last is not None and self._last[0] == message and now - self._last[1] < self.every_s:
            return
        self._last = (message, now)
        log.log(level, "%s", message)

    def clear(self) -> None:
        self._last = None


@dataclass
class PluginContext:
    """What the servicer reads: the node, its published GPUs, the pod source, MPS pipes, the ledger, and whose
    assignments to believe (by default nobody's: every Allocate is refused until a key is given)."""

    node_name: str
    published: Callable[[], list[dict[str, Any]]]  # the current vramfit.io/gpus value
    pods: PodSource
    settings: AnswerSettings
    mps_pipe_dirs: Callable[[], dict[str, str]]
    ledger: Ledger
    metrics: AgentMetrics
    lookup_s: float = 3.0
    trust: Trust = Trust(keys=None)
    devices: DeviceTable = field(default_factory=DeviceTable)
    changed: threading.Condition = field(default_factory=threading.Condition)
    generation: int = 0

    def devices_changed(self) -> None:
        with self.changed:
            self.generation += 1
            self.changed.notify_all()


class DevicePlugin(pb_grpc.DevicePluginServicer):
    def __init__(self, ctx: PluginContext, stop: threading.Event) -> None:
        self.ctx = ctx
        self.stop = stop
        self._allocate_lock = threading.Lock()  # the kubelet admits one pod at a time; so do we

    # -- options and the device stream ------------------------------------------------------------
    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        ctx = self.ctx
        sent = -1
        while not self.stop.is_set() and context.is_active():
            with ctx.changed:
                if ctx.generation == sent:
                    ctx.changed.wait(timeout=1.0)
                    if ctx.generation == sent:
                        continue
                sent = ctx.generation
                devices = ctx.devices.devices()
            ctx.metrics.set_devices(devices)
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=d.id, health=d.health) for d in devices])

    # -- allocation -------------------------------------------------------------------------------
    def _select(self, pods: list[dict[str, Any]], n_devices: int) -> tuple[PodInAdmission, str]:
        ctx = self.ctx
        return select(pods, ctx.node_name, n_devices, ctx.trust, ctx.ledger.handed_out(),
                      node_units(ctx.published()))

    def _identify(self, n_devices: int) -> tuple[PodInAdmission, str]:
        """The pod being admitted, its units free: from the cached pods, else re-read for up to `lookup_s`
        (the watch may lag the kubelet, or still show a pod that has just finished)."""
        ctx = self.ctx
        deadline = time.monotonic() + ctx.lookup_s
        pods = ctx.pods.pods()
        while True:
            try:
                return self._select(pods, n_devices)
            except AllocateRefused as err:
                if time.monotonic() >= deadline:
                    for note in err.notes:
                        log.warning("%s", note)
                    raise
            time.sleep(0.1)
            try:
                pods = ctx.pods.refresh()
            except Exception as err:  # noqa: BLE001 - the API may be away; keep trying until the deadline
                log.warning("re-reading the pods of %s failed: %s", ctx.node_name, err)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        """Prefer tickets of the GPUs the pod in admission was assigned, so the kubelet's accounting (and the
        pod-resources view DCGM reads) names the right physical GPUs. A hint only: Allocate decides."""
        out = []
        units = {g["index"]: str(g["uuid"]) for g in self.ctx.published()}
        for creq in request.container_requests:
            want = list(creq.must_include_deviceIDs)
            available = [d for d in creq.available_deviceIDs if d not in want]
            size = creq.allocation_size
            try:
                pod, _ = self._pick_quiet(size)
                gpus = [units.get(g.index) for g in pod.grants]
            except AllocateRefused:
                gpus = []
            for gpu in gpus:
                if len(want) >= size:
                    break
                if any(gpu_of(d) == gpu for d in want):
                    continue
                match = next((d for d in available if gpu_of(d) == gpu), None)
                if match is not None:
                    want.append(match)
                    available.remove(match)
            want.extend(available[:max(0, size - len(want))])
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=want[:size]))
        return pb.PreferredAllocationResponse(container_responses=out)

    def _pick_quiet(self, n: int) -> tuple[PodInAdmission, str]:
        """The pod in admission for a hint: the cached view, else one re-read (no waiting: it is a hint)."""
        ctx = self.ctx
        for read in (ctx.pods.pods, ctx.pods.refresh):
            try:
                return self._select(read(), n)
            except AllocateRefused:
                continue
            except Exception as err:  # noqa: BLE001 - an unreachable API only costs the hint
                log.info("re-reading pods for a preferred allocation failed: %s", err)
                break
        raise AllocateRefused("no single pod in admission")

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        ctx = self.ctx
        started = time.perf_counter()
        responses = []
        with self._allocate_lock:
            for creq in request.container_requests:
                ids = list(creq.devices_ids)
                try:
                    pod, container = self._identify(len(ids))
                    answer = _answer(ctx, pod, container)
                    _prepare(answer)
                except AllocateRefused as err:
                    ctx.metrics.allocation("refused", time.perf_counter() - started)
                    log.error("Allocate of %d %s on %s refused: %s", len(ids), GPU_RESOURCE, ctx.node_name, err)
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"vramfit: {err}")
                ctx.ledger.record(pod.uid, pod.key, container, ids, answer.units, answer.vram_mib)
                for mode in answer.modes:
                    ctx.metrics.units.labels(mode).inc()
                log.info("Allocate: pod %s container %s on %s gets %s (devices %s)", pod.key, container,
                         ctx.node_name, ",".join(answer.units), ",".join(ids))
                responses.append(_response(answer))
        ctx.metrics.allocation("ok", time.perf_counter() - started)
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _answer(ctx: PluginContext, pod: PodInAdmission, container: str) -> ContainerAnswer:
    """The container's answer; a unit that is only briefly away (an MPS daemon restarting) is waited for."""
    deadline = time.monotonic() + ctx.lookup_s
    while True:
        try:
            return answer_for(pod, node_units(ctx.published()), ctx.settings, ctx.mps_pipe_dirs(), container)
        except UnitUnavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _prepare(answer: ContainerAnswer) -> None:
    """The host paths the answer's mounts need, made before the kubelet hears of them (its runtime refuses a
    bind mount whose source is missing); a path the agent cannot write refuses the Allocate by name."""
    try:
        prepare_host_paths(answer)
    except OSError as err:
        raise AllocateRefused(f"cannot prepare the host path {err.filename or ''} the container's mounts need "
                              f"({err.strerror or err}); is hami_core_cache_dir mounted into the node agent "
                              "read-write?") from None


def _response(answer: ContainerAnswer) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=answer.envs,
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in answer.mounts],
        annotations=answer.annotations,
        cdi_devices=[pb.CDIDevice(name=n) for n in answer.cdi_devices],
    )


class CannotServe(Exception):
    """The plugin socket cannot be bound (a missing or read-only directory, a path too long)."""


def _rpc_text(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    code = getattr(err, "code", None)
    if callable(details) and callable(code):
        return f"{code().name}: {details()}"
    return str(err)


class PluginServer:
    """Serves the plugin socket, registers with the kubelet, and does both again after a kubelet restart."""

    def __init__(self, ctx: PluginContext, plugin_dir: str, *, poll_s: float = 0.5,
                 repeat_log_s: float = REPEAT_LOG_S) -> None:
        self.ctx = ctx
        # gRPC reads `unix://dir/x` as host `dir`, so a relative directory never binds: make it absolute.
        self.plugin_dir = os.path.abspath(plugin_dir)
        self.poll_s = poll_s
        self._said = _Said(repeat_log_s)
        self.stop_event = threading.Event()
        self._server: grpc.Server | None = None
        self._kubelet_id: tuple[int, int] | None = None  # (inode, mtime_ns) of kubelet.sock we registered with
        self._thread: threading.Thread | None = None
        self.registered = threading.Event()

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, PLUGIN_SOCKET)

    @property
    def kubelet_path(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    def _serve(self) -> None:
        self._stop_server()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        pb_grpc.add_DevicePluginServicer_to_server(DevicePlugin(self.ctx, self.stop_event), server)
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError:
            server.stop(None)
            raise CannotServe(f"cannot serve the device plugin on {self.socket_path} (is {self.plugin_dir} a "
                              "writable directory?); trying again") from None
        server.start()
        self._server = server

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.kubelet_path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_path}") as channel:
            stub = pb_grpc.RegistrationStub(channel)
            stub.Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=PLUGIN_SOCKET, resource_name=GPU_RESOURCE,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
            ), timeout=5)

    def _cycle(self) -> None:
        """Serve and register when needed; called every poll."""
        kubelet = self._kubelet_identity()
        ours = os.path.exists(self.socket_path)
        if self._server is not None and ours and kubelet is not None and kubelet == self._kubelet_id:
            return  # healthy
        if kubelet is None:
            self.registered.clear()
            self._said(logging.WARNING, f"waiting for the kubelet: no {KUBELET_SOCKET} in {self.plugin_dir} yet "
                                        f"({GPU_RESOURCE} registers once it appears; is this the kubelet's "
                                        "device plugin directory?)")
            return
        if self._server is None or not ours:
            try:
                self._serve()
            except CannotServe as err:
                self.registered.clear()
                self._said(logging.ERROR, str(err))
                return
        try:
            self._register()
        except grpc.RpcError as err:
            self.ctx.metrics.registration("failed")
            self._said(logging.WARNING, f"registering {GPU_RESOURCE} with the kubelet at {self.kubelet_path} "
                                        f"failed: {_rpc_text(err)}; trying again")
            self.registered.clear()
            return
        self._kubelet_id = kubelet
        self.ctx.metrics.registration("ok")
        self.registered.set()
        self._said.clear()
        log.info("registered %s with the kubelet at %s", GPU_RESOURCE, self.kubelet_path)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._cycle()
            except Exception:  # noqa: BLE001 - keep watching the kubelet whatever one cycle hit
                log.exception("device plugin cycle failed")
            self.stop_event.wait(self.poll_s)
        self._stop_server()

    def start(self) -> PluginServer:
        self._thread = threading.Thread(target=self.run, name="device-plugin-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.ctx.devices_changed()
        if self._thread is not None:
            self._thread.join(timeout=5)
