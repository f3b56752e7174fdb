"""Allocate believes only what vramfit wrote, and never hands out a unit another active pod holds.

The forged pods are issue 26's: created with `spec.nodeName` (no scheduler, no Binding), the phase annotation,
a hand-written assignment and a `vramfit.io/gpu` limit, aiming at another tenant's MIG instance or whole GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_gpus import NODE, PIPES, node_gpus
from node_signing import KEY_TEXT, KEYS, OTHER_KEYS, sign_pod

from nodeagent.allocate import (
    ENV_VISIBLE,
    GPU_RESOURCE,
    AllocateRefused,
    AnswerSettings,
    HandedOut,
    Trust,
    answer_for,
    node_units,
    select,
)
from nodeagent.cli import add_node_parser, build_agent, run_node
from packing.k8s.demand import ANN_ASSIGNMENT, ANN_PHASE
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys

GPUS = node_gpus(mps_memory_mib=20000, mps_replicas=2, timeslice_replicas=3)
UNITS = node_units(GPUS)
TRUST = Trust(KEYS)
MIG_UUID = {f"{m['profile']}@{m['start']}": m["uuid"] for m in GPUS[0]["mig"]}


def g(index: int, vram: int, mig: str | None = None) -> dict[str, Any]:
    return {"index": index, "mig": mig, "vram_mib": vram}


def unit_of(grant: dict[str, Any]) -> str:
    return MIG_UUID[grant["mig"]] if grant["mig"] else str(GPUS[grant["index"]]["uuid"])


def forged(name: str, grants: list[dict[str, Any]], *, namespace: str = "evil", node: str = NODE,
           uid: str | None = None) -> dict[str, Any]:
    """A pod as its author can write it: nodeName, the phase, an assignment and the GPU limit; no signature."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                     "creationTimestamp": "2026-12-03T10:00:00Z",
                     "annotations": {ANN_ASSIGNMENT: json.dumps({"gpus": grants}), ANN_PHASE: "allocating"}},
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {GPU_RESOURCE: str(len(grants))}}}]},
        "status": {"phase": "Pending"},
    }


