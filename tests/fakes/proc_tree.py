"""A stand-in `/proc`: one `<pid>/cgroup` file per process, in the path formats the kubelet and the container
runtimes really write (nodeagent/cgroups.py names the sources):

- cgroup v2 writes one line `0::<path>`; cgroup v1 one line per hierarchy (`<n>:<controllers>:<path>`, the
  `name=systemd` line included);
- systemd driver: `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with '_'>.slice/<scope>`,
  scope `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O), `docker-<id>.scope`;
- cgroupfs driver: `/kubepods/<qos>/pod<uid>/<id>` (containerd), `.../crio-<id>` (CRI-O);
- guaranteed pods have no QoS level; a reader in its own cgroup namespace sees `/../..` in front.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUNTIMES = ("containerd", "crio", "docker")
DRIVERS = ("systemd", "cgroupfs")
VERSIONS = (1, 2)
QOS = ("guaranteed", "burstable", "besteffort")
_V1_HIERARCHIES = ("12:pids", "11:memory", "10:cpu,cpuacct", "9:devices", "1:name=systemd")


@dataclass(frozen=True)
class Layout:
    runtime: str = "containerd"
    driver: str = "systemd"
    version: int = 2
    qos: str = "burstable"
    namespaced: bool = False  # read from inside a private cgroup namespace: paths start with /../..


def container_path(uid: str, container_id: str | None, layout: Layout) -> str:
    qos = "" if layout.qos == "guaranteed" else layout.qos
    if layout.driver == "systemd":
        pod_slice = "-".join(p for p in ("kubepods", qos, "pod" + uid.replace("-", "_")) if p) + ".slice"
        parts = ["kubepods.slice"] + ([f"kubepods-{qos}.slice"] if qos else []) + [pod_slice]
        if container_id is not None:
            prefix = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[layout.runtime]
            parts.append(f"{prefix}-{container_id}.scope")
    else:
        parts = ["kubepods"] + ([qos] if qos else []) + [f"pod{uid}"]
        if container_id is not None:
            parts.append(f"crio-{container_id}" if layout.runtime == "crio" else container_id)
    path = "/" + "/".join(parts)
    return "/../.." + path if layout.namespaced else path


def cgroup_text(path: str, version: int) -> str:
    if version == 2:
        return f"0::{path}\n"
    return "".join(f"{h}:{path}\n" for h in _V1_HIERARCHIES)


class ProcTree:
    """Writes `<root>/<pid>/cgroup` files; `root` goes where the agent's `proc_root` points."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _write(self, pid: int, text: str) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text(text, encoding="utf-8")

    def container_process(self, pid: int, uid: str, container_id: str, layout: Layout = Layout()) -> None:
        self._write(pid, cgroup_text(container_path(uid, container_id, layout), layout.version))

    def conmon_process(self, pid: int, uid: str, container_id: str, version: int = 2) -> None:
        """CRI-O's container monitor: in the pod's cgroup, in no container's."""
        base = container_path(uid, None, Layout(runtime="crio"))
        self._write(pid, cgroup_text(f"{base}/crio-conmon-{container_id}.scope", version))

    def host_process(self, pid: int, path: str = "/system.slice/containerd.service", version: int = 2) -> None:
        self._write(pid, cgroup_text(path, version))
