"""The node agent's DaemonSet with `nvidia_runtime_config`: the NVIDIA runtime's config file is mounted read-only at
the path the agent reads (a missing file stops the pod: the operator named it); without the key, nothing is, and
`open_runtime: refuse` without it is refused at render (the agent could never start)."""

from __future__ import annotations

from pathlib import Path

from test_chart_hami import host_mounts, node_agent, render

GPU_OPERATOR = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"


def test_the_runtime_config_is_mounted_read_only_where_the_agent_reads_it(helm: Path) -> None:
    daemonset, config = node_agent(helm, {"nvidia_runtime_config": GPU_OPERATOR, "device_list_strategy": "cdi",
                                          "open_runtime": "refuse"})
    assert config.nvidia_runtime_config == GPU_OPERATOR and config.open_runtime == "refuse"
    assert host_mounts(daemonset)[GPU_OPERATOR] == (GPU_OPERATOR, "File", True)


def test_without_the_key_no_runtime_config_is_mounted(helm: Path) -> None:
    daemonset, config = node_agent(helm, {})
    assert config.nvidia_runtime_config is None
    assert not any(path.endswith(".toml") for path in host_mounts(daemonset))


def test_refuse_without_a_file_to_check_is_refused_at_render_by_name(helm: Path) -> None:
    out = render(helm, {"open_runtime": "refuse"})
    assert out.returncode != 0 and "nvidia_runtime_config" in out.stderr, out.stderr
