"""Allocate without guessing: which pod is the kubelet admitting, and what its container receives.

The kubelet's Allocate call carries device IDs only — no pod, no container. The extender binds with the
annotation `vramfit.io/phase: allocating` and keeps at most one such pod per node until the kubelet admits it
(`status.startTime` set), so "the pod bound here, allocating, not admitted, not yet answered, whose
container asks for this many devices" names exactly one pod. Anything else (none, two) is refused with a
message: the kubelet then rejects the pod (`UnexpectedAdmissionError`) and its controller re-creates it.
A unit is never handed out on a guess.

A pod author writes annotations too, so neither is believed on its own: a pod is a candidate only when its
assignment carries vramfit's signature for its UID, this node and the exact text (`packing.k8s.trust`), and
the answer never hands out a unit another active pod on the node holds (a MIG instance or a whole GPU held
at all, a shared GPU past its replicas or its memory).

Everything here is pure: pod objects and the node's GPU description in, a decision out.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config import AgentConfig
from nodeagent.devices import TICKETS_PER_PLACE
from nodeagent.mps import ThreadPercentage, pipe_dir, thread_percentage
from packing.k8s.demand import (
    ANN_ASSIGNMENT,
    InputError,
    in_admission,
    is_active,
    parse_assignment,
    pod_key,
)
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys, signed_assignment
from packing.model import MPS_MAX_CLIENTS, GpuGrant, Mode, Node
from packing.modes import SHARED_MODES, ModeRules, mode_rules

GPU_RESOURCE = "vramfit.io/gpu"
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
# The volume-mounts strategy (NVIDIA's device plugin's convention): each unit is an empty mount under this
# directory, named by its UUID, and NVIDIA_VISIBLE_DEVICES names the directory; a runtime that takes device lists
# only from mounts (its `accept-nvidia-visible-devices-as-volume-mounts`) reads them there, and a pod cannot
# write mounts as it can write env.
DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices"
DEVICE_MOUNT_SOURCE = "/dev/null"
ENV_VRAM = "VRAMFIT_VRAM_MIB"
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_MEM = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# CUDA numbers a container's devices fastest first unless told PCI_BUS_ID (CUDA C Programming Guide, "CUDA
# Environment Variables"); every per-ordinal setting below counts devices in PCI bus order, so it is told.
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
DEVICE_ORDER = "PCI_BUS_ID"
# HAMi-core (github.com/Project-HAMi/HAMi-core, libvgpu.so), as HAMi's NVIDIA device plugin hands it to a
# container (pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go, Allocate): the library and
# /etc/ld.so.preload naming it mounted read-only, a per-container cache directory and the node's lock
# directory mounted read-write, a memory limit per device ordinal, an SM limit, the shared cache file.
ENV_HAMI_MEM = "CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"
ENV_HAMI_SM = "CUDA_DEVICE_SM_LIMIT"
ENV_HAMI_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CACHE_IN_CONTAINER = "/usr/local/vgpu/cache"
HAMI_CACHE_FILE = HAMI_CACHE_IN_CONTAINER + "/vgpu.cache"
HAMI_LOCK_IN_CONTAINER = "/tmp/vgpulock"  # HAMi-core's per-device lock files, shared by every container
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
MPS_PIPE_IN_CONTAINER = "/run/vramfit/mps"  # where the GPU's pipe directory is mounted in the container
ANN_UNITS = "vramfit.io/units"  # container annotation (passed to the runtime): the units, for audit
MAX_NOTES_IN_REFUSAL = 5  # pods passed over, named in a refusal message (the log gets them all)


class AllocateRefused(Exception):
    """No single pod matches this Allocate call; the message goes back to the kubelet and the pod's events.
    `notes`: every pod passed over and why (the message names the first few; the agent logs them all)."""

    def __init__(self, message: str, notes: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.notes = tuple(notes)


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
    memory_mib: int | None = None
    pci_bus_id: str | None = None  # when published; else the index stands for it (NVML numbers GPUs by PCI bus)


def node_units(annotation: Iterable[Mapping[str, Any]]) -> dict[int, GpuUnits]:
    """The published `vramfit.io/gpus` value (validated by the inventory) -> index -> GpuUnits."""
    out: dict[int, GpuUnits] = {}
    for g in annotation:
        mig = {f"{m['profile']}@{m['start']}": str(m["uuid"]) for m in g.get("mig") or []}
        memory = g.get("memory_mib")
        bus = g.get("pci_bus_id")
        out[int(g["index"])] = GpuUnits(index=int(g["index"]), uuid=str(g["uuid"]), mode=str(g["mode"]),
                                        replicas=g.get("replicas"), mig=mig,
                                        memory_mib=memory if isinstance(memory, int) and memory > 0 else None,
                                        pci_bus_id=bus.lower() if isinstance(bus, str) and bus else None)
    return out


@dataclass(frozen=True)
class Trust:
    """Whose assignments the agent believes: those signed with `keys`. No keys and `allow_unsigned` believes
    whatever a pod's annotation says (single-tenant or dry-run only); no keys without it believes nothing."""

    keys: SigningKeys | None
    allow_unsigned: bool = False