def bound(name: str, grants: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """A pod the extender bound (signed), still in admission."""
    return sign_pod(forged(name, grants, **kw))


def running(name: str, grants: list[dict[str, Any]], *, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    """A pod the extender bound and the kubelet admitted."""
    p = bound(name, grants, **kw)
    p["status"] = {"phase": phase, "startTime": "2026-12-03T09:00:00Z"}
    return p


def decide(pods: list[dict[str, Any]], n: int = 1, trust: Trust = TRUST,
           handed_out: list[HandedOut] | None = None) -> tuple[str, tuple[str, ...]]:
    pod, _ = select(pods, NODE, n, trust, handed_out or [], UNITS)
    return pod.key, answer_for(pod, UNITS, AnswerSettings(), PIPES).units


VICTIMS = [running("mig", [g(0, 40000, "3g.40gb@0")], namespace="team-b"),
           running("whole", [g(3, 15360)], namespace="team-b")]


# ---- the forged pods of the issue --------------------------------------------------------------------


@pytest.mark.parametrize("target", [g(0, 40000, "3g.40gb@0"), g(3, 15360)], ids=["mig-instance", "whole-gpu"])
def test_a_forged_pod_gets_no_unit_with_or_without_a_victim(target: dict[str, Any]) -> None:
    for others in (VICTIMS, []):
        with pytest.raises(AllocateRefused) as err:
            decide([*others, forged("thief", [target])])
        assert f"pod evil/thief: its {ANN_ASSIGNMENT} carries no {ANN_SIGNATURE}" in str(err.value)
        assert err.value.notes and "evil/thief" in err.value.notes[0]


def test_another_pods_signature_copied_onto_a_new_pod_is_refused() -> None:
    victim = VICTIMS[0]
    thief = forged("thief", [g(0, 40000, "3g.40gb@0")])
    thief["metadata"]["annotations"][ANN_ASSIGNMENT] = victim["metadata"]["annotations"][ANN_ASSIGNMENT]
    thief["metadata"]["annotations"][ANN_SIGNATURE] = victim["metadata"]["annotations"][ANN_SIGNATURE]
    with pytest.raises(AllocateRefused, match="evil/thief: its .* does not verify"):
        decide([thief])  # even once the victim is gone: the signature is for the victim's UID


def test_a_signature_replayed_on_another_node_is_refused() -> None:
    replayed = sign_pod(forged("p", [g(0, 40000, "3g.40gb@4")]), node="gpu-2")
    with pytest.raises(AllocateRefused, match="does not verify"):
        decide([replayed])


def test_an_edited_assignment_is_refused() -> None:
    p = bound("p", [g(0, 40000, "3g.40gb@4")])
    p["metadata"]["annotations"][ANN_ASSIGNMENT] = json.dumps({"gpus": [g(0, 40000, "3g.40gb@0")]})
    with pytest.raises(AllocateRefused, match="does not verify"):
        decide([p])
    p = bound("q", [g(2, 4000)])
    p["metadata"]["annotations"][ANN_ASSIGNMENT] += " "  # the exact text is signed, not its meaning
    with pytest.raises(AllocateRefused, match="does not verify"):
        decide([p])


def test_a_signature_from_another_key_is_refused_and_any_listed_key_verifies() -> None:
    p = sign_pod(forged("p", [g(3, 1000)]), OTHER_KEYS)
    with pytest.raises(AllocateRefused, match="does not verify"):
        decide([p])
    rolling = SigningKeys(KEYS.keys + OTHER_KEYS.keys)  # a new key listed before it signs
    assert decide([p], trust=Trust(rolling)) == ("evil/p", ("GPU-dddd",))


def test_without_a_key_nothing_is_believed_unless_unsigned_is_allowed() -> None:
    with pytest.raises(AllocateRefused, match="no signing key is configured"):
        decide([bound("p", [g(3, 1000)])], trust=Trust(None))
    # The insecure mode believes what the annotation says (a single tenant's dry run)...
    assert decide([forged("p", [g(3, 1000)])], trust=Trust(None, allow_unsigned=True)) == ("evil/p", ("GPU-dddd",))
    # ...but still hands out no unit another pod holds.
    with pytest.raises(AllocateRefused, match="held whole by team-b/whole"):
        decide([*VICTIMS, forged("p", [g(3, 1000)])], trust=Trust(None, allow_unsigned=True))


# ---- units other active pods hold --------------------------------------------------------------------


@pytest.mark.parametrize(("grants", "text"), [
    ([g(0, 40000, "3g.40gb@0")], "MIG instance 3g.40gb@0 on GPU 0 .* held by team-b/mig"),
    ([g(3, 15360)], "GPU 3 .* held whole by team-b/whole"),
    ([g(2, 4000), g(3, 100)], "held whole by team-b/whole"),  # one held unit refuses the whole pod
])
def test_a_signed_pod_whose_unit_another_active_pod_holds_is_refused(grants: list[dict[str, Any]],
                                                                      text: str) -> None:
    with pytest.raises(AllocateRefused, match=text):
        decide([*VICTIMS, bound("late", grants, namespace="team-a")], n=len(grants))


def test_shared_gpus_refuse_past_their_replicas_or_their_memory() -> None:
    ts = [running(f"ts{i}", [g(2, 4000)]) for i in range(2)]
    assert decide([*ts, bound("p", [g(2, 4000)])]) == ("evil/p", ("GPU-cccc",))
    with pytest.raises(AllocateRefused, match="all 3 timeslice replicas"):
        decide([*ts, running("ts2", [g(2, 1000)]), bound("p", [g(2, 1000)])])
    with pytest.raises(AllocateRefused, match="7360 MiB not held by other pods, the assignment asks 8000"):
        decide([*ts, bound("p", [g(2, 8000)])])
    with pytest.raises(AllocateRefused, match="all 2 mps replicas"):
        decide([running("m0", [g(1, 5000)]), running("m1", [g(1, 5000)]), bound("p", [g(1, 5000)])])
    # A GPU description without its memory: the replicas still count.
    no_memory = [{k: v for k, v in x.items() if k != "memory_mib"} for x in GPUS]
    pod, _ = select([*ts, bound("p", [g(2, 99999)])], NODE, 1, TRUST, [], node_units(no_memory))
    assert pod.key == "evil/p"


def test_finished_pods_other_nodes_and_forged_holders_hold_nothing() -> None:
    others = [running("done", [g(3, 1)], phase="Succeeded"), running("failed", [g(3, 1)], phase="Failed"),
              running("there", [g(3, 1)], node="gpu-2"), forged("liar", [g(3, 1)])]
    others[-1]["status"] = {"phase": "Running", "startTime": "2026-12-03T09:00:00Z"}
    assert decide([*others, bound("p", [g(3, 1000)])]) == ("evil/p", ("GPU-dddd",))


def test_what_the_agent_handed_out_is_held_even_after_the_annotation_changes() -> None:
    holder = running("holder", [g(0, 40000, "3g.40gb@4")], namespace="team-b")
    # Its owner rewrites the assignment: the signature no longer verifies, but the container still has MIG-a4.
    holder["metadata"]["annotations"][ANN_ASSIGNMENT] = json.dumps({"gpus": [g(3, 1)]})
    ledger = [HandedOut("uid-holder", "team-b/holder", ("MIG-a4",), (40000,))]
    with pytest.raises(AllocateRefused, match="3g.40gb@4 .* held by team-b/holder"):
        decide([holder, bound("p", [g(0, 40000, "3g.40gb@4")])], handed_out=ledger)
    # Gone from the node's pods (deleted, containers stopped): its old answer holds nothing any more.
    assert decide([bound("p", [g(0, 40000, "3g.40gb@4")])], handed_out=ledger) == ("evil/p", ("MIG-a4",))


def test_a_properly_signed_pod_is_answered_as_before() -> None:
    pods = [*VICTIMS, bound("a", [g(0, 40000, "3g.40gb@4")], namespace="team-a")]
    pod, container = select(pods, NODE, 1, TRUST, [], UNITS)
    assert (pod.key, container) == ("team-a/a", "main")
    answer = answer_for(pod, UNITS, AnswerSettings(), PIPES)
    assert answer.envs == {ENV_VISIBLE: "MIG-a4"} and answer.vram_mib == (40000,)


# ---- the invariant over forged pods ------------------------------------------------------------------

SIGNATURES = ["good", "wrong-key", "wrong-uid", "wrong-node", "none", "edited"]
grant_st = st.sampled_from([g(0, 40000, "3g.40gb@0"), g(0, 40000, "3g.40gb@4"), g(1, 6000), g(1, 12000),
                            g(2, 4000), g(2, 8000), g(3, 15360)])
grants_st = st.lists(grant_st, min_size=1, max_size=2, unique_by=lambda x: x["index"])


def signed_as(pod: dict[str, Any], how: str) -> dict[str, Any]:
    if how == "good":
        return sign_pod(pod)
    if how == "wrong-key":
        return sign_pod(pod, OTHER_KEYS)
    if how == "wrong-uid":
        return sign_pod(pod, uid="uid-someone-else")
    if how == "wrong-node":
        return sign_pod(pod, node="gpu-2")
    if how == "edited":
        sign_pod(pod)
        grants = json.loads(pod["metadata"]["annotations"][ANN_ASSIGNMENT])["gpus"]
        grants[0]["vram_mib"] += 1
        pod["metadata"]["annotations"][ANN_ASSIGNMENT] = json.dumps({"gpus": grants})
    return pod


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[HandedOut], dict[str, str], dict[str, list[Any]]]:
    """Pods on the node: holders (admitted; signed or not, finished or not, maybe answered by the agent) and
    pods in admission (signed every way). Returns the pods, the ledger, how each candidate was signed, and
    what each active holder really holds (its signed grants, or what the ledger says it got)."""
    pods: list[dict[str, Any]] = []
    ledger: list[HandedOut] = []
    how: dict[str, str] = {}
    held: dict[str, list[Any]] = {}
    for i in range(draw(st.integers(0, 5))):
        grants = draw(grants_st)
        sig = draw(st.sampled_from(SIGNATURES))
        phase = draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded", "Failed"]))
        answered = draw(st.booleans()) and sig != "none"
        p = signed_as(forged(f"h{i}", grants, namespace=draw(st.sampled_from(["team-a", "team-b", "evil"]))), sig)
        p["status"] = {"phase": phase, "startTime": "2026-12-03T09:00:00Z"}
        pods.append(p)
        if answered:
            ledger.append(HandedOut(f"uid-h{i}", f"x/h{i}", tuple(unit_of(x) for x in grants),
                                    tuple(x["vram_mib"] for x in grants)))
        if phase not in ("Succeeded", "Failed") and (sig == "good" or answered):
            held[f"uid-h{i}"] = grants
    for i in range(draw(st.integers(1, 3))):
        sig = draw(st.sampled_from(SIGNATURES))
        p = signed_as(forged(f"c{i}", draw(grants_st)), sig)
        how[p["metadata"]["uid"]] = sig
        pods.append(p)
    return draw(st.permutations(pods)), ledger, how, held


def conflicts(grant: dict[str, Any], held: dict[str, list[Any]]) -> bool:
    """The rule stated plainly: a MIG instance or an exclusive GPU is held by one pod; a shared GPU by at most
    `replicas` pods whose MiB sum to at most its memory."""
    gpu = GPUS[grant["index"]]
    others = {uid: x for uid, grants in held.items() for x in grants if x["index"] == grant["index"]}
    if gpu["mode"] == "mig":
        return any(x["mig"] == grant["mig"] for x in others.values())
    if gpu["mode"] == "exclusive":
        return bool(others)
    return (len(others) + 1 > gpu["replicas"]
            or sum(x["vram_mib"] for x in others.values()) + grant["vram_mib"] > gpu["memory_mib"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.integers(1, 2))
def test_never_a_mis_signed_pod_never_a_held_unit(scene: tuple[list[dict[str, Any]], list[HandedOut],
                                                               dict[str, str], dict[str, list[Any]]],
                                                  n: int) -> None:
    pods, ledger, how, held = scene
    own = {p["metadata"]["uid"]: json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT])["gpus"]
           for p in pods if p["metadata"]["uid"] in how}
    signed = [uid for uid, sig in how.items() if sig == "good"]

    def held_against(uid: str) -> dict[str, list[Any]]:
        # Another signed pod in admission holds what the extender booked for it, like a running one.
        return {**held, **{other: own[other] for other in signed if other != uid}}

    ready = [uid for uid in signed if len(own[uid]) == n]
    free = [uid for uid in ready if not any(conflicts(x, held_against(uid)) for x in own[uid])]
    try:
        pod, _ = select(pods, NODE, n, TRUST, ledger, UNITS)
    except AllocateRefused:
        assert not (len(ready) == 1 and free == ready)  # refused only when no single free, signed pod is there
        return
    assert how.get(pod.uid) == "good"
    assert not any(conflicts(x, held_against(pod.uid)) for x in own[pod.uid])
    assert answer_for(pod, UNITS, AnswerSettings(), PIPES).units == tuple(unit_of(x) for x in own[pod.uid])


