"""The NVIDIA device plugin's resource names (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`, their `.shared`
forms, the names an operator renamed them to) and what one unit of each is on its node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from packing.model import InputError, Node
from packing.modes import mode_rules
from packing.vendors.base import UNIT_GPU, UNIT_MIG_PREFIX
from packing.vendors.nvidia.gfd_labels import L_MIG_STRATEGY, L_PRODUCT

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_MIG_PREFIX = "nvidia.com/mig-"
# The device plugin's name for a replicated resource under `sharing.{timeSlicing,mps}.renameByDefault: true`.
SHARED_SUFFIX = ".shared"
NVIDIA_GPU_SHARED = NVIDIA_GPU + SHARED_SUFFIX


@dataclass(frozen=True)
class DevicePluginNames:
    """The extended resources through which the NVIDIA device plugin hands out GPUs, and what one unit of each is.

    Always known (no configuration): `nvidia.com/gpu`, `nvidia.com/mig-<profile>` and their `.shared` forms
    (`renameByDefault: true` under time-slicing or MPS). `custom` adds the names an operator gave in the sharing
    config's `resources[].rename` (or any other plugin's names for the same devices): resource name -> what it
    replicates, `nvidia.com/gpu` / `gpu` or `nvidia.com/mig-<profile>` / `mig-<profile>`. A pod holding a name
    vramfit does not know is invisible to it, and its GPU would be booked again: so every renamed resource must
    be listed. Raises InputError for a malformed entry (the extender's config names the key)."""

    custom: Mapping[str, str] = field(default_factory=dict)
    _units: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.custom, Mapping):
            raise InputError("device plugin resources", "(mapping)",
                             f"expected resource name -> nvidia.com/gpu or nvidia.com/mig-<profile>, "
                             f"got {type(self.custom).__name__}")
        object.__setattr__(self, "_units", {name: _custom_unit(name, meaning) for name, meaning in self.custom.items()})

    def unit(self, resource: str) -> str | None:
        """`UNIT_GPU`, `mig-<profile>`, or None when the resource is no GPU the device plugin hands out."""
        found = self._units.get(resource)
        if found is not None:
            return found
        base = resource[: -len(SHARED_SUFFIX)] if resource.endswith(SHARED_SUFFIX) else resource
        if base == NVIDIA_GPU:
            return UNIT_GPU
        if base.startswith(NVIDIA_MIG_PREFIX) and len(base) > len(NVIDIA_MIG_PREFIX):
            return UNIT_MIG_PREFIX + base[len(NVIDIA_MIG_PREFIX):]
        return None


def _custom_unit(name: object, meaning: object) -> str:
    """The unit one configured entry (resource name -> what it replicates) stands for; raises InputError."""
    if not isinstance(name, str) or "/" not in name or not name.split("/", 1)[1]:
        raise InputError("device plugin resources", f"[{name!r}]",
                         "expected an extended resource name such as example.com/t4-shared")
    unit = _unit_of(meaning) if isinstance(meaning, str) else None
    if unit is None:
        raise InputError("device plugin resources", f"[{name}]",
                         f"expected nvidia.com/gpu or nvidia.com/mig-<profile>, got {meaning!r}")
    return unit


def _unit_of(meaning: str) -> str | None:
    """`gpu`, `nvidia.com/gpu` -> UNIT_GPU; `mig-<p>`, `nvidia.com/mig-<p>` -> `mig-<p>`; else None."""
    text = meaning.strip()
    text = text[len("nvidia.com/"):] if text.startswith("nvidia.com/") else text
    if text == UNIT_GPU:
        return UNIT_GPU
    if text.startswith(UNIT_MIG_PREFIX) and len(text) > len(UNIT_MIG_PREFIX) and "/" not in text:
        return text
    return None


DEFAULT_DEVICE_PLUGIN_NAMES = DevicePluginNames()


def mig_devices_are_gpus(node: Node) -> bool:
    """MIG strategy `single`: the device plugin advertises every MIG device as `nvidia.com/gpu`.

    Told by the node's labels (`nvidia.com/mig.strategy`, a `-MIG-<profile>` product); without them, by the
    GPUs: when every GPU is in MIG mode, `nvidia.com/gpu` can only be MIG devices (under `mixed` it counts the
    full GPUs, of which there are none)."""
    mig = [g for g in node.gpus if mode_rules(g.mode).instanced]
    strategy = node.labels.get(L_MIG_STRATEGY, "").strip().lower()
    if strategy == "single" or "-MIG-" in node.labels.get(L_PRODUCT, "").upper():
        return bool(mig)
    if strategy in ("mixed", "none"):
        return False
    return bool(mig) and len(mig) == len(node.gpus)
