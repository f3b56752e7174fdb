"""What each pod really uses: NVML's per-process VRAM, mapped to pods and containers, beside what was booked.

    NVML (read-only)  nvmlDeviceGetComputeRunningProcesses_v3 on each whole GPU and on each MIG device handle
                      (on a MIG GPU's parent handle NVML aggregates only for a privileged caller, so the
                      instances are asked one by one); nvmlDeviceGetMPSComputeRunningProcesses_v3 for MPS
                      clients (the compute list holds the MPS server, not its clients)
    /proc/<pid>/cgroup   -> pod UID and container ID (nodeagent/cgroups.py)
    watched pods         -> namespace, name; container ID -> name (status.*containerStatuses[].containerID)
    ledger + assignment  -> booked bytes per pod and unit (what the agent handed out, else the signed assignment)

A process is counted once, for the one pod its cgroup names; one NVML could not place, or whose pod the agent
does not know, is listed as unmapped with why, never dropped. `usedGpuMemory` NVML cannot give (pynvml's None
for NVML_VALUE_NOT_AVAILABLE: WDDM, and pre-Volta MPS clients, which share the server's address space) stays
None: unknown, never 0. Peaks are kept from the agent's first sample of the pod (not across agent restarts).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nodeagent.allocate import Trust, gpu_containers, node_units, trusted_assignment
from nodeagent.cgroups import ProcessOwner, container_id, read_owner
from nodeagent.ledger import Answer
from nodeagent.nvml import _describe, _is, _text, started
from packing.k8s.demand import InputError, is_active, parse_assignment, pod_key
from packing.k8s.pod_usage import NodeUsageReport, PodUsage, UnmappedProcess
from packing.model import Mode
from packing.modes import mode_rules

log = logging.getLogger("vramfit.node.usage")
MIB = 1024 * 1024


# ---- units: what the agent published ------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    uuid: str  # the unit's own UUID: a MIG device's, else the GPU's
    gpu_uuid: str  # the physical GPU's
    word: str  # gpu | mps | timeslice | mig:<profile>@<start>
    shared: bool  # others' pods share it (MPS, time-slice): over-use harms them


def units_of(published: Iterable[Mapping[str, Any]]) -> dict[str, Unit]:
    """UUID -> unit, from the published `vramfit.io/gpus` value (the modes' facts name the word)."""
    out: dict[str, Unit] = {}
    for g in published:
        gpu_uuid = str(g["uuid"])
        rules = mode_rules(Mode(str(g["mode"])))
        for m in g.get("mig") or []:
            out[str(m["uuid"])] = Unit(str(m["uuid"]), gpu_uuid, f"mig:{m['profile']}@{m['start']}", False)
        word = "mps" if rules.client_limited else "timeslice" if rules.shared else "mig" if rules.instanced else "gpu"
        out[gpu_uuid] = Unit(gpu_uuid, gpu_uuid, word, rules.shared)
    return out


# ---- NVML: processes per unit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    unit_uuid: str  # the MIG device's UUID, or the GPU's
    gpu_uuid: str
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE
    mps_client: bool = False


def _used(info: Any) -> int | None:
    v = getattr(info, "usedGpuMemory", None)
    return int(v) if isinstance(v, int) and v >= 0 else None


def _call_list(nvml: Any, name: str, handle: Any) -> list[Any]:
    fn = getattr(nvml, name + "_v3", None) or getattr(nvml, name)
    return list(fn(handle) or [])


def _unit_processes(nvml: Any, handle: Any, unit_uuid: str, gpu_uuid: str, mps: bool) -> list[GpuProcess]:
    seen: dict[int, GpuProcess] = {}
    for info in _call_list(nvml, "nvmlDeviceGetComputeRunningProcesses", handle):
        seen[int(info.pid)] = GpuProcess(int(info.pid), unit_uuid, gpu_uuid, _used(info))
    if mps:
        try:
            clients = _call_list(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", handle)
        except nvml.NVMLError as exc:
            if not _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                raise
            clients = []
        for info in clients:  # a client listed twice is the same process: the MPS record wins
            seen[int(info.pid)] = GpuProcess(int(info.pid), unit_uuid, gpu_uuid, _used(info), mps_client=True)
    return list(seen.values())


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _ = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
            return False
        raise
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def _gpu_processes(nvml: Any, index: int) -> list[GpuProcess]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    gpu_uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    if not _mig_enabled(nvml, handle):
        return _unit_processes(nvml, handle, gpu_uuid, gpu_uuid, mps=True)
    out: list[GpuProcess] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if _is(nvml, exc, "NVML_ERROR_NOT_FOUND"):
                continue
            raise
        out.extend(_unit_processes(nvml, mig, _text(nvml.nvmlDeviceGetUUID(mig)), gpu_uuid, mps=False))
    return out


def sample_processes(nvml: Any = None) -> tuple[list[GpuProcess], list[str]]:
    """Every compute process on every GPU unit, and the GPUs that could not be read (why). Raises
    NvmlUnavailable when NVML cannot be used at all."""
    nvml = started(nvml)
    out: list[GpuProcess] = []
    problems: list[str] = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                out.extend(_gpu_processes(nvml, index))
            except nvml.NVMLError as exc:
                problems.append(f"GPU {index}: {_describe(nvml, exc)}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return out, problems


# ---- pods and bookings --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRef:
    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str]  # runtime container ID -> container name


def pod_index(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodRef]:
    """Active pods by UID, with their containers' runtime IDs."""
    out: dict[str, PodRef] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or not is_active(pod):
            continue
        status = pod.get("status") or {}
        ids: dict[str, str] = {}
        for section in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(section) or []:
                cid = cs.get("containerID") if isinstance(cs, dict) else None
                if isinstance(cid, str) and cid:
                    ids[container_id(cid)] = str(cs.get("name") or "")
        out[uid] = PodRef(uid, str(meta.get("namespace") or "default"), str(meta.get("name") or uid), ids)
    return out


BookingKey = tuple[str, str, str]  # (pod UID, container, unit UUID)


def bookings(answers: Iterable[Answer], pods: Iterable[Mapping[str, Any]], trust: Trust,
             published: list[dict[str, Any]]) -> dict[BookingKey, int]:
    """Bytes booked per (pod, container, unit): what the agent handed out (its ledger), else, for a pod it
    has no answer for (answered before its ledger was kept), the pod's signed assignment."""
    out: dict[BookingKey, int] = {}
    answered: set[str] = set()
    for a in answers:
        answered.add(a.uid)
        for i, unit in enumerate(a.units):
            mib = a.vram_mib[i] if i < len(a.vram_mib) else 0
            if mib > 0:
                out[(a.uid, a.container, unit)] = max(out.get((a.uid, a.container, unit), 0), mib * MIB)
    gpus = node_units(published)
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or uid in answered or not is_active(pod):
            continue
        try:
            key = pod_key(pod)
            raw, _ = trusted_assignment(pod, key, trust)
            grants = parse_assignment(raw, f"pod {key}") if raw is not None else []
        except InputError:
            continue
        for grant in grants:
            gpu = gpus.get(grant.index)
            held: str | None = None
            if gpu is not None:
                held = gpu.mig.get(grant.mig) if grant.mig is not None else gpu.uuid
            for container, _n in gpu_containers(pod):
                if held is not None and grant.vram_mib > 0:
                    out[(uid, container, held)] = grant.vram_mib * MIB
    return out


# ---- attribution --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    ref: PodRef
    container: str
    unit: Unit
    used: int | None = 0
    booked: int | None = None


def _container_name(ref: PodRef, owner: ProcessOwner) -> str:
    if owner.container_id is None:
        return "(pod)"
    return ref.containers.get(owner.container_id) or f"cid:{owner.container_id[:12]}"


def _add(entry: _Entry, used: int | None) -> None:
    entry.used = None if entry.used is None or used is None else entry.used + used


def attribute(processes: Iterable[GpuProcess], owners: Mapping[int, tuple[ProcessOwner | None, str]],
              pods: Mapping[str, PodRef], units: Mapping[str, Unit], booked: Mapping[BookingKey, int],
              ) -> tuple[dict[BookingKey, _Entry], list[UnmappedProcess]]:
    """Each process into its pod's entry, or into the unmapped list with why; every booked (pod, container,
    unit) has an entry, used 0 when no process of it runs there."""
    entries: dict[BookingKey, _Entry] = {}
    unmapped: list[UnmappedProcess] = []
    for (uid, container, unit_uuid), nbytes in booked.items():
        ref, unit = pods.get(uid), units.get(unit_uuid)
        if ref is not None and unit is not None:
            entries[(uid, container, unit_uuid)] = _Entry(ref, container, unit, 0, nbytes)
    for p in processes:
        owner, why = owners.get(p.pid, (None, "not looked up"))
        unit = units.get(p.unit_uuid) or Unit(p.unit_uuid, p.gpu_uuid, "gpu", False)
        ref = pods.get(owner.pod_uid) if owner is not None else None
        if owner is None or ref is None:
            why = why or f"pod {owner.pod_uid if owner else '?'} is not among this node's active pods"
            unmapped.append(UnmappedProcess(pid=p.pid, gpu_uuid=p.gpu_uuid, used_bytes=p.used_bytes, why=why))
            continue
        key = (ref.uid, _container_name(ref, owner), p.unit_uuid)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _Entry(ref, key[1], unit, 0, None)
        _add(entry, p.used_bytes)
    return entries, unmapped


def _over_by_pod_unit(entries: Mapping[BookingKey, _Entry]) -> set[tuple[str, str]]:
    """(pod UID, unit UUID) above their booking on a shared unit. Judged per pod (its containers together
    against the pod's booking on the unit), on what is known: unknown use adds nothing, so a pod flagged is
    above its booking for certain."""
    used: dict[tuple[str, str], int] = {}
    booked: dict[tuple[str, str], int] = {}
    for (uid, _c, unit_uuid), e in entries.items():
        if not e.unit.shared:
            continue
        k = (uid, unit_uuid)
        used[k] = used.get(k, 0) + (e.used or 0)
        if e.booked is not None:
            booked[k] = max(booked.get(k, 0), e.booked)
    return {k for k, b in booked.items() if used.get(k, 0) > b}


@dataclass
class UsageBook:
    """Peaks per (pod, container, unit), kept while the pod is active."""

    peaks: dict[BookingKey, int] = field(default_factory=dict)

    def report(self, entries: Mapping[BookingKey, _Entry], unmapped: list[UnmappedProcess], period_s: float,
               now: datetime | None = None) -> NodeUsageReport:
        over = _over_by_pod_unit(entries)
        live = {uid for uid, _c, _u in entries}
        self.peaks = {k: v for k, v in self.peaks.items() if k[0] in live}
        pods: list[PodUsage] = []
        for key in sorted(entries, key=lambda k: (entries[k].ref.namespace, entries[k].ref.name, k[1], k[2])):
            e = entries[key]
            if e.used is not None:
                self.peaks[key] = max(self.peaks.get(key, 0), e.used)
            pods.append(PodUsage(namespace=e.ref.namespace, pod=e.ref.name, uid=e.ref.uid, container=e.container,
                                 gpu_uuid=e.unit.gpu_uuid, unit=e.unit.word, used_bytes=e.used,
                                 peak_bytes=self.peaks.get(key), booked_bytes=e.booked,
                                 over=(key[0], key[2]) in over))
        when = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return NodeUsageReport(sampled_at=when, period_s=period_s, pods=tuple(pods),
                               unmapped=tuple(sorted(unmapped, key=lambda u: (u.gpu_uuid, u.pid))))


@dataclass
class UsageSampler:
    """One pass: NVML -> owners -> the node's report. `nvml` None: the real pynvml."""

    proc_root: str | Path = "/proc"
    period_s: float = 5.0
    nvml: Any = None
    book: UsageBook = field(default_factory=UsageBook)
    problems: list[str] = field(default_factory=list)  # GPUs the last pass could not read

    def sample(self, published: list[dict[str, Any]], pods: list[dict[str, Any]], answers: Iterable[Answer],
               trust: Trust, now: datetime | None = None) -> NodeUsageReport:
        processes, self.problems = sample_processes(self.nvml)
        owners = {pid: read_owner(self.proc_root, pid) for pid in {p.pid for p in processes}}
        booked = bookings(answers, pods, trust, published)
        entries, unmapped = attribute(processes, owners, pod_index(pods), units_of(published), booked)
        return self.book.report(entries, unmapped, self.period_s, now)
