"""A stand-in for the `pynvml` module (nvidia-ml-py), built from a description of GPUs.

Only the query functions `nodeagent/nvml.py` and `nodeagent/usage.py` use exist, with pynvml's names, argument order and error
model (`NVMLError(code)` turns into the code's subclass, `exc.value` is the code); anything else (every
setter included) is simply absent, so a call to it fails with AttributeError. Every call is recorded in
`calls`.

GPU-instance profile tables follow the NVML shape: a profile *index* (NVML_GPU_INSTANCE_PROFILE_*) gives a
profile info with its `id`, `sliceCount` and `memorySizeMB`. Memory figures are the go-nvml mock's (marked
unverified in gpu-facts.md); the names are what the code under test must derive from them.

Processes (`FakeProcess`) sit on a GPU or a MIG device, as NVML's process queries report them
(docs.nvidia.com/deploy/nvml-api, nvmlDeviceGetComputeRunningProcesses_v3): on a MIG device handle, that
instance's processes; on the parent handle of a MIG GPU, all of them with their `gpuInstanceId` (only for a
privileged caller: `mig_aggregate_denied` answers NO_PERMISSION); MPS clients only through
nvmlDeviceGetMPSComputeRunningProcesses_v3 (the compute list holds the MPS server). `used_bytes=None` is
NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized", NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error: `NVMLError(code)` is an instance of the code's subclass; `.value` is the code."""

    _by_code: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


# ---------------------------------------------------------------------------------------------------------------
# Descriptions


@dataclass(frozen=True)
class GiProfile:
    index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int  # profile ID as nvmlGpuInstanceGetInfo reports it
    slices: int
    memory_mb: int


# A100-SXM4-80GB, profile IDs from the MIG User Guide, sizes from the go-nvml mock (unverified).
A100_80GB_PROFILES = {
    "1g.10gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 9856),
    "1g.10gb+me": GiProfile(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 9856),
    "1g.20gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 19968),
    "2g.20gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 19968),
    "3g.40gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 40192),
    "4g.40gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 40192),
    "7g.80gb": GiProfile(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 80384),
}


NVML_INVALID_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process on a GPU not in MIG mode


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE
    mps_client: bool = False  # listed by the MPS query, not the compute one


@dataclass(frozen=True)
class FakeMig:
    profile: str  # key into the GPU's profile table
    start: int
    uuid: str
    memory_mib: int
    slot: int | None = None  # MIG device handle index (default: list position); gaps answer NOT_FOUND
    processes: tuple[FakeProcess, ...] = ()


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_mib: int
    compute_capability: tuple[int, int] = (8, 0)
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_pending: bool | None = None
    mig: list[FakeMig] = field(default_factory=list)
    profiles: dict[str, GiProfile] = field(default_factory=dict)
    max_mig_devices: int = 7
    hidden_profile_indexes: set[int] = field(default_factory=set)  # profile indexes answering NOT_SUPPORTED
    lost_at: str | None = None  # None, or the query that fails: "handle", "uuid", "name", "memory", "mig"
    lost_code: int = NVML_ERROR_GPU_IS_LOST
    processes: list[FakeProcess] = field(default_factory=list)  # on the whole GPU (not in MIG mode)
    mig_aggregate_denied: bool = True  # parent-handle process query of a MIG GPU: NO_PERMISSION (unprivileged)


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig_slot: int | None = None


@dataclass(frozen=True)
class _GpuInstance:
    gpu: int
    gi_id: int