def trusted_assignment(pod: Mapping[str, Any], key: str, trust: Trust) -> tuple[str | None, str | None]:
    """The pod's assignment text when vramfit provably wrote it, else (None, why it is passed over)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANN_ASSIGNMENT) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return None, f"pod {key} carries no {ANN_ASSIGNMENT}"
    if trust.keys is None:
        if trust.allow_unsigned:
            return raw, None
        return None, f"pod {key}: no signing key is configured, so no assignment can be verified"
    if signed_assignment(trust.keys, pod, ANN_ASSIGNMENT) is not None:
        return raw, None
    if ANN_SIGNATURE not in annotations:
        return None, f"pod {key}: its {ANN_ASSIGNMENT} carries no {ANN_SIGNATURE} (vramfit did not write it)"
    return None, (f"pod {key}: its {ANN_SIGNATURE} does not verify for this pod's UID, node and assignment "
                  "(copied from another pod, replayed from another node, edited, or signed with another key)")


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


def admission_candidates(pods: Iterable[Mapping[str, Any]], node_name: str, answered: Mapping[str, int],
                         trust: Trust) -> tuple[list[PodInAdmission], list[str]]:
    """Pods that may be the subject of the next Allocate call, and notes on pods passed over (for the log).

    `answered`: pod UID -> containers of it the agent has answered already. A pod whose assignment vramfit
    did not provably write is passed over with a note."""
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
        if len(containers) > TICKETS_PER_PLACE:
            # The node advertises TICKETS_PER_PLACE tickets per place: more would take other pods' tickets.
            notes.append(f"pod {key} has {len(containers)} containers asking for {GPU_RESOURCE}, more than "
                         f"{TICKETS_PER_PLACE} containers per pod; passed over")
            continue
        raw, problem = trusted_assignment(pod, key, trust)
        if raw is None:
            notes.append(f"{problem}; passed over")
            continue
        try:
            grants = tuple(parse_assignment(raw, f"pod {key}"))
        except InputError as err:
            notes.append(str(err))
            continue
        found.append(PodInAdmission(uid=uid, key=key, grants=grants, gpu_containers=containers))
    return found, notes


def _passed_over(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    more = len(notes) - MAX_NOTES_IN_REFUSAL
    shown = "; ".join(notes[:MAX_NOTES_IN_REFUSAL]) + (f"; and {more} more" if more > 0 else "")
    return f" [{shown}]"


def pick_pod(candidates: list[PodInAdmission], answered: Mapping[str, int], n_devices: int,
             node_name: str, notes: Sequence[str] = ()) -> tuple[PodInAdmission, str]:
    """The one pod this Allocate call is for, and the name of the container being allocated.

    The device count must equal the next unanswered container's `vramfit.io/gpu` limit, which the webhook
    set to the pod's GPU count. `notes` (pods passed over) go into a refusal's message."""
    matching = [(p, p.gpu_containers[answered.get(p.uid, 0)]) for p in candidates]
    matching = [(p, c) for p, c in matching if c[1] == n_devices and len(p.grants) == n_devices]
    if len(matching) == 1:
        pod, (container, _) = matching[0]
        return pod, container
    if not matching:
        seen = ", ".join(f"{p.key} ({len(p.grants)} GPUs)" for p in candidates) or "none"
        raise AllocateRefused(f"no pod bound to {node_name} is waiting for {n_devices} {GPU_RESOURCE} "
                              f"(pods in admission: {seen}); refusing to guess{_passed_over(notes)}", notes)
    names = ", ".join(p.key for p, _ in matching)
    raise AllocateRefused(f"{len(matching)} pods on {node_name} are in admission with {n_devices} "
                          f"{GPU_RESOURCE} each ({names}); refusing to guess", notes)


# ---- units other pods hold ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """Units an active pod on the node holds: its verified assignment, or what the agent handed it."""

    uid: str
    key: str
    grants: tuple[GpuGrant, ...]


@dataclass(frozen=True)
class HandedOut:
    """One answer the agent gave (from its ledger): the unit UUIDs and the MiB of each (0 when unknown)."""

    uid: str
    key: str
    units: tuple[str, ...]
    vram_mib: tuple[int, ...] = ()


def containers_answered(handed_out: Iterable[HandedOut]) -> dict[str, int]:
    """Pod UID -> how many of its containers the agent has answered (one answer per container)."""
    out: dict[str, int] = {}
    for a in handed_out:
        out[a.uid] = out.get(a.uid, 0) + 1
    return out


def _grant_of_unit(uuid: str, vram: int, gpus: Mapping[int, GpuUnits]) -> GpuGrant | None:
    for gpu in gpus.values():
        if gpu.uuid == uuid:
            return GpuGrant(index=gpu.index, vram_mib=vram)
        for ref, mig_uuid in gpu.mig.items():
            if mig_uuid == uuid:
                return GpuGrant(index=gpu.index, vram_mib=vram, mig=ref)
    return None  # a unit of a GPU that is gone: nothing left to collide with


def node_holdings(pods: Iterable[Mapping[str, Any]], node_name: str, trust: Trust, handed_out: Iterable[HandedOut],
                  gpus: Mapping[int, GpuUnits], exclude_uid: str) -> list[Holding]:
    """What the node's other active pods hold: each one's verified assignment plus whatever the agent handed
    it (the ledger outlives an edited annotation). Pods finished, elsewhere or gone hold nothing."""
    by_uid: dict[str, tuple[str, dict[tuple[int, str | None], GpuGrant]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if (not isinstance(uid, str) or not uid or uid == exclude_uid or not is_active(pod)
                or (pod.get("spec") or {}).get("nodeName") != node_name):
            continue
        try:
            key = pod_key(pod)
        except InputError:
            key = uid
        grants: dict[tuple[int, str | None], GpuGrant] = {}
        raw, _ = trusted_assignment(pod, key, trust)
        if raw is not None:
            try:
                grants = {(g.index, g.mig): g for g in parse_assignment(raw, f"pod {key}")}
            except InputError:
                pass
        by_uid[uid] = (key, grants)
    for answer in handed_out:
        if answer.uid not in by_uid:
            continue
        for i, unit in enumerate(answer.units):
            vram = answer.vram_mib[i] if i < len(answer.vram_mib) else 0
            grant = _grant_of_unit(unit, vram, gpus)
            if grant is not None:
                held = by_uid[answer.uid][1]
                old = held.get((grant.index, grant.mig))
                if old is None or old.vram_mib < grant.vram_mib:
                    held[(grant.index, grant.mig)] = grant
    return [Holding(uid, key, tuple(grants.values())) for uid, (key, grants) in by_uid.items() if grants]


def _capacity(gpu: GpuUnits) -> int:
    return gpu.replicas or MPS_MAX_CLIENTS


def unit_conflicts(pod: PodInAdmission, holdings: Iterable[Holding], gpus: Mapping[int, GpuUnits]) -> list[str]:
    """Why handing the pod its units would give it something another active pod holds (empty: nothing)."""
    on_gpu: dict[int, list[tuple[Holding, GpuGrant]]] = {}
    for h in holdings:
        for g in h.grants:
            on_gpu.setdefault(g.index, []).append((h, g))
    problems: list[str] = []
    for grant in pod.grants:
        gpu = gpus.get(grant.index)
        others = on_gpu.get(grant.index, [])
        if gpu is None or not others:
            continue
        where = f"GPU {grant.index} ({gpu.uuid})"
        shared = gpu.mode in SHARED_MODES  # the core's shared modes (StrEnum); an unknown string counts as exclusive
        whole = [h.key for h, g in others if g.mig is None and (g.whole or not shared)]
        if whole:
            problems.append(f"{where} is held whole by {', '.join(sorted(set(whole)))}")
        elif grant.mig is not None:
            same = sorted({h.key for h, g in others if g.mig == grant.mig})
            if same:
                problems.append(f"MIG instance {grant.mig} on {where} is held by {', '.join(same)}")
        elif grant.whole or not shared:
            problems.append(f"{where} is wanted whole but {', '.join(sorted({h.key for h, _ in others}))} "
                            "holds part of it")
        else:
            problems.extend(_shared_problems(grant, gpu, where, others))
    return problems


def _shared_problems(grant: GpuGrant, gpu: GpuUnits, where: str,
                     others: list[tuple[Holding, GpuGrant]]) -> list[str]:
    """A share of an MPS or time-sliced GPU: one more client must fit its replicas and its memory."""
    used: dict[str, int] = {}
    for h, g in others:
        used[h.uid] = max(used.get(h.uid, 0), g.vram_mib)
    problems: list[str] = []
    if len(used) + 1 > _capacity(gpu):
        problems.append(f"{where} has all {_capacity(gpu)} {gpu.mode} replicas held by other pods")
    if gpu.memory_mib is not None and sum(used.values()) + grant.vram_mib > gpu.memory_mib:
        problems.append(f"{where} has {gpu.memory_mib - sum(used.values())} MiB not held by other pods, "
                        f"the assignment asks {grant.vram_mib} MiB")
    return problems


def select(pods: Sequence[Mapping[str, Any]], node_name: str, n_devices: int, trust: Trust,
           handed_out: Sequence[HandedOut], gpus: Mapping[int, GpuUnits]) -> tuple[PodInAdmission, str]:
    """The whole Allocate decision: the one pod in admission with a verified assignment for this many
    devices, whose units no other active pod holds, and its container. Raises AllocateRefused naming why."""
    answered = containers_answered(handed_out)
    candidates, notes = admission_candidates(pods, node_name, answered, trust)
    pod, container = pick_pod(candidates, answered, n_devices, node_name, notes)
    problems = unit_conflicts(pod, node_holdings(pods, node_name, trust, handed_out, gpus, pod.uid), gpus)
    if problems:
        raise AllocateRefused(f"pod {pod.key} is assigned units another active pod on {node_name} holds: "
                              f"{'; '.join(problems)}")
    return pod, container


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
    vram_mib: tuple[int, ...] = ()  # the MiB granted with each unit, same order
    # Host paths the mounts need before the container starts (`prepare_host_paths` makes them): directories
    # made fresh (a HAMi-core cache per allocation, as HAMi's plugin does), directories kept (shared), files.
    fresh_dirs: tuple[str, ...] = ()
    host_dirs: tuple[str, ...] = ()
    host_files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HamiCore:
    """Time-slice units capped by HAMi-core (`timeslice_enforcement: hami-core`): where its files live on the host."""

    library: str  # host path of libvgpu.so
    cache_dir: str  # host directory: ld.so.preload, the lock directory, one cache directory per container

    @property
    def preload_file(self) -> str:
        return f"{self.cache_dir.rstrip('/')}/ld.so.preload"

    @property
    def lock_dir(self) -> str:
        return f"{self.cache_dir.rstrip('/')}/vgpulock"

    def container_dir(self, pod_uid: str, container: str) -> str:
        name = f"{pod_uid}_{container}" if container else pod_uid or "unknown"
        return f"{self.cache_dir.rstrip('/')}/containers/{name}"


def hami_core_settings(config: AgentConfig) -> HamiCore | None:
    """The agent config's HAMi-core settings; None unless `timeslice_enforcement: hami-core`."""
    if config.timeslice_enforcement != "hami-core" or config.hami_core_library is None:
        return None
    return HamiCore(library=config.hami_core_library, cache_dir=config.hami_core_cache_dir)


