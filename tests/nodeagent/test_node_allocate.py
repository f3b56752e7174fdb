"""The Allocate rule on its own: which pod is being admitted, and what its container receives per mode."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes.kubelet import pod_requests
from hypothesis import given, settings
from hypothesis import strategies as st
from node_gpus import NODE, PIPES, node_gpus
from node_signing import KEYS, sign_pod

from nodeagent.allocate import (
    DEVICE_MOUNT_ROOT,
    DEVICE_MOUNT_SOURCE,
    ENV_MPS_MEM,
    ENV_MPS_PIPE,
    ENV_MPS_THREADS,
    ENV_VISIBLE,
    ENV_VRAM,
    GPU_RESOURCE,
    AllocateRefused,
    AnswerSettings,
    Trust,
    admission_candidates,
    answer_for,
    node_units,
    pick_pod,
)
from nodeagent.devices import HEALTHY, TICKETS_PER_PLACE, UNHEALTHY, DeviceTable, gpu_of, slots
from packing.k8s.demand import ANN_PHASE

GPUS = node_gpus(mps_memory_mib=81559, mps_replicas=4, timeslice_replicas=4)
TRUST = Trust(KEYS)


def pod(name: str, grants: list[dict[str, Any]], *, phase: str | None = "allocating", started: bool = False,
        node: str = NODE, containers: int = 1, uid: str | None = None, status_phase: str = "Pending",
        created: str = "2026-12-03T10:00:00Z") -> dict[str, Any]:
    ann = {"vramfit.io/assignment": json.dumps({"gpus": grants})}
    if phase is not None:
        ann[ANN_PHASE] = phase
    status: dict[str, Any] = {"phase": status_phase}
    if started:
        status["startTime"] = "2026-12-03T10:00:05Z"
    return sign_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}", "annotations": ann,
                     "creationTimestamp": created},
        "spec": {"nodeName": node, "containers": [
            {"name": f"c{i}", "resources": {"limits": {GPU_RESOURCE: str(len(grants))}}} for i in range(containers)]},
        "status": status,
    })


def g(index: int, vram: int, mig: str | None = None) -> dict[str, Any]:
    return {"index": index, "mig": mig, "vram_mib": vram}


def choose(pods: list[dict[str, Any]], n: int, answered: dict[str, int] | None = None) -> tuple[str, str]:
    answered = answered or {}
    cands, _ = admission_candidates(pods, NODE, answered, TRUST)
    p, container = pick_pod(cands, answered, n, NODE)
    return p.key, container


def test_the_one_pod_in_admission_is_chosen_and_admitted_or_other_pods_are_not() -> None:
    pods = [
        pod("old", [g(3, 15360)], started=True),  # admitted already
        pod("elsewhere", [g(3, 15360)], node="gpu-2"),
        pod("plain", [g(3, 15360)], phase=None),  # not bound by vramfit's handshake
        pod("failed", [g(3, 15360)], status_phase="Failed"),
        pod("new", [g(0, 30000, "3g.40gb@4")]),
    ]
    assert choose(pods, 1) == ("team-a/new", "c0")


def test_no_candidate_or_two_candidates_are_refused_with_a_reason() -> None:
    with pytest.raises(AllocateRefused, match="refusing to guess"):
        choose([pod("admitted", [g(3, 1)], started=True)], 1)
    with pytest.raises(AllocateRefused, match="2 pods .* in admission"):
        choose([pod("a", [g(2, 1000)]), pod("b", [g(1, 1000)])], 1)
    # The device count tells a 1-GPU pod from a 2-GPU pod: no guess involved.
    two = pod("two", [g(2, 1000), g(3, 1000)])
    assert choose([pod("a", [g(1, 1000)]), two], 2) == ("team-a/two", "c0")
    with pytest.raises(AllocateRefused):
        choose([two], 1)


def test_answered_containers_move_on_and_a_fully_answered_pod_is_never_answered_again() -> None:
    p = pod("multi", [g(2, 1000)], containers=2)
    assert choose([p], 1, {}) == ("team-a/multi", "c0")
    assert choose([p], 1, {"uid-multi": 1}) == ("team-a/multi", "c1")
    with pytest.raises(AllocateRefused):
        choose([p], 1, {"uid-multi": 2})


def test_answers_per_mode() -> None:
    units = node_units(GPUS)
    s = AnswerSettings()

    def answer(grants: list[dict[str, Any]], settings: AnswerSettings = s) -> Any:
        cands, _ = admission_candidates([pod("p", grants)], NODE, {}, TRUST)
        return answer_for(cands[0], units, settings, PIPES)

    mig = answer([g(0, 30000, "3g.40gb@4")])
    assert mig.envs == {ENV_VISIBLE: "MIG-a4"} and mig.units == ("MIG-a4",)
    whole = answer([g(3, 15360)])
    assert whole.envs == {ENV_VISIBLE: "GPU-dddd"}
    ts = answer([g(2, 4096)])
    assert ts.envs == {ENV_VISIBLE: "GPU-cccc", ENV_VRAM: "4096"}
    mps = answer([g(1, 20000)], AnswerSettings(mps_thread_percentage="auto"))
    assert mps.envs[ENV_VISIBLE] == "GPU-bbbb"
    assert mps.envs[ENV_MPS_MEM] == "0=20000M" and mps.envs[ENV_MPS_THREADS] == "25"
    assert mps.mounts[0].host_path == PIPES["GPU-bbbb"] and mps.envs[ENV_MPS_PIPE] == mps.mounts[0].container_path
    multi = answer([g(0, 30000, "3g.40gb@0"), g(3, 15000)])
    assert multi.envs[ENV_VISIBLE] == "MIG-a0,GPU-dddd"  # assignment order
    cdi = answer([g(0, 30000, "3g.40gb@0")], AnswerSettings(strategy="cdi", cdi_kind="k8s.device-plugin.nvidia.com/gpu"))
    assert cdi.cdi_devices == ("k8s.device-plugin.nvidia.com/gpu=MIG-a0",) and cdi.envs[ENV_VISIBLE] == "void"
    # volume-mounts: the units as empty mounts named by UUID (in PCI bus order, as the env lists them), the variable
    # naming only their directory; the MPS pipe mount stays beside them.
    vm = AnswerSettings(strategy="volume-mounts")
    mounted = answer([g(3, 15000), g(0, 30000, "3g.40gb@0")], vm)
    assert mounted.envs[ENV_VISIBLE] == DEVICE_MOUNT_ROOT and not mounted.cdi_devices
    assert [(m.container_path, m.host_path) for m in mounted.mounts] == [
        (f"{DEVICE_MOUNT_ROOT}/MIG-a0", DEVICE_MOUNT_SOURCE), (f"{DEVICE_MOUNT_ROOT}/GPU-dddd", DEVICE_MOUNT_SOURCE)]
    shared = answer([g(1, 20000)], vm)
    assert [m.container_path for m in shared.mounts] == [shared.envs[ENV_MPS_PIPE], f"{DEVICE_MOUNT_ROOT}/GPU-bbbb"]


def test_answers_refuse_units_the_node_does_not_have() -> None:
    units = node_units(GPUS)
    for grants, text in [([g(9, 1)], "does not have"), ([g(0, 1, "7g.80gb@0")], "re-partitioned"),
                         ([g(0, 1)], "MIG mode")]:
        cands, _ = admission_candidates([pod("p", grants)], NODE, {}, TRUST)
        with pytest.raises(AllocateRefused, match=text):
            answer_for(cands[0], units, AnswerSettings(), PIPES)
    cands, _ = admission_candidates([pod("p", [g(1, 1000)])], NODE, {}, TRUST)
    with pytest.raises(AllocateRefused, match="MPS control daemon"):
        answer_for(cands[0], units, AnswerSettings(), {})  # the daemon is down: no half-working share


def healthy_ids(table: DeviceTable) -> list[str]:
    return [d.id for d in table.devices() if d.health == HEALTHY]


def test_device_tickets_cover_every_unit_and_keep_lost_gpus_unhealthy() -> None:
    table = DeviceTable()
    assert table.update(GPUS)
    assert [slots(x) for x in GPUS] == [2, 4, 4, 1]
    assert len(healthy_ids(table)) == 11 * TICKETS_PER_PLACE and {gpu_of(d) for d in healthy_ids(table)} == {x["uuid"] for x in GPUS}
    assert not table.update(GPUS)  # nothing changed: no resend
    assert table.update(GPUS[1:])  # GPU 0 lost
    health = {d.id: d.health for d in table.devices()}
    assert {h for d, h in health.items() if gpu_of(d) == "GPU-aaaa"} == {UNHEALTHY}
    assert {h for d, h in health.items() if gpu_of(d) != "GPU-aaaa"} == {HEALTHY}


grant_st = st.sampled_from([g(0, 30000, "3g.40gb@0"), g(0, 30000, "3g.40gb@4"), g(2, 1000), g(3, 1000)])
pod_st = st.builds(
    lambda i, grants, phase, started, node, answered: (pod(f"p{i}", grants, phase=phase, started=started,
                                                          node=node), answered),
    st.integers(0, 10**6), st.lists(grant_st, min_size=1, max_size=2, unique_by=lambda x: x["index"]),
    st.sampled_from(["allocating", None]), st.booleans(), st.sampled_from([NODE, "other"]), st.integers(0, 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(pod_st, max_size=6, unique_by=lambda x: x[0]["metadata"]["uid"]), st.integers(1, 2))
def test_an_answer_is_always_the_chosen_pods_own_units(entries: list[tuple[dict[str, Any], int]], n: int) -> None:
    pods = [p for p, _ in entries]
    answered = {p["metadata"]["uid"]: a for p, a in entries if a}
    eligible = [p for p, a in entries
                if p["spec"]["nodeName"] == NODE and p["metadata"]["annotations"].get(ANN_PHASE) == "allocating"
                and "startTime" not in p["status"] and not a
                and len(json.loads(p["metadata"]["annotations"]["vramfit.io/assignment"])["gpus"]) == n]
    cands, _ = admission_candidates(pods, NODE, answered, TRUST)
    try:
        chosen, _ = pick_pod(cands, answered, n, NODE)
    except AllocateRefused:
        assert len(eligible) != 1  # refused exactly when the choice is not unique
        return
    assert len(eligible) == 1 and chosen.uid == eligible[0]["metadata"]["uid"]
    answer = answer_for(chosen, node_units(GPUS), AnswerSettings(), PIPES)
    own = json.loads(eligible[0]["metadata"]["annotations"]["vramfit.io/assignment"])["gpus"]
    expected = [GPUS[x["index"]]["uuid"] if x["mig"] is None else
                {f"{m['profile']}@{m['start']}": m["uuid"] for m in GPUS[0]["mig"]}[x["mig"]] for x in own]
    assert list(answer.units) == expected


# A pod's containers that ask for vramfit.io/gpu: (init?, sidecar?) each; the webhook gives each the pod's count.
container_st = st.tuples(st.booleans(), st.booleans())
placed_pod_st = st.tuples(st.lists(container_st, min_size=1, max_size=TICKETS_PER_PLACE),
                          st.lists(st.integers(0, len(GPUS) - 1), min_size=1, max_size=len(GPUS), unique=True))


def _spec(containers: list[tuple[bool, bool]], k: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"initContainers": [], "containers": []}
    for i, (init, sidecar) in enumerate(containers):
        c: dict[str, Any] = {"name": f"c{i}", "resources": {"limits": {GPU_RESOURCE: str(k)}}}
        if init:
            if sidecar:
                c["restartPolicy"] = "Always"
            spec["initContainers"].append(c)
        else:
            spec["containers"].append(c)
    return {"spec": spec}


@settings(max_examples=300, deadline=None)
@given(st.lists(placed_pod_st, max_size=12))
def test_every_set_of_pods_vramfit_places_fits_the_advertised_tickets(pods: list[Any]) -> None:
    """Whatever pods the extender places (one place per GPU each, at most a GPU's slots of them, at most
    TICKETS_PER_PLACE GPU containers each), kube-scheduler's and the kubelet's resource fit passes."""
    places = {i: 0 for i in range(len(GPUS))}
    requested = 0
    for containers, gpus in pods:
        if any(places[i] + 1 > slots(GPUS[i]) for i in gpus):
            continue  # the extender would not place it here
        for i in gpus:
            places[i] += 1
        requested += pod_requests(_spec(containers, len(gpus)), GPU_RESOURCE)
    table = DeviceTable()
    table.update(GPUS)
    assert requested <= len(healthy_ids(table))
