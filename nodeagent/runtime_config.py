"""Whether the node's NVIDIA container runtime lets a container choose its own GPUs, read from the NVIDIA
Container Toolkit's config.toml (config key `nvidia_runtime_config`).

The runtime's hook exposes the GPUs a container names in `NVIDIA_VISIBLE_DEVICES`. With the toolkit's
`accept-nvidia-visible-devices-envvar-when-unprivileged` true (its default), it reads that variable from any
container: a pod's own env, a ConfigMap it loads with `envFrom`, or its image's `ENV` (CUDA images say `all`)
then reaches every GPU of the node, whatever vramfit assigned, and tenants' boundaries hold only against pods
that do not try. With it false the runtime takes GPUs only from what the device plugin hands over as volume
mounts (`accept-nvidia-visible-devices-as-volume-mounts = true`) or CDI devices, which a pod cannot write.
Key names and defaults: the NVIDIA Container Toolkit's config (its defaults: envvar-when-unprivileged true,
as-volume-mounts false; `nvidia-ctk config`), and NVIDIA's device plugin's `volume-mounts` strategy.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
ENVVAR_DEFAULT = True
MOUNTS_DEFAULT = False

Selection = Literal["open", "closed", "unknown"]
SELECTIONS: tuple[Selection, ...] = get_args(Selection)


class RuntimeConfigError(ValueError):
    """The runtime's config cannot be read, or it cannot work with the agent's device list strategy."""


@dataclass(frozen=True)
class RuntimeVerdict:
    """What a container on this node can do about its GPUs, as far as the runtime's config tells."""

    selection: Selection  # open: any container may name GPUs by env; closed: only the device plugin's; unknown
    why: str  # one line for the log


def read_runtime_config(path: str) -> dict[str, Any] | None:
    """The parsed config.toml, or None when there is no file (the runtime then runs on its defaults)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RuntimeConfigError(f"nvidia_runtime_config {path}: cannot read it: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise RuntimeConfigError(f"nvidia_runtime_config {path}: not TOML: {err}") from None


def judge(strategy: str, path: str | None, config: Mapping[str, Any] | None) -> RuntimeVerdict:
    """The verdict for `config` (read from `path`; None: not configured or no file); RuntimeConfigError where
    the agent's `strategy` cannot hand GPUs over under it (every pod would start without its GPUs)."""
    if path is None:
        return RuntimeVerdict("unknown", "nvidia_runtime_config is not set: whether a pod can name GPUs through "
                                         "NVIDIA_VISIBLE_DEVICES on this node is not checked")
    envvar = _flag(path, config, ENVVAR_KEY, ENVVAR_DEFAULT)
    mounts = _flag(path, config, MOUNTS_KEY, MOUNTS_DEFAULT)
    if strategy == "envvar" and not envvar:
        raise RuntimeConfigError(f"nvidia_runtime_config {path}: {ENVVAR_KEY} is false, so the runtime ignores the "
                                 "NVIDIA_VISIBLE_DEVICES that device_list_strategy envvar hands over: use "
                                 "device_list_strategy volume-mounts or cdi")
    if strategy == "volume-mounts" and not mounts:
        raise RuntimeConfigError(f"nvidia_runtime_config {path}: {MOUNTS_KEY} is false, so the runtime ignores the "
                                 f"device mounts that device_list_strategy volume-mounts hands over: set it to true")
    source = "" if config is not None else " (no such file: the runtime's defaults)"
    if envvar:
        return RuntimeVerdict("open", f"{path}{source}: {ENVVAR_KEY} is true, so any container on this node can "
                                      "reach any GPU through NVIDIA_VISIBLE_DEVICES (its env, envFrom or image), "
                                      "whatever vramfit assigned")
    return RuntimeVerdict("closed", f"{path}: {ENVVAR_KEY} is false: containers get only the GPUs the device "
                                    "plugin hands over")


def _flag(path: str, config: Mapping[str, Any] | None, key: str, default: bool) -> bool:
    value = default if config is None else config.get(key, default)
    if not isinstance(value, bool):
        raise RuntimeConfigError(f"nvidia_runtime_config {path}: {key} must be true or false, got {value!r}")
    return value
