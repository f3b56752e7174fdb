"""The node's NVIDIA runtime config (nodeagent/runtime_config.py): whether a pod could name GPUs through its own
NVIDIA_VISIBLE_DEVICES is read at start and said (log, metric), a strategy the runtime would ignore is refused with
one line naming the file and the key, and `open_runtime: refuse` keeps the agent from starting on an open node."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_node_cli import Files, keep_temp_dirs_in, parse, vramfit

from nodeagent.agent import NodeAgent
from nodeagent.cli import build_agent
from nodeagent.publish import ANN_HEALTH
from nodeagent.runtime_config import ENVVAR_KEY, MOUNTS_KEY, RuntimeConfigError, judge, read_runtime_config

# The toolkit's installed file, trimmed: the two keys commented out at their defaults (the toolkit's config
# defaults: envvar-when-unprivileged true, as-volume-mounts false), its sections with their usual keys.
TOOLKIT_DEFAULT = f"""#{MOUNTS_KEY} = false
#{ENVVAR_KEY} = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]
"""
# NVIDIA's recipe for nodes where pods must not pick their GPUs: device lists from mounts (or CDI) only.
TOOLKIT_CLOSED = f"{MOUNTS_KEY} = true\n{ENVVAR_KEY} = false\n" + TOOLKIT_DEFAULT


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Files:
    """`vramfit node`'s flags and files for a dry run (test_node_cli's), its temporary directories in tmp_path."""
    keep_temp_dirs_in(tmp_path, monkeypatch)
    return Files(tmp_path)


def toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi"])
def test_the_toolkits_defaults_let_any_container_name_gpus(tmp_path: Path, strategy: str) -> None:
    path = toml(tmp_path, TOOLKIT_DEFAULT)
    if strategy == "volume-mounts":  # the defaults do not read device mounts: every pod would start without GPUs
        with pytest.raises(RuntimeConfigError, match=MOUNTS_KEY):
            judge(strategy, path, read_runtime_config(path))
        return
    verdict = judge(strategy, path, read_runtime_config(path))
    assert verdict.selection == "open" and ENVVAR_KEY in verdict.why
    # No file at all is the same runtime: its defaults.
    missing = str(tmp_path / "none.toml")
    assert read_runtime_config(missing) is None
    assert judge(strategy, missing, None).selection == "open"


@pytest.mark.parametrize("strategy", ["volume-mounts", "cdi"])
def test_nvidias_recipe_is_closed_for_the_strategies_that_work_under_it(tmp_path: Path, strategy: str) -> None:
    path = toml(tmp_path, TOOLKIT_CLOSED)
    assert judge(strategy, path, read_runtime_config(path)).selection == "closed"


def test_envvar_under_a_runtime_that_ignores_env_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = toml(tmp_path, TOOLKIT_CLOSED)
    with pytest.raises(RuntimeConfigError, match=f"{path}: {ENVVAR_KEY} is false"):
        judge("envvar", path, read_runtime_config(path))


def test_not_configured_is_unknown_and_bad_files_are_named(tmp_path: Path) -> None:
    assert judge("envvar", None, None).selection == "unknown"
    bad = toml(tmp_path, f"{ENVVAR_KEY} = \n")
    with pytest.raises(RuntimeConfigError, match="not TOML"):
        read_runtime_config(bad)
    typed = toml(tmp_path, f'{ENVVAR_KEY} = "no"\n')
    with pytest.raises(RuntimeConfigError, match=f"{ENVVAR_KEY} must be true or false"):
        judge("cdi", typed, read_runtime_config(typed))
    with pytest.raises(RuntimeConfigError, match="cannot read it"):
        read_runtime_config(str(tmp_path))  # a directory


def agent_config(rig: Files, **keys: Any) -> str:
    path = rig.tmp / "agent.yaml"
    path.write_text(yaml.safe_dump(keys))
    return str(path)


@pytest.mark.parametrize(("runtime", "keys", "named"), [
    (TOOLKIT_CLOSED, {"device_list_strategy": "envvar"}, f"{ENVVAR_KEY} is false"),
    (TOOLKIT_DEFAULT, {"device_list_strategy": "volume-mounts"}, f"{MOUNTS_KEY} is false"),
    (TOOLKIT_DEFAULT, {"device_list_strategy": "cdi", "open_runtime": "refuse"}, "open_runtime is refuse"),
    ("[broken\n", {"device_list_strategy": "cdi"}, "not TOML"),
])
def test_vramfit_node_refuses_with_one_line_naming_the_file_and_key(rig: Files, runtime: str,
                                                                   keys: dict[str, Any], named: str) -> None:
    path = toml(rig.tmp, runtime)
    config = agent_config(rig, nvidia_runtime_config=path, **keys)
    code, err = vramfit(rig.argv("--config", config), rig.tmp)
    assert code == 2 and len(err) == 1 and named in err[0] and path in err[0] and "Traceback" not in err[0], err


def test_refuse_also_refuses_a_runtime_not_checked(rig: Files) -> None:
    code, err = vramfit(rig.argv("--config", agent_config(rig, open_runtime="refuse")), rig.tmp)
    assert code == 2 and len(err) == 1 and "nvidia_runtime_config is not set" in err[0], err


def started(rig: Files, caplog: pytest.LogCaptureFixture, **keys: Any) -> tuple[dict[str, float], list[str]]:
    """The agent built from these config keys and started: its selection gauge and its warnings at start (the
    gauge checked against what the Node's health annotation says)."""
    agent: NodeAgent = build_agent(parse(rig.argv("--config", agent_config(rig, **keys))))
    with caplog.at_level(logging.INFO, logger="vramfit.node"):
        agent.start()
        agent.stop()
    registry = agent.metrics.registry
    gauge = {s: registry.get_sample_value("vramfit_node_gpu_selection", {"state": s}) or 0.0
             for s in ("open", "closed", "unknown")}
    health = json.loads(agent.publisher.published[ANN_HEALTH])  # type: ignore[attr-defined]
    assert gauge[health["gpu_selection"]] == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "vramfit.node"]
    return gauge, warnings


def test_an_open_runtime_starts_with_an_insecure_warning_and_the_gauge_says_open(
        rig: Files, caplog: pytest.LogCaptureFixture) -> None:
    gauge, warnings = started(rig, caplog, nvidia_runtime_config=toml(rig.tmp, TOOLKIT_DEFAULT))
    assert gauge == {"open": 1.0, "closed": 0.0, "unknown": 0.0}
    assert any(w.startswith("INSECURE: tenants' GPUs are not apart") and ENVVAR_KEY in w for w in warnings), warnings


def test_a_closed_runtime_starts_quietly_and_the_gauge_says_closed(rig: Files,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    gauge, warnings = started(rig, caplog, device_list_strategy="volume-mounts",
                              nvidia_runtime_config=toml(rig.tmp, TOOLKIT_CLOSED))
    assert gauge == {"open": 0.0, "closed": 1.0, "unknown": 0.0}
    assert not any(ENVVAR_KEY in w or "NVIDIA_VISIBLE_DEVICES" in w for w in warnings), warnings


def test_an_unchecked_runtime_is_said_to_be_unchecked(rig: Files, caplog: pytest.LogCaptureFixture) -> None:
    gauge, warnings = started(rig, caplog)
    assert gauge == {"open": 0.0, "closed": 0.0, "unknown": 1.0}
    assert any("nvidia_runtime_config is not set" in w for w in warnings), warnings