@dataclass(frozen=True)
class AnswerSettings:
    strategy: str = "envvar"  # envvar | volume-mounts | cdi
    cdi_kind: str = "nvidia.com/gpu"
    mps_thread_percentage: ThreadPercentage = None  # int, "auto" (100 / replicas) or None
    # The MPS server and its clients meet in /dev/shm: the agent's daemons run with this host directory as
    # their /dev/shm (DaemonSet mount), and each MPS client gets the same one (NVIDIA's MPS daemon set does
    # the same with /run/nvidia/mps/shm).
    mps_shm_dir: str | None = None
    hami_core: HamiCore | None = None  # time-slice units capped at their booking by HAMi-core


def answer_for(pod: PodInAdmission, gpus: Mapping[int, GpuUnits], settings: AnswerSettings,
               mps_pipe_dirs: Mapping[str, str], container: str = "") -> ContainerAnswer:
    """The container's devices and environment for the pod's units, per mode (README "what happens to a pod").

    Per-device settings (the MPS pinned limit, HAMi-core's limits) name CUDA ordinals. Told
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`, CUDA numbers the container's devices by PCI bus id whatever order
    NVIDIA_VISIBLE_DEVICES lists them in; so ordinals are ranks in PCI bus order (the published bus id, else
    the GPU's index: NVML numbers GPUs by PCI bus, as nvidia-smi shows), and the list is written in that order
    too. `container` names the container's HAMi-core cache directory."""
    placed = _placed(pod, gpus)
    ordinal = {grant.index: n for n, (grant, _, _) in enumerate(sorted(placed, key=lambda p: _bus_key(p[1])))}
    uuids = [_unit_uuid(pod, grant, gpu, rules) for grant, gpu, rules in placed]
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    mps_limits: dict[int, str] = {}
    capped: dict[int, int] = {}
    for grant, gpu, rules in placed:
        if grant.mig is not None:
            continue
        if rules.client_limited:
            _join_daemon(pod, grant, gpu, settings, mps_pipe_dirs, envs, mounts)
            mps_limits[ordinal[grant.index]] = f"{ordinal[grant.index]}={grant.vram_mib}M"
        elif rules.shared:
            # Without a daemon nothing caps a shared unit (a time-slice replica) but HAMi-core where the
            # operator runs it: else the figure is for frameworks to cap themselves.
            envs[ENV_VRAM] = str(grant.vram_mib)
            if settings.hami_core is not None:
                capped[ordinal[grant.index]] = grant.vram_mib
    if mps_limits:
        envs[ENV_MPS_MEM] = ",".join(mps_limits[n] for n in sorted(mps_limits))
    paths = HostPaths()
    if capped and settings.hami_core is not None:
        paths = _hami_core(pod, container, settings.hami_core, capped, envs, mounts)
    if mps_limits or capped:
        envs[ENV_DEVICE_ORDER] = DEVICE_ORDER
    cdi: tuple[str, ...] = ()
    if settings.strategy == "cdi":
        cdi = tuple(f"{settings.cdi_kind}={u}" for u in uuids)
        # CDI injects the devices; "void" stops a legacy runtime hook from reading an image's `all` instead.
        envs[ENV_VISIBLE] = "void"
    else:
        by_bus = [u for _, u in sorted(zip(placed, uuids, strict=True), key=lambda pu: _bus_key(pu[0][1]))]
        if settings.strategy == "volume-mounts":
            envs[ENV_VISIBLE] = DEVICE_MOUNT_ROOT
            mounts.extend(Mount(container_path=f"{DEVICE_MOUNT_ROOT}/{u}", host_path=DEVICE_MOUNT_SOURCE)
                          for u in by_bus)
        else:
            envs[ENV_VISIBLE] = ",".join(by_bus)
    return ContainerAnswer(envs=envs, mounts=tuple(mounts), annotations={ANN_UNITS: ",".join(uuids)},
                           cdi_devices=cdi, units=tuple(uuids), modes=tuple(gpu.mode for _, gpu, _ in placed),
                           vram_mib=tuple(g.vram_mib for g in pod.grants), fresh_dirs=paths.fresh_dirs,
                           host_dirs=paths.host_dirs, host_files=paths.host_files)