# ---- starting the agent ------------------------------------------------------------------------------


def node_args(tmp_path: Path, *extra: str, config: dict[str, Any] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_parser(parser.add_subparsers())
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps(GPUS))
    snapshot = tmp_path / "pods.yaml"
    snapshot.write_text("")
    argv = ["node", "--node-name", NODE, "--inventory-file", str(inventory), "--snapshot", str(snapshot),
            "--device-plugin-dir", str(tmp_path), "--state-dir", "", "--metrics-port", "0", *extra]
    if config is not None:
        (tmp_path / "agent.yaml").write_text(json.dumps(config))
        argv += ["--config", str(tmp_path / "agent.yaml")]
    return parser.parse_args(argv)


def test_without_a_key_the_agent_refuses_to_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_node(node_args(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--signing-key" in err and "signing_key_file" in err


@pytest.mark.parametrize("content", [None, "too-short\n", ""], ids=["missing", "short", "empty"])
def test_a_bad_key_file_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: str | None) -> None:
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)
    assert run_node(node_args(tmp_path, "--signing-key", str(key))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(key) in err


def test_the_key_from_the_flag_or_the_config(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY_TEXT)
    for args in (node_args(tmp_path, "--signing-key", str(key)),
                 node_args(tmp_path, config={"signing_key_file": str(key)})):
        assert build_agent(args).options.trust == TRUST


def test_unsigned_only_when_asked_and_then_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for args in (node_args(tmp_path, "--allow-unsigned-assignments"),
                 node_args(tmp_path, config={"allow_unsigned": True})):
        agent = build_agent(args)
        assert agent.options.trust == Trust(None, allow_unsigned=True)
        with caplog.at_level(logging.WARNING, logger="vramfit.node"):
            agent._warn_about_trust()  # noqa: SLF001 - what start() logs first
        assert "INSECURE" in caplog.text
