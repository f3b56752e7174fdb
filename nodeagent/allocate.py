"""Allocate without guessing: which pod is the kubelet admitting, and what its container receives.

The kubelet's Allocate call carries device IDs only — no pod, no container. The extender binds with the
annotation `vramfit.io/phase: allocating` and keeps at most one such pod per node until the kubelet admits it
(`status.startTime` set), so "the pod bound here, allocating, not admitted, not yet answered, whose
container asks for this many devices" names exactly one pod. Anything else (none, two) is refused with a
message: the kubelet then rejects the pod (`UnexpectedAdmissionError`) and its controller re-creates it.
A unit is never handed out on a guess.

Everything here is pure: pod objects and the node's GPU description in, a decision out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.mps import ThreadPercentage, pipe_dir, thread_percentage
from packing.k8s.demand import (
    ANN_ASSIGNMENT,
    InputError,
    in_admission,
    parse_assignment,
    pod_key,
)
from packing.model import GpuGrant, Mode, Node

GPU_RESOURCE = "vramfit.io/gpu"
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_VRAM = "VRAMFIT_VRAM_MIB"
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_MEM = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_PIPE_IN_CONTAINER = "/run/vramfit/mps"  # where the GPU's pipe directory is mounted in the container
ANN_UNITS = "vramfit.io/units"  # container annotation (passed to the runtime): the units, for audit


class AllocateRefused(Exception):
    """No single pod matches this Allocate call; the message goes back to the kubelet and the pod's events."""


class UnitUnavailable(AllocateRefused):
    """The unit exists but cannot be served this moment (its MPS daemon is restarting): worth a short wait."""


@dataclass(frozen=True)
class GpuUnits:
    """One physical GPU as the agent published it: its UUID, mode, and its MIG instances by ref."""

    index: int
    uuid: str
    mode: str
    replicas: int | None = None
    mig: Mapping[str, str] = field(default_factory=dict)  # "<profile>@<start>" -> MIG UUID


def node_units(annotation: Iterable[Mapping[str, Any]]) -> dict[int, GpuUnits]:
    """The published `vramfit.io/gpus` value (validated by the inventory) -> index -> GpuUnits."""
    out: dict[int, GpuUnits] = {}
    for g in annotation:
        mig = {f"{m['profile']}@{m['start']}": str(m["uuid"]) for m in g.get("mig") or []}
        out[int(g["index"])] = GpuUnits(index=int(g["index"]), uuid=str(g["uuid"]), mode=str(g["mode"]),
                                        replicas=g.get("replicas"), mig=mig)
    return out


@dataclass(frozen=True)
class PodInAdmission:
    """A pod bound to this node that the kubelet has not admitted yet, as far as the agent can tell."""

    uid: str
    key: str
    grants: tuple[GpuGrant, ...]
    gpu_containers: tuple[tuple[str, int], ...]  # (container name, vramfit.io/gpu limit), kubelet order


def _limit(container: Mapping[str, Any]) -> int:
    # The kubelet's device manager reads Limits only (requests of an extended resource must equal them).
    limits = ((container.get("resources") or {}).get("limits") or {})
    raw = limits.get(GPU_RESOURCE)
    if raw is None:
        return 0
    try:
        return int(str(raw))
    except ValueError:
        return 0