@dataclass(frozen=True)
class HostPaths:
    fresh_dirs: tuple[str, ...] = ()
    host_dirs: tuple[str, ...] = ()
    host_files: tuple[tuple[str, str], ...] = ()


def _placed(pod: PodInAdmission, gpus: Mapping[int, GpuUnits]) -> list[tuple[GpuGrant, GpuUnits, ModeRules]]:
    """Each grant with its GPU and the GPU's mode rules, in assignment order; AllocateRefused for a GPU the
    node does not have."""
    out: list[tuple[GpuGrant, GpuUnits, ModeRules]] = []
    for grant in pod.grants:
        gpu = gpus.get(grant.index)
        if gpu is None:
            raise AllocateRefused(f"pod {pod.key} is assigned GPU {grant.index}, which this node does not have")
        out.append((grant, gpu, mode_rules(Mode(gpu.mode))))
    return out


def _bus_key(gpu: GpuUnits) -> tuple[bool, str, int]:
    """PCI bus order: the published bus id where every GPU has one, else the index NVML gave in that order."""
    return (gpu.pci_bus_id is None, gpu.pci_bus_id or "", gpu.index)


def _hami_core(pod: PodInAdmission, container: str, hami: HamiCore, capped: Mapping[int, int],
               envs: dict[str, str], mounts: list[Mount]) -> HostPaths:
    """What HAMi-core needs to cap the container at its booking: its library preloaded through the container's
    /etc/ld.so.preload (not LD_PRELOAD, which the pod's own env could drop), a limit per device ordinal in MiB
    ("<n>m"), no SM limit (time-slicing shares compute as before), its own cache file. Returns the host
    directories and files the mounts need."""
    for n in sorted(capped):
        envs[ENV_HAMI_MEM.format(ordinal=n)] = f"{capped[n]}m"
    envs[ENV_HAMI_SM] = "100"
    envs[ENV_HAMI_CACHE] = HAMI_CACHE_FILE
    cache = hami.container_dir(pod.uid, container)
    mounts.extend((Mount(HAMI_LIBRARY_IN_CONTAINER, hami.library, read_only=True),
                   Mount(PRELOAD_IN_CONTAINER, hami.preload_file, read_only=True),
                   Mount(HAMI_CACHE_IN_CONTAINER, cache),
                   Mount(HAMI_LOCK_IN_CONTAINER, hami.lock_dir)))
    return HostPaths(fresh_dirs=(cache,), host_dirs=(hami.lock_dir,),
                     host_files=((hami.preload_file, HAMI_LIBRARY_IN_CONTAINER + "\n"),))


