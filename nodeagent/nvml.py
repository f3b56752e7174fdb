"""The node's GPUs as NVML reports them (the annotation built from them: `nodeagent.inventory`).

Read-only by design: this module only calls NVML query functions (Init/Shutdown, Get*). Changing a GPU's
mode, creating or destroying MIG instances, or resetting a GPU belongs to the operator's MIG manager, never
to the agent; `tests/nodeagent/test_node_nvml.py` greps this file for any NVML call that writes.

`NvmlReader` is NVIDIA's `packing.vendors.base.GpuReader` (the agent's inventory reads through that interface;
`RawGpu` and `RawMig` are its vendor-neutral types). `read_gpus(nvml)` takes the NVML binding as a parameter (the
`pynvml` module of nvidia-ml-py by default, imported lazily so the package imports on machines without the
library; a stand-in in tests). A GPU whose
essential queries fail (handle, UUID, name, memory, MIG mode, MIG instances) is returned unhealthy with the
reason: `nodeagent.inventory.to_annotation` leaves it out so the extender never places on it, `health_report`
lists it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from packing.vendors.base import GpuReaderUnavailable, RawGpu, RawMig

MIB = 1024 * 1024
GIB = 1024 * MIB

# GPU-instance profile *indexes* (the NVML_GPU_INSTANCE_PROFILE_* constants, not the profile IDs that
# `nvmlGpuInstanceGetInfo` returns) -> (GPU slices, name suffix). Same table as NVIDIA's go-nvlib
# `NewMigProfile` (pkg/nvlib/device/mig_profile.go): REV1 = "+me", ALL_ME = "+me.all", GFX = "+gfx",
# NO_ME = "-me", REV2 = the 1-slice profile with twice the memory (no suffix, its GB tells it apart).
# 0x11 (3_SLICE_GFX) is newer than go-nvlib's table: "+gfx" with 3 slices is inferred by analogy.
_PROFILE_INDEX: dict[int, tuple[int, str]] = {
    0x0: (1, ""), 0x1: (2, ""), 0x2: (3, ""), 0x3: (4, ""), 0x4: (7, ""), 0x5: (8, ""), 0x6: (6, ""),
    0x7: (1, "+me"), 0x8: (2, "+me"), 0x9: (1, ""),
    0xA: (1, "+gfx"), 0xB: (2, "+gfx"), 0xC: (4, "+gfx"),
    0xD: (1, "-me"), 0xE: (2, "-me"),
    0xF: (1, "+me.all"), 0x10: (2, "+me.all"),
    0x11: (3, "+gfx"),
}
_DEFAULT_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT in nvidia-ml-py 13.x


class NvmlUnavailable(GpuReaderUnavailable):
    """NVML cannot be loaded or initialised (no driver, no library): nothing can be read at all."""


# ---------------------------------------------------------------------------------------------------------------
# Names


def gfd_product(name: str) -> str:
    """The product as GPU Feature Discovery spells `nvidia.com/gpu.product`.

    GFD (k8s-device-plugin internal/lm/resource.go `sanitise`) drops every character other than letters,
    digits, `-`, `_`, `.` and space, then joins the space-separated words with `-`:
    "NVIDIA A100-SXM4-80GB" -> "NVIDIA-A100-SXM4-80GB", "Tesla T4" -> "Tesla-T4".
    """
    kept = re.sub(r"[^A-Za-z0-9\-_. ]", "", name)
    return "-".join(kept.split())


def mig_memory_gb(memory_size_mb: int, total_memory_bytes: int) -> int:
    """The `<N>gb` of a MIG profile name, as go-nvlib computes it (`getMigMemorySizeGB`).

    Not the instance's own GB: its share of the GPU is rounded *up* to eighths, times the GPU's total memory
    in whole GiB (rounded up), rounded half away from zero (Go's math.Round; Python's round() is banker's
    and would name H200's 4-slice profiles "70gb" instead of "71gb").
    """
    if total_memory_bytes <= 0:
        return round(memory_size_mb / 1024)
    fraction = math.ceil(memory_size_mb * MIB / total_memory_bytes * 8) / 8
    total_gb = -(-total_memory_bytes // GIB)
    return int(math.floor(fraction * total_gb + 0.5))


def mig_profile_name(profile_index: int, slice_count: int, memory_size_mb: int, total_memory_bytes: int) -> str:
    """`<slices>g.<GB>gb[+me|+me.all|+gfx|-me]` for a GPU-instance profile.

    Slices and suffix come from the profile index (go-nvlib's table); an index newer than the table falls back
    to NVML's `sliceCount` without a suffix (inferred). The compute-instance part (`<c>c.`) is not named:
    vramfit hands out whole GPU instances, and NVIDIA's tools create one full-size compute instance per GI.
    """
    slices, suffix = _PROFILE_INDEX.get(profile_index, (slice_count, ""))
    return f"{slices}g.{mig_memory_gb(memory_size_mb, total_memory_bytes)}gb{suffix}"


# ---------------------------------------------------------------------------------------------------------------
# Reading


def _text(v: Any) -> str:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer returns str.
    return v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)


def _code(nvml: Any, exc: BaseException) -> int | None:
    return getattr(exc, "value", None) if isinstance(exc, nvml.NVMLError) else None


def _is(nvml: Any, exc: BaseException, *names: str) -> bool:
    code = _code(nvml, exc)
    return code is not None and any(code == getattr(nvml, n, object()) for n in names)


def _describe(nvml: Any, exc: BaseException) -> str:
    code = _code(nvml, exc)
    return f"{exc} (NVML error {code})" if code is not None else f"{type(exc).__name__}: {exc}"


class _GpuFailed(Exception):
    """An essential query of one GPU failed: the GPU is reported unhealthy with this reason."""


def _query(nvml: Any, what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        raise _GpuFailed(f"{what}: {_describe(nvml, exc)}") from exc


def _pynvml() -> Any:
    # Lazy: the package must import on machines without nvidia-ml-py.
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py (module pynvml) is not installed: {exc}") from None
    return pynvml


def started(nvml: Any = None) -> Any:
    """NVML (the given module, else pynvml) initialised; NvmlUnavailable when it cannot be. Every nvmlInit is
    matched by the caller's nvmlShutdown."""
    if nvml is None:
        nvml = _pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML init failed: {_describe(nvml, exc)}") from None
    return nvml


def read_gpus(nvml: Any = None) -> list[RawGpu]:
    """All GPUs of this machine, healthy or not, in NVML index order. Raises NvmlUnavailable."""
    nvml = started(nvml)
    try:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML device count failed: {_describe(nvml, exc)}") from None
        return [_read_gpu(nvml, i) for i in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing to undo: the read already finished or failed


class NvmlReader:
    """NVIDIA's `GpuReader`: NVML through `nvml` (the `pynvml` module when None; a stand-in in tests)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def read(self) -> list[RawGpu]:
        return read_gpus(self._nvml)


def _read_gpu(nvml: Any, index: int) -> RawGpu:
    uuid: str | None = None
    name = ""
    try:
        handle = _query(nvml, "device handle", nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(_query(nvml, "UUID", nvml.nvmlDeviceGetUUID, handle))
        name = _text(_query(nvml, "name", nvml.nvmlDeviceGetName, handle))
        total_bytes = int(_query(nvml, "memory info", nvml.nvmlDeviceGetMemoryInfo, handle).total)
        cc = _compute_capability(nvml, handle)
        current, pending = _mig_mode(nvml, handle)
        mig = _read_migs(nvml, handle, total_bytes) if current else ()
    except _GpuFailed as exc:
        return RawGpu(index=index, uuid=uuid, name=name, product=gfd_product(name), memory_mib=0,
                      compute_capability=None, mig_enabled=False, healthy=False, reason=str(exc))
    return RawGpu(index=index, uuid=uuid, name=name, product=gfd_product(name), memory_mib=total_bytes // MIB,
                  compute_capability=cc, mig_enabled=current, mig_pending=pending, mig=mig,
                  pci_bus_id=pci_bus_id(nvml, handle))


def _compute_capability(nvml: Any, handle: Any) -> tuple[int, int] | None:
    # Informational only (MPS client limits depend on it); a failure here alone does not make a GPU unusable.
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
            raise _GpuFailed(f"compute capability: {_describe(nvml, exc)}") from exc
        return None
    return int(major), int(minor)


_BUS_ID = re.compile(r"^([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f])$")


def pci_bus_id(nvml: Any, handle: Any) -> str | None:
    """The GPU's PCI bus id, `dddddddd:bb:dd.f` in lower case (NVML's `nvmlPciInfo_t.busId`, domain widened to
    eight digits so ids of one node sort in bus order as text); None when NVML cannot say. Informational: CUDA's
    PCI_BUS_ID order is read from it (`nodeagent.allocate`), a GPU without it falls back to its index."""
    try:
        info = nvml.nvmlDeviceGetPciInfo(handle)
    except (nvml.NVMLError, AttributeError):  # AttributeError: a binding without the call
        return None
    match = _BUS_ID.match(_text(getattr(info, "busId", "")).strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):08x}:{bus}:{device}.{function}"


def _mig_mode(nvml: Any, handle: Any) -> tuple[bool, bool | None]:
    """(current, pending) MIG mode; a GPU without MIG support answers NOT_SUPPORTED: (False, None)."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
            return False, None
        raise _GpuFailed(f"MIG mode: {_describe(nvml, exc)}") from exc
    enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
    return current == enabled, pending == enabled


def _profile_names(nvml: Any, handle: Any, total_bytes: int) -> dict[int, str]:
    """GPU-instance profile ID -> name, over every profile index this GPU supports."""
    names: dict[int, str] = {}
    for idx in range(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _DEFAULT_PROFILE_COUNT)):
        try:
            info = _profile_info(nvml, handle, idx)
        except nvml.NVMLError as exc:
            # Indexes a GPU does not offer answer NOT_SUPPORTED or INVALID_ARGUMENT (go-nvlib skips both).
            if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                continue
            raise _GpuFailed(f"GPU-instance profile {idx}: {_describe(nvml, exc)}") from exc
        names[int(info.id)] = mig_profile_name(idx, int(info.sliceCount), int(info.memorySizeMB), total_bytes)
    return names


def _profile_info(nvml: Any, handle: Any, idx: int) -> Any:
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, idx)
    except nvml.NVMLError as exc:
        # nvidia-ml-py defaults to the versioned (V2) entry point; older drivers only have version 1.
        if _is(nvml, exc, "NVML_ERROR_FUNCTION_NOT_FOUND"):
            return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, idx, 1)
        raise


