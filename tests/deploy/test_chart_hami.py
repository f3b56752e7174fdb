"""The node agent's DaemonSet with `timeslice_enforcement: hami-core`: the host directory Allocate writes HAMi-core's
files into is mounted at the same path, read-write, and the library read-only; without it, neither is."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nodeagent.allocate import hami_core_settings
from nodeagent.config import AgentConfig

CHART = Path(__file__).resolve().parents[2] / "charts" / "vramfit"
K8S_VERSION = "1.31.0"
API_SERVER = {"networkPolicy": {"apiServerCIDRs": ["192.168.10.11/32"]}}
LIBRARY = "/usr/local/vramfit/libvgpu.so"


def render(helm: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump({**API_SERVER, "nodeAgent": {"config": config}}, fh)
    try:
        return subprocess.run([str(helm), "template", "vramfit", str(CHART), "--namespace", "vramfit-system",
                               "--kube-version", K8S_VERSION, "--values", fh.name],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/vramfit-helm-cache"})
    finally:
        os.unlink(fh.name)


def node_agent(helm: Path, config: dict[str, Any]) -> tuple[dict[str, Any], AgentConfig]:
    """The rendered DaemonSet (validated strictly) and the agent config its ConfigMap carries."""
    out = render(helm, config)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    daemonset = by_name[("DaemonSet", "vramfit-node")]
    kubernetes_validate.validate(daemonset, K8S_VERSION, strict=True)
    text = by_name[("ConfigMap", "vramfit-node-config")]["data"]["config.yaml"]
    return daemonset, AgentConfig.model_validate(yaml.safe_load(text))


def host_mounts(daemonset: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    """Container path -> (host path, hostPath type, read-only) of the agent container's hostPath mounts."""
    spec = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    (container,) = spec["containers"]
    return {m["mountPath"]: (volumes[m["name"]]["path"], volumes[m["name"]].get("type", ""),
                             bool(m.get("readOnly")))
            for m in container["volumeMounts"] if m["name"] in volumes}


@pytest.mark.parametrize("cache_dir", [None, "/var/lib/vramfit-hami"])
def test_hami_core_mounts_its_cache_read_write_and_the_library_read_only(helm: Path, cache_dir: str | None) -> None:
    config: dict[str, Any] = {"timeslice_enforcement": "hami-core", "hami_core_library": LIBRARY}
    if cache_dir is not None:
        config["hami_core_cache_dir"] = cache_dir
    daemonset, agent_config = node_agent(helm, config)
    hami = hami_core_settings(agent_config)
    assert hami is not None
    mounts = host_mounts(daemonset)
    # Allocate writes at the host path it hands the kubelet: the agent must see that path as the host does.
    assert mounts[hami.cache_dir] == (hami.cache_dir, "DirectoryOrCreate", False)
    assert mounts[LIBRARY] == (LIBRARY, "File", True)


def test_without_hami_core_nothing_of_it_is_mounted(helm: Path) -> None:
    daemonset, agent_config = node_agent(helm, {})
    assert hami_core_settings(agent_config) is None
    assert not any("hami" in path or path.endswith(".so") for path in host_mounts(daemonset))


def test_hami_core_without_its_library_is_refused_by_name(helm: Path) -> None:
    out = render(helm, {"timeslice_enforcement": "hami-core"})
    assert out.returncode != 0
    assert "hami_core_library" in out.stderr
