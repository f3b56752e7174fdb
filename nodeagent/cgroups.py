"""Which pod and container a host process belongs to, from the kernel's `/proc/<pid>/cgroup`.

Each line of that file is `<hierarchy>:<controllers>:<path>` (cgroup v1: one line per hierarchy; v2: the one
line `0::<path>`). The kubelet puts each pod in its own cgroup and the runtime each container in one below it:

| driver  | pod cgroup (kubelet, pkg/kubelet/cm/cgroup_manager_linux.go)  | container (runtime)                          |
|---------|---------------------------------------------------------------|----------------------------------------------|
| systemd | `kubepods-burstable-pod<uid, '-' as '_'>.slice` (`ToSystemd`, `escapeSystemdCgroupName`) | containerd `cri-containerd-<id>.scope` (`getCgroupsPath`: `slice:cri-containerd:id`, expanded by runc); CRI-O `crio-<id>.scope` (`CrioPrefix`, internal/config/cgmgr/systemd.go), its monitor `crio-conmon-<id>.scope`; cri-dockerd `docker-<id>.scope` |
| cgroupfs| `/kubepods/burstable/pod<uid>` (`ToCgroupfs`)                  | containerd `<id>`; CRI-O `crio-<id>`; cri-dockerd `<id>` |

Guaranteed pods sit directly under `kubepods` (no QoS level). Static pods' UIDs are 32 hex digits (the kubelet
hashes the manifest), others' 36-character UUIDs. Read from a container with its own cgroup namespace (the
default on cgroup v2), the path is relative to the reader's cgroup and may start with `/../..`: only its last
segments matter here. A process whose path names no pod (host daemons, the agent's own MPS server) has no owner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# `pod<uid>` ends a pod segment: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid>.slice` (systemd).
_POD_SEGMENT = re.compile(r"^(?:kubepods(?:-[a-z]+)?-)?pod([0-9a-fA-F][0-9a-fA-F_-]{30,35})(?:\.slice)?$")
_CONTAINER_ID = r"([0-9a-f]{64})"
# Container segments by runtime; conmon (CRI-O's monitor) is no container's process.
_CONTAINER_SEGMENTS = (
    re.compile(rf"^cri-containerd-{_CONTAINER_ID}\.scope$"),
    re.compile(rf"^crio-{_CONTAINER_ID}(?:\.scope)?$"),
    re.compile(rf"^docker-{_CONTAINER_ID}\.scope$"),
    re.compile(rf"^{_CONTAINER_ID}$"),
)
_CONMON = re.compile(rf"^crio-conmon-{_CONTAINER_ID}(?:\.scope)?$")
_RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")


@dataclass(frozen=True)
class ProcessOwner:
    pod_uid: str  # as the API spells it (dashes)
    container_id: str | None  # the runtime's 64-hex id; None for a pod-level process (no container cgroup)


def _owner_of_path(path: str) -> ProcessOwner | None:
    segments = [s for s in path.split("/") if s and s != ".."]
    for i, seg in enumerate(segments):
        m = _POD_SEGMENT.match(seg)
        if m is None:
            continue
        uid = m.group(1).replace("_", "-")
        for rest in segments[i + 1:]:
            if _CONMON.match(rest):
                return ProcessOwner(uid, None)
            for pattern in _CONTAINER_SEGMENTS:
                c = pattern.match(rest)
                if c is not None:
                    return ProcessOwner(uid, c.group(1))
        return ProcessOwner(uid, None)
    return None


def parse_cgroup(text: str) -> ProcessOwner | None:
    """The owner named by a `/proc/<pid>/cgroup` file's text: the v2 line first, else the first v1 hierarchy
    that names a pod (hierarchies agree for a container process; a v1 line for `name=systemd` may not)."""
    v1: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            owner = _owner_of_path(path)
            if owner is not None:
                return owner
        else:
            v1.append(path)
    best: ProcessOwner | None = None
    for path in v1:
        owner = _owner_of_path(path)
        if owner is not None and owner.container_id is not None:
            return owner
        best = best or owner
    return best


def read_owner(proc_root: str | Path, pid: int) -> tuple[ProcessOwner | None, str]:
    """(the owner of `pid`, "") or (None, why not)."""
    path = Path(proc_root) / str(pid) / "cgroup"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, "process gone (or not in this PID namespace: the agent needs hostPID)"
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror or err}"
    owner = parse_cgroup(text)
    if owner is None:
        return None, "no pod cgroup"
    return owner, ""


def container_id(runtime_id: str) -> str:
    """`containerd://<id>` (a pod's `status.containerStatuses[].containerID`) -> `<id>`."""
    for prefix in _RUNTIME_PREFIXES:
        if runtime_id.startswith(prefix):
            return runtime_id[len(prefix):]
    return runtime_id.split("://", 1)[-1]