def _read_migs(nvml: Any, parent: Any, total_bytes: int) -> tuple[RawMig, ...]:
    # Any incomplete MIG device makes the whole GPU unhealthy rather than dropping the instance: an
    # instance left out would look like free slices to the extender's re-partitioning, and a device without
    # UUID or profile cannot be handed out.
    names = _profile_names(nvml, parent, total_bytes)
    slots = int(_query(nvml, "MIG device count", nvml.nvmlDeviceGetMaxMigDeviceCount, parent))
    out: list[RawMig] = []
    for slot in range(slots):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except nvml.NVMLError as exc:
            if _is(nvml, exc, "NVML_ERROR_NOT_FOUND"):
                continue  # an empty slot: fewer instances than the maximum
            raise _GpuFailed(f"MIG device {slot}: {_describe(nvml, exc)}") from exc
        out.append(_read_mig(nvml, parent, handle, slot, names))
    return tuple(sorted(out, key=lambda m: m.start))


def _read_mig(nvml: Any, parent: Any, handle: Any, slot: int, names: dict[int, str]) -> RawMig:
    what = f"MIG device {slot}"
    uuid = _text(_query(nvml, f"{what} UUID", nvml.nvmlDeviceGetUUID, handle))
    memory = int(_query(nvml, f"{what} memory info", nvml.nvmlDeviceGetMemoryInfo, handle).total) // MIB
    gi_id = int(_query(nvml, f"{what} GPU instance id", nvml.nvmlDeviceGetGpuInstanceId, handle))
    gi = _query(nvml, f"{what} GPU instance {gi_id}", nvml.nvmlDeviceGetGpuInstanceById, parent, gi_id)
    info = _query(nvml, f"{what} GPU instance {gi_id} info", nvml.nvmlGpuInstanceGetInfo, gi)
    profile_id = int(info.profileId)
    profile = names.get(profile_id)
    if profile is None:
        raise _GpuFailed(f"{what}: GPU-instance profile ID {profile_id} is not among the GPU's profiles "
                         f"({', '.join(map(str, sorted(names))) or 'none'})")
    return RawMig(slot=slot, uuid=uuid, memory_mib=memory, gpu_instance_id=gi_id, profile_id=profile_id,
                  profile=profile, start=int(info.placement.start))