def gpu_containers(pod: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Containers that ask for `vramfit.io/gpu`, in the order the kubelet allocates them: init, then app."""
    spec = pod.get("spec") or {}
    out: list[tuple[str, int]] = []
    for section in ("initContainers", "containers"):
        for c in spec.get(section) or []:
            n = _limit(c)
            if n > 0:
                out.append((str(c.get("name") or ""), n))
    return tuple(out)


def admission_candidates(pods: Iterable[Mapping[str, Any]], node_name: str,
                         answered: Mapping[str, int]) -> tuple[list[PodInAdmission], list[str]]:
    """Pods that may be the subject of the next Allocate call, and notes on pods passed over (for the log).

    `answered`: pod UID -> containers of it the agent has answered already."""
    found: list[PodInAdmission] = []
    notes: list[str] = []
    for pod in pods:
        if not in_admission(pod, node_name):
            continue
        meta = pod.get("metadata") or {}
        try:
            key = pod_key(pod)
        except InputError:
            continue
        uid = str(meta.get("uid") or "")
        containers = gpu_containers(pod)
        if answered.get(uid, 0) >= len(containers):
            continue  # every container of it was answered: the kubelet is past its Allocate calls
        raw = (meta.get("annotations") or {}).get(ANN_ASSIGNMENT)
        if raw is None:
            notes.append(f"pod {key} is allocating but carries no {ANN_ASSIGNMENT}")
            continue
        try:
            grants = tuple(parse_assignment(raw, f"pod {key}"))
        except InputError as err:
            notes.append(str(err))
            continue
        found.append(PodInAdmission(uid=uid, key=key, grants=grants, gpu_containers=containers))
    return found, notes


def pick_pod(candidates: list[PodInAdmission], answered: Mapping[str, int], n_devices: int,
             node_name: str) -> tuple[PodInAdmission, str]:
    """The one pod this Allocate call is for, and the name of the container being allocated.

    The device count must equal the next unanswered container's `vramfit.io/gpu` limit, which the webhook
    set to the pod's GPU count."""
    matching = [(p, p.gpu_containers[answered.get(p.uid, 0)]) for p in candidates]
    matching = [(p, c) for p, c in matching if c[1] == n_devices and len(p.grants) == n_devices]
    if len(matching) == 1:
        pod, (container, _) = matching[0]
        return pod, container
    if not matching:
        seen = ", ".join(f"{p.key} ({len(p.grants)} GPUs)" for p in candidates) or "none"
        raise AllocateRefused(f"no pod bound to {node_name} is waiting for {n_devices} {GPU_RESOURCE} "
                              f"(pods in admission: {seen}); refusing to guess")
    names = ", ".join(p.key for p, _ in matching)
    raise AllocateRefused(f"{len(matching)} pods on {node_name} are in admission with {n_devices} "
                          f"{GPU_RESOURCE} each ({names}); refusing to guess")


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerAnswer:
    """What one container receives (a ContainerAllocateResponse, before protobuf)."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    units: tuple[str, ...] = ()  # the UUIDs handed out, in assignment order (log, metrics, reconcile)
    modes: tuple[str, ...] = ()  # the sharing mode of each unit, same order


@dataclass(frozen=True)
class AnswerSettings:
    strategy: str = "envvar"  # envvar | cdi
    cdi_kind: str = "nvidia.com/gpu"
    mps_thread_percentage: ThreadPercentage = None  # int, "auto" (100 / replicas) or None
    # The MPS server and its clients meet in /dev/shm: the agent's daemons run with this host directory as
    # their /dev/shm (DaemonSet mount), and each MPS client gets the same one (NVIDIA's MPS daemon set does
    # the same with /run/nvidia/mps/shm).
    mps_shm_dir: str | None = None


def answer_for(pod: PodInAdmission, gpus: Mapping[int, GpuUnits], settings: AnswerSettings,
               mps_pipe_dirs: Mapping[str, str]) -> ContainerAnswer:
    """The container's devices and environment for the pod's units, per mode (README "what happens to a pod")."""
    uuids: list[str] = []
    modes: list[str] = []
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    mps_limits: list[str] = []
    for ordinal, grant in enumerate(pod.grants):
        gpu = gpus.get(grant.index)
        if gpu is None:
            raise AllocateRefused(f"pod {pod.key} is assigned GPU {grant.index}, which this node does not have")
        modes.append(gpu.mode)
        if grant.mig is not None:
            if gpu.mode != "mig" or grant.mig not in gpu.mig:
                raise AllocateRefused(f"pod {pod.key} is assigned MIG instance {grant.mig} on GPU {grant.index}, "
                                      "which this node does not have (re-partitioned?)")
            uuids.append(gpu.mig[grant.mig])
            continue
        if gpu.mode == "mig":
            raise AllocateRefused(f"pod {pod.key} is assigned all of GPU {grant.index}, which is in MIG mode")
        uuids.append(gpu.uuid)
        if gpu.mode == "mps":
            pipe = mps_pipe_dirs.get(gpu.uuid)
            if pipe is None:
                raise UnitUnavailable(f"GPU {grant.index} ({gpu.uuid}) is an MPS GPU without a running "
                                      "MPS control daemon")
            if ENV_MPS_PIPE in envs:
                # One CUDA process talks to one MPS server; vramfit runs one daemon per GPU.
                raise AllocateRefused(f"pod {pod.key} is assigned more than one MPS GPU; a process can "
                                      "reach one MPS control daemon only")
            envs[ENV_MPS_PIPE] = MPS_PIPE_IN_CONTAINER
            mounts.append(Mount(MPS_PIPE_IN_CONTAINER, pipe))
            if settings.mps_shm_dir:
                mounts.append(Mount("/dev/shm", settings.mps_shm_dir))
            # Ordinals count the container's visible devices, in the order NVIDIA_VISIBLE_DEVICES lists them.
            mps_limits.append(f"{ordinal}={grant.vram_mib}M")
            pct = thread_percentage(settings.mps_thread_percentage, gpu.replicas)
            if pct is not None:
                envs[ENV_MPS_THREADS] = str(pct)
        elif gpu.mode == "timeslice":
            # Nothing in hardware caps a time-slice replica: the figure is for frameworks to cap themselves.
            envs[ENV_VRAM] = str(grant.vram_mib)
    if mps_limits:
        envs[ENV_MPS_MEM] = ",".join(mps_limits)
    cdi: tuple[str, ...] = ()
    if settings.strategy == "cdi":
        cdi = tuple(f"{settings.cdi_kind}={u}" for u in uuids)
        # CDI injects the devices; "void" stops a legacy runtime hook from reading an image's `all` instead.
        envs[ENV_VISIBLE] = "void"
    else:
        envs[ENV_VISIBLE] = ",".join(uuids)
    return ContainerAnswer(envs=envs, mounts=tuple(mounts), annotations={ANN_UNITS: ",".join(uuids)},
                           cdi_devices=cdi, units=tuple(uuids), modes=tuple(modes))


def answer_for_node(node: Node, key: str, grants: tuple[GpuGrant, ...], settings: AnswerSettings,
                    mps_root: str) -> ContainerAnswer:
    """What a container placed on `node` would receive, from the core's view of the node (what-if, demo):
    the same answer as the agent's, with `<node>/gpu<i>` standing in for UUIDs a snapshot does not carry."""
    units: dict[int, GpuUnits] = {}
    for g in node.gpus:
        uuid = g.uuid or f"<{node.name}/gpu{g.index}>"
        mig = {i.ref: i.uuid or f"<{node.name}/gpu{g.index}/{i.ref}>" for i in g.mig}
        units[g.index] = GpuUnits(index=g.index, uuid=uuid, mode=g.mode.value, replicas=g.replicas, mig=mig)
    pipes = {u.uuid: pipe_dir(mps_root, u.uuid) for u in units.values() if u.mode == Mode.MPS.value}
    pod = PodInAdmission(uid="", key=key, grants=grants, gpu_containers=())
    return answer_for(pod, units, settings, pipes)