def _unit_uuid(pod: PodInAdmission, grant: GpuGrant, gpu: GpuUnits, rules: ModeRules) -> str:
    """The UUID the grant hands out: its instance's on an instanced GPU, else the GPU's; AllocateRefused when
    the grant and the GPU's mode disagree (an instance this node lacks, or a whole instanced GPU)."""
    if grant.mig is not None:
        if not rules.instanced or grant.mig not in gpu.mig:
            raise AllocateRefused(f"pod {pod.key} is assigned MIG instance {grant.mig} on GPU {grant.index}, "
                                  "which this node does not have (re-partitioned?)")
        return gpu.mig[grant.mig]
    if rules.instanced:
        raise AllocateRefused(f"pod {pod.key} is assigned all of GPU {grant.index}, which is in MIG mode")
    return gpu.uuid


def _join_daemon(pod: PodInAdmission, grant: GpuGrant, gpu: GpuUnits, settings: AnswerSettings,
                 mps_pipe_dirs: Mapping[str, str], envs: dict[str, str], mounts: list[Mount]) -> None:
    """The environment and mounts that make the container a client of the GPU's MPS control daemon."""
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
    pct = thread_percentage(settings.mps_thread_percentage, gpu.replicas)
    if pct is not None:
        envs[ENV_MPS_THREADS] = str(pct)