class FakeNvml:
    """The module stand-in: pass an instance as `read_gpus(nvml=...)`."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None, legacy_profile_info: bool = False):
        self.gpus = gpus
        self.init_error = init_error
        self.legacy_profile_info = legacy_profile_info  # no V2 entry point: version 2 -> FUNCTION_NOT_FOUND
        self.calls: list[str] = []
        self.initialised = 0
        # Expose the module-level names (constants, error classes) as attributes, as `pynvml.X` would be.
        for name, value in globals().items():
            if name.startswith(("NVML_", "NVMLError")):
                setattr(self, name, value)

    # -- controls for tests ---------------------------------------------------------------------------------

    def lose(self, index: int, at: str = "memory", code: int = NVML_ERROR_GPU_IS_LOST) -> None:
        self.gpus[index].lost_at = at
        self.gpus[index].lost_code = code

    # -- helpers --------------------------------------------------------------------------------------------

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name not in ("nvmlInit", "nvmlShutdown") and self.initialised <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle, query: str) -> FakeGpu:
        gpu = self.gpus[handle.gpu]
        if gpu.lost_at == query:
            raise NVMLError(gpu.lost_code)
        return gpu

    def _mig(self, handle: _Handle) -> FakeMig:
        gpu = self.gpus[handle.gpu]
        for pos, m in enumerate(gpu.mig):
            if (m.slot if m.slot is not None else pos) == handle.mig_slot:
                return m
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    @staticmethod
    def _gi_id(gpu: FakeGpu, mig: FakeMig) -> int:
        # NVML numbers GPU instances itself; any stable small number does here.
        return gpu.mig.index(mig) + 1

    # -- the pynvml functions -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        if self.initialised <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._gpu(handle, "handle")
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._call("nvmlDeviceGetUUID")
        gpu = self._gpu(handle, "uuid")
        return self._mig(handle).uuid if handle.mig_slot is not None else gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._call("nvmlDeviceGetName")
        return self._gpu(handle, "name").name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle, "memory")
        mib = self._mig(handle).memory_mib if handle.mig_slot is not None else gpu.memory_mib
        return SimpleNamespace(total=mib * MIB, free=mib * MIB, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        self._call("nvmlDeviceGetCudaComputeCapability")
        return self._gpu(handle, "cc").compute_capability

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._call("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle, "mig")
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        pending = gpu.mig_enabled if gpu.mig_pending is None else gpu.mig_pending
        return [int(gpu.mig_enabled), int(pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetMaxMigDeviceCount")
        gpu = self._gpu(handle, "mig")
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._call("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._gpu(handle, "mig")
        if not gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        mig_handle = _Handle(handle.gpu, index)
        self._mig(mig_handle)  # NOT_FOUND for an empty slot
        return mig_handle

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetGpuInstanceId")
        if handle.mig_slot is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpu(handle, "mig")
        return self._gi_id(gpu, self._mig(handle))

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, gi_id: int) -> _GpuInstance:
        self._call("nvmlDeviceGetGpuInstanceById")
        gpu = self._gpu(handle, "mig")
        if not any(self._gi_id(gpu, m) == gi_id for m in gpu.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _GpuInstance(handle.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstance) -> Any:
        self._call("nvmlGpuInstanceGetInfo")
        gpu = self.gpus[gi.gpu]
        mig = next(m for m in gpu.mig if self._gi_id(gpu, m) == gi.gi_id)
        prof = gpu.profiles[mig.profile]
        return SimpleNamespace(device=_Handle(gi.gpu), id=gi.gi_id, profileId=prof.id,
                               placement=SimpleNamespace(start=mig.start, size=prof.slices))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: _Handle, profile: int, version: int = 2) -> Any:
        self._call("nvmlDeviceGetGpuInstanceProfileInfo")
        gpu = self._gpu(handle, "mig")
        if version == 2 and self.legacy_profile_info:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for p in gpu.profiles.values():
            if p.index == profile and profile not in gpu.hidden_profile_indexes:
                return SimpleNamespace(id=p.id, sliceCount=p.slices, memorySizeMB=p.memory_mb,
                                       instanceCount=7 // p.slices)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # -- processes (read-only queries) ------------------------------------------------------------------------

    def _processes(self, handle: _Handle, query: str) -> list[tuple[FakeProcess, int]]:
        """(process, GPU instance id or NVML_INVALID_ID) on the handle."""
        gpu = self._gpu(handle, query)
        if handle.mig_slot is not None:
            mig = self._mig(handle)
            return [(p, self._gi_id(gpu, mig)) for p in mig.processes]
        if gpu.mig_enabled:
            if gpu.mig_aggregate_denied:
                raise NVMLError(NVML_ERROR_NO_PERMISSION)
            return [(p, self._gi_id(gpu, m)) for m in gpu.mig for p in m.processes]
        return [(p, NVML_INVALID_ID) for p in gpu.processes]

    @staticmethod
    def _info(p: FakeProcess, gi: int) -> Any:
        return SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes, gpuInstanceId=gi,
                               computeInstanceId=0 if gi != NVML_INVALID_ID else NVML_INVALID_ID)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses_v3")
        return [self._info(p, gi) for p, gi in self._processes(handle, "processes") if not p.mps_client]

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: _Handle) -> list[Any]:
        self._call("nvmlDeviceGetMPSComputeRunningProcesses_v3")
        return [self._info(p, gi) for p, gi in self._processes(handle, "processes") if p.mps_client]
