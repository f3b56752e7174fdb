"""Time-slice limits by HAMi-core, and CUDA's device order: what Allocate hands a container.

With `timeslice_enforcement: hami-core` a time-slice unit's answer carries everything HAMi-core needs to cap the
container at its booking, as HAMi's own NVIDIA device plugin hands it over: the library and /etc/ld.so.preload
naming it (read-only), a cache directory of its own and the node's lock directory (read-write), a memory limit
per CUDA ordinal, the SM limit and the cache file. Per-ordinal settings count devices in PCI bus order, and the
answer tells CUDA so (`CUDA_DEVICE_ORDER=PCI_BUS_ID`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from node_gpus import PIPES, node_gpus

from nodeagent.allocate import (
    DEVICE_ORDER,
    ENV_DEVICE_ORDER,
    ENV_HAMI_CACHE,
    ENV_HAMI_SM,
    ENV_MPS_MEM,
    ENV_VISIBLE,
    ENV_VRAM,
    HAMI_CACHE_FILE,
    HAMI_CACHE_IN_CONTAINER,
    HAMI_LIBRARY_IN_CONTAINER,
    HAMI_LOCK_IN_CONTAINER,
    PRELOAD_IN_CONTAINER,
    AnswerSettings,
    GpuUnits,
    HamiCore,
    Mount,
    PodInAdmission,
    answer_for,
    hami_core_settings,
    node_units,
    prepare_host_paths,
)
from nodeagent.config import AgentConfig
from packing.model import GpuGrant

LIB = "/opt/hami/libvgpu.so"
CACHE = "/var/lib/vramfit/hami"
HAMI = AnswerSettings(hami_core=HamiCore(library=LIB, cache_dir=CACHE))
GPUS = node_units(node_gpus(mps_memory_mib=81559, mps_replicas=4, timeslice_replicas=4))


def admitted(*grants: GpuGrant, uid: str = "uid-1") -> PodInAdmission:
    return PodInAdmission(uid=uid, key="team-a/p", grants=grants, gpu_containers=(("main", len(grants)),))


def timeslice_node(n: int) -> dict[int, GpuUnits]:
    """`n` time-sliced T4s, as published."""
    return node_units([{"index": i, "uuid": f"GPU-t{i}", "mode": "timeslice", "replicas": 4, "memory_mib": 15360}
                       for i in range(n)])


def test_a_time_slice_unit_gets_everything_hami_core_needs() -> None:
    answer = answer_for(admitted(GpuGrant(index=2, vram_mib=4096)), GPUS, HAMI, PIPES, container="main")
    cache = f"{CACHE}/containers/uid-1_main"
    assert answer.envs == {
        ENV_VISIBLE: "GPU-cccc",
        ENV_VRAM: "4096",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",  # HAMi-core's unit suffix: m = MiB
        ENV_HAMI_SM: "100",  # no compute cap: time-slicing shares compute as before
        ENV_HAMI_CACHE: HAMI_CACHE_FILE,
        ENV_DEVICE_ORDER: DEVICE_ORDER,
    }
    assert set(answer.mounts) == {
        Mount(HAMI_LIBRARY_IN_CONTAINER, LIB, read_only=True),
        Mount(PRELOAD_IN_CONTAINER, f"{CACHE}/ld.so.preload", read_only=True),
        Mount(HAMI_CACHE_IN_CONTAINER, cache),
        Mount(HAMI_LOCK_IN_CONTAINER, f"{CACHE}/vgpulock"),
    }
    assert HAMI_CACHE_FILE.startswith(HAMI_CACHE_IN_CONTAINER + "/")  # the cache file lies in its own mount
    assert answer.fresh_dirs == (cache,) and answer.host_dirs == (f"{CACHE}/vgpulock",)
    # The preload file names the library where the container sees it.
    assert answer.host_files == ((f"{CACHE}/ld.so.preload", HAMI_LIBRARY_IN_CONTAINER + "\n"),)
    assert answer.units == ("GPU-cccc",) and answer.cdi_devices == ()


def test_each_container_gets_its_own_cache() -> None:
    a = answer_for(admitted(GpuGrant(index=2, vram_mib=4096)), GPUS, HAMI, PIPES, container="a")
    b = answer_for(admitted(GpuGrant(index=2, vram_mib=4096), uid="uid-2"), GPUS, HAMI, PIPES, container="a")
    assert a.fresh_dirs != b.fresh_dirs


def test_a_multi_gpu_time_slice_pod_gets_one_limit_per_cuda_ordinal_in_pci_order() -> None:
    gpus = timeslice_node(4)
    # Assignment order is not PCI order: ordinals and the visible list follow the bus.
    answer = answer_for(admitted(GpuGrant(index=3, vram_mib=6000), GpuGrant(index=1, vram_mib=6000)), gpus, HAMI,
                        {}, container="main")
    assert answer.envs[ENV_VISIBLE] == "GPU-t1,GPU-t3"
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == answer.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "6000m"
    assert "CUDA_DEVICE_MEMORY_LIMIT_2" not in answer.envs
    assert answer.envs[ENV_DEVICE_ORDER] == DEVICE_ORDER
    assert answer.units == ("GPU-t3", "GPU-t1")  # the ledger's record keeps assignment order


def test_a_published_pci_bus_id_decides_the_order() -> None:
    gpus = node_units([{"index": 0, "uuid": "GPU-x", "mode": "timeslice", "replicas": 2, "pci_bus_id": "0000:81:00.0"},
                       {"index": 1, "uuid": "GPU-y", "mode": "timeslice", "replicas": 2, "pci_bus_id": "0000:41:00.0"}])
    answer = answer_for(admitted(GpuGrant(index=0, vram_mib=100), GpuGrant(index=1, vram_mib=200)), gpus, HAMI, {})
    assert answer.envs[ENV_VISIBLE] == "GPU-y,GPU-x"
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "200m" and answer.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "100m"


@pytest.mark.parametrize(("grant", "envs"), [
    (GpuGrant(index=0, vram_mib=30000, mig="3g.40gb@0"), {ENV_VISIBLE: "MIG-a0"}),
    (GpuGrant(index=3, vram_mib=10000), {ENV_VISIBLE: "GPU-dddd"}),
])
def test_hami_core_touches_no_other_mode(grant: GpuGrant, envs: dict[str, str]) -> None:
    answer = answer_for(admitted(grant), GPUS, HAMI, PIPES)
    assert answer.envs == envs and answer.mounts == () and answer.host_files == () and answer.fresh_dirs == ()


def test_an_mps_unit_keeps_its_pinned_limit_and_is_told_the_pci_order() -> None:
    answer = answer_for(admitted(GpuGrant(index=1, vram_mib=20000)), GPUS, HAMI, PIPES)
    assert answer.envs[ENV_MPS_MEM] == "0=20000M" and answer.envs[ENV_DEVICE_ORDER] == DEVICE_ORDER
    assert not any(k.startswith("CUDA_DEVICE_MEMORY") for k in answer.envs)
    assert PRELOAD_IN_CONTAINER not in {m.container_path for m in answer.mounts}


def test_without_hami_core_a_time_slice_answer_is_unchanged() -> None:
    answer = answer_for(admitted(GpuGrant(index=2, vram_mib=4096)), GPUS, AnswerSettings(), PIPES)
    assert answer.envs == {ENV_VISIBLE: "GPU-cccc", ENV_VRAM: "4096"}
    assert answer.mounts == () and answer.host_files == () and answer.fresh_dirs == answer.host_dirs == ()


def test_the_config_turns_it_on_only_with_a_library() -> None:
    assert hami_core_settings(AgentConfig()) is None
    on = AgentConfig(timeslice_enforcement="hami-core", hami_core_library=LIB, hami_core_cache_dir=CACHE)
    assert hami_core_settings(on) == HamiCore(library=LIB, cache_dir=CACHE)
    with pytest.raises(ValueError, match="hami_core_library"):
        AgentConfig(timeslice_enforcement="hami-core")
    with pytest.raises(ValueError):
        AgentConfig(timeslice_enforcement="hami-core", hami_core_library="libvgpu.so")  # not a host path


def test_prepare_host_paths_makes_what_the_mounts_need(tmp_path: Path) -> None:
    settings = AnswerSettings(hami_core=HamiCore(library=LIB, cache_dir=str(tmp_path)))
    answer = answer_for(admitted(GpuGrant(index=2, vram_mib=4096)), GPUS, settings, PIPES, container="main")
    cache = Path(answer.fresh_dirs[0])
    cache.mkdir(parents=True)
    (cache / "vgpu.cache").write_text("stale")
    lock = Path(answer.host_dirs[0])
    lock.mkdir()
    (lock / "lock0").write_text("held")
    prepare_host_paths(answer)
    assert cache.is_dir() and not any(cache.iterdir())  # a fresh cache for the new allocation
    assert (lock / "lock0").read_text() == "held"  # the node's shared locks stay
    assert (cache.stat().st_mode & 0o777) == 0o777 and (lock.stat().st_mode & 0o777) == 0o777
    assert (tmp_path / "ld.so.preload").read_text() == HAMI_LIBRARY_IN_CONTAINER + "\n"
    for m in answer.mounts:
        if m.host_path != LIB:
            assert Path(m.host_path).exists(), m
