"""Every GPU the NVIDIA device plugin hands out is counted: `nvidia.com/gpu.shared` (renameByDefault), MIG
devices under both strategies, `nvidia.com/mig-<p>.shared`, and renamed resources (`rename`) once declared.

A pod the device plugin placed holds units vramfit did not give it; left uncounted, a full time-sliced node
is booked again, across tenants (gpu-facts.md §2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from solver_fixtures import gpu_usage

from extender.store import Store
from packing import fit
from packing.catalog import load_catalog
from packing.k8s.demand import pod_holding
from packing.k8s.snapshot import load_objects
from packing.model import InputError, Isolation, Mode, PodDemand
from packing.state import ClusterState
from packing.vendors.nvidia.plugin_names import DevicePluginNames

CAT = load_catalog()

# gpu-facts.md §3 Example B under `sharing.timeSlicing.renameByDefault: true`: one T4, 4 replicas, advertised as
# nvidia.com/gpu.shared.
T4_SHARED = {
    "nvidia.com/gpu.product": "Tesla-T4-SHARED",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.memory": "15360",
}


def node(name: str = "n1", labels: dict[str, str] | None = None, gpus: list[dict[str, Any]] | None = None,
         allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if gpus is not None:
        meta["annotations"] = {"vramfit.io/gpus": json.dumps(gpus)}
    return {"kind": "Node", "metadata": meta, "status": {"allocatable": allocatable or {}}}


def plugin_pod(name: str, resources: dict[str, str], node_name: str = "n1", ns: str = "team-a") -> dict[str, Any]:
    """A running pod placed by the default scheduler and the NVIDIA device plugin (no vramfit annotation)."""
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "creationTimestamp": "2026-05-04T08:00:00Z"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": resources}}]},
            "status": {"phase": "Running"}}


def want(vram: int, tenant: str = "team-a", isolation: Isolation = Isolation.NONE, key: str = "team-a/new"
         ) -> PodDemand:
    return PodDemand(key=key, vram_mib=vram, tenant=tenant, isolation=isolation)


def load(*objs: dict[str, Any], names: DevicePluginNames | None = None) -> ClusterState:
    state, _ = load_objects(objs, CAT, names=names or DevicePluginNames())
    return state


def units_held(state: ClusterState, node_name: str = "n1") -> int:
    return sum(gu.pods for gu in state.usage(node_name).gpus)


# ---- renameByDefault: nvidia.com/gpu.shared ----------------------------------------------------------------------


def test_full_time_sliced_node_held_through_gpu_shared_is_not_booked_again() -> None:
    t4 = node(labels=T4_SHARED, allocatable={"nvidia.com/gpu.shared": "4"})
    state = load(t4, *(plugin_pod(f"p{i}", {"nvidia.com/gpu.shared": "1"}) for i in range(4)))
    gu = gpu_usage(state, "n1", 0)
    assert gu.gpu.mode is Mode.TIMESLICE and gu.gpu.replicas == 4
    assert gu.pods == 4  # each replica pod takes a replica
    result = fit.explain(state, "n1", want(1000))
    assert not result.fits and "replicas are taken" in (result.reason or "")
    assert not fit.feasible(state, want(1000)).now.any()


def test_time_sliced_replicas_held_through_gpu_shared_count_for_tenancy() -> None:
    t4 = node(labels=T4_SHARED, allocatable={"nvidia.com/gpu.shared": "4"})
    state = load(t4, plugin_pod("p0", {"nvidia.com/gpu.shared": "1"}, ns="team-b"))
    assert gpu_usage(state, "n1", 0).tenant() == "team-b"
    # Another tenant's pod must never join team-b's failure domain; team-b's own may.
    assert not fit.explain(state, "n1", want(1000, tenant="team-a")).fits
    assert fit.explain(state, "n1", want(1000, tenant="team-b", key="team-b/new")).fits


def test_mps_replicas_held_through_gpu_shared() -> None:
    mps = node(gpus=[{"index": 0, "product": "NVIDIA-H100-80GB-HBM3", "mode": "mps", "replicas": 2}])
    state = load(mps, plugin_pod("p0", {"nvidia.com/gpu.shared": "1"}),
                 plugin_pod("p1", {"nvidia.com/gpu.shared": "1"}))
    assert gpu_usage(state, "n1", 0).pods == 2
    assert not fit.explain(state, "n1", want(1000, isolation=Isolation.PROCESS)).fits


def test_two_replicas_of_one_gpu_both_count() -> None:
    # A request for 2 replicas can land twice on the same GPU (gpu-facts.md §2): both are held.
    t4 = node(labels=T4_SHARED, allocatable={"nvidia.com/gpu.shared": "4"})
    state = load(t4, plugin_pod("p0", {"nvidia.com/gpu.shared": "2"}), plugin_pod("p1", {"nvidia.com/gpu.shared": "2"}))
    assert units_held(state) == 4
    assert not fit.explain(state, "n1", want(1000)).fits
    store = Store.from_objects([t4, plugin_pod("p0", {"nvidia.com/gpu.shared": "3"})], CAT)
    assert units_held(store.state) == 3
    store.apply("pods", "DELETED", plugin_pod("p0", {"nvidia.com/gpu.shared": "3"}))
    assert units_held(store.state) == 0 and store.state.holders() == []


def test_replica_pods_spread_as_the_plugin_distributes_them() -> None:
    # The plugin's default `distributed` policy: the GPU with the fewest of its replicas handed out first.
    two = node(gpus=[{"index": i, "product": "Tesla-T4", "mode": "timeslice", "replicas": 4} for i in range(2)])
    state = load(two, plugin_pod("p0", {"nvidia.com/gpu.shared": "1"}, ns="team-b"),
                 plugin_pod("p1", {"nvidia.com/gpu.shared": "1"}, ns="team-b"))
    assert [gu.pods for gu in state.usage("n1").gpus] == [1, 1]


def test_mixed_node_whose_full_gpus_are_advertised_as_gpu_shared() -> None:
    # One MIG GPU (7 x 1g.10gb) and one time-sliced full GPU, renamed by default: nvidia.com/gpu.shared, not
    # nvidia.com/gpu, counts the full one.
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/mig-1g.10gb.count": "7"}
    state = load(node(labels=labels, allocatable={"nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "7"}))
    modes = sorted(g.mode.value for g in state.node("n1").gpus)
    assert modes == ["mig", "timeslice"]


# ---- MIG strategies -------------------------------------------------------------------------------------------


def single_node() -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/gpu.count": "14",
              "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.memory": "9728"}
    return node(labels=labels, allocatable={"nvidia.com/gpu": "14"})


def test_mig_single_strategy_gpu_requests_hold_mig_devices() -> None:
    pods = [plugin_pod(f"p{i}", {"nvidia.com/gpu": "1"}) for i in range(14)]
    state = load(single_node(), *pods[:13])
    assert all(g.mode is Mode.MIG and len(g.mig) == 7 for g in state.node("n1").gpus)
    assert sum(len(gu.mig_holder) for gu in state.usage("n1").gpus) == 13
    assert fit.explain(state, "n1", want(5000, isolation=Isolation.HARDWARE)).fits  # one instance left
    state = load(single_node(), *pods)
    result = fit.explain(state, "n1", want(5000, isolation=Isolation.HARDWARE))
    assert not result.fits


def test_mig_single_strategy_told_by_the_gpus_when_no_label_says() -> None:
    # Every GPU in MIG mode: nvidia.com/gpu can only be MIG devices (under mixed it counts full GPUs: none here).
    a100 = {"product": "NVIDIA-A100-SXM4-80GB", "mode": "mig",
            "mig": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}
    state = load(node(gpus=[dict(a100, index=0)]), plugin_pod("p0", {"nvidia.com/gpu": "2"}))
    assert len(gpu_usage(state, "n1", 0).mig_holder) == 2
    assert not fit.explain(state, "n1", want(5000)).fits


def test_mig_mixed_strategy_instances_and_their_shared_form() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "1",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "7",
              "nvidia.com/mig.config": "all-1g.10gb"}
    a100 = node(labels=labels, allocatable={"nvidia.com/mig-1g.10gb.shared": "14"})
    pods = [plugin_pod("a", {"nvidia.com/mig-1g.10gb": "3"}),
            *(plugin_pod(f"s{i}", {"nvidia.com/mig-1g.10gb.shared": "1"}) for i in range(4))]
    state = load(a100, *pods)
    assert len(gpu_usage(state, "n1", 0).mig_holder) == 7  # 3 instances + one per .shared replica pod
    assert not fit.explain(state, "n1", want(5000, isolation=Isolation.HARDWARE)).fits


def test_holding_reads_every_nvidia_name() -> None:
    pod = plugin_pod("x", {"nvidia.com/gpu": "1", "nvidia.com/gpu.shared": "2", "nvidia.com/mig-3g.40gb": "1",
                           "nvidia.com/mig-1g.10gb.me.shared": "1", "example.com/other": "5", "cpu": "2"})
    h = pod_holding(pod)
    assert h is not None and h.grants is None
    assert h.whole_gpus == 3 and sorted(h.mig_profiles) == ["1g.10gb.me", "3g.40gb"]
    assert pod_holding(plugin_pod("y", {"example.com/other": "5"})) is None


# ---- custom names from the sharing config's `rename` ----------------------------------------------------------


def test_custom_rename_counts_once_declared() -> None:
    t4 = node(labels=T4_SHARED, allocatable={"example.com/t4-shared": "4"})
    pods = [plugin_pod(f"p{i}", {"example.com/t4-shared": "1"}) for i in range(4)]
    assert fit.explain(load(t4, *pods), "n1", want(1000)).fits  # undeclared: invisible (what to avoid)
    names = DevicePluginNames({"example.com/t4-shared": "nvidia.com/gpu"})
    state = load(t4, *pods, names=names)
    assert gpu_usage(state, "n1", 0).pods == 4 and not fit.explain(state, "n1", want(1000)).fits
    # The store takes the same declaration.
    store = Store.from_objects([t4, *pods], CAT, device_plugin_names=names)
    assert units_held(store.state) == 4


def test_custom_rename_of_a_mig_resource() -> None:
    a100 = node(gpus=[{"index": 0, "product": "NVIDIA-A100-SXM4-80GB", "mode": "mig",
                       "mig": [{"profile": "1g.10gb", "start": s} for s in range(7)]}])
    names = DevicePluginNames({"example.com/small": "mig-1g.10gb"})
    state = load(a100, plugin_pod("p", {"example.com/small": "7"}), names=names)
    assert len(gpu_usage(state, "n1", 0).mig_holder) == 7


@pytest.mark.parametrize("mapping", [{"no-slash": "gpu"}, {"example.com/x": "tpu"}, {"example.com/x": "mig-"},
                                     {"example.com/x": 3}])
def test_malformed_declarations_are_rejected(mapping: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="device plugin resources"):
        DevicePluginNames(mapping)


def test_declared_meanings_accept_both_spellings() -> None:
    names = DevicePluginNames({"a.com/x": "gpu", "a.com/y": "nvidia.com/gpu", "a.com/z": "nvidia.com/mig-2g.20gb",
                               "a.com/w": "mig-2g.20gb"})
    assert [names.unit(k) for k in ("a.com/x", "a.com/y", "a.com/z", "a.com/w")] == ["gpu", "gpu", "mig-2g.20gb",
                                                                                    "mig-2g.20gb"]
    assert names.unit("nvidia.com/gpu.shared") == "gpu" and names.unit("nvidia.com/mig-1g.5gb.shared") == "mig-1g.5gb"
    assert names.unit("nvidia.com/mig-") is None and names.unit("memory") is None