def answer_for_node(node: Node, key: str, grants: tuple[GpuGrant, ...], settings: AnswerSettings,
                    mps_root: str) -> ContainerAnswer:
    """What a container placed on `node` would receive, from the core's view of the node (what-if, demo):
    the same answer as the agent's, with `<node>/gpu<i>` standing in for UUIDs a snapshot does not carry."""
    units: dict[int, GpuUnits] = {}
    for g in node.gpus:
        uuid = g.uuid or f"<{node.name}/gpu{g.index}>"
        mig = {i.ref: i.uuid or f"<{node.name}/gpu{g.index}/{i.ref}>" for i in g.mig}
        units[g.index] = GpuUnits(index=g.index, uuid=uuid, mode=g.mode.value, replicas=g.replicas, mig=mig)
    pipes = {u.uuid: pipe_dir(mps_root, u.uuid) for u in units.values()
             if mode_rules(Mode(u.mode)).client_limited}
    pod = PodInAdmission(uid="", key=key, grants=grants, gpu_containers=())
    return answer_for(pod, units, settings, pipes)


def prepare_host_paths(answer: ContainerAnswer) -> None:
    """Make the host paths an answer's mounts need (the one part of Allocate that writes: the kubelet's runtime
    refuses a bind mount whose source is missing). Directories are emptied and left writable by any user (the
    workload's user is not the agent's to know, as in HAMi's plugin); files are written when they differ."""
    for raw in answer.fresh_dirs + answer.host_dirs:
        path = Path(raw)
        if raw in answer.fresh_dirs and path.is_dir():
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o777)  # noqa: S103 - containers of any user open their cache and locks here
    for raw, text in answer.host_files:
        path = Path(raw)
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            os.chmod(path, 0o644)
