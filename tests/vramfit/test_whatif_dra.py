"""`vramfit whatif`, `demo` and `inspect` on snapshots holding DRA objects (issue 29 item 5): the dra.md §10
slices, class and 14Gi claim, a MIG claim and a template claim, placed as the live allocator places them."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from packing.k8s.quantity import parse_quantity
from tests.fakes.dra_schema import validate_object
from vramfit.cli import main

GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
GIB = 1 << 30


def _selector(kind: str) -> dict[str, Any]:
    return {"cel": {"expression": f"device.driver == 'gpu.nvidia.com' && "
                                  f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}


def _gpu(name: str, product: str, uuid: str, shared: bool) -> dict[str, Any]:
    memory: dict[str, Any] = {"value": "80Gi"}
    if shared:
        memory["requestPolicy"] = {"default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}
    dev = {"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                                        "productName": {"string": product}}, "capacity": {"memory": memory}}
    if shared:
        dev["allowMultipleAllocations"] = True
    return dev


def _mig(name: str, profile: str, mib: int, slices: range) -> dict[str, Any]:
    caps = {"memory": {"value": f"{mib}Mi"}, **{f"memorySlice{i}": {"value": "1"} for i in slices}}
    return {"name": name, "attributes": {"type": {"string": "mig"}, "profile": {"string": profile},
                                         "uuid": {"string": f"MIG-{name}"},
                                         "parentUUID": {"string": "GPU-9e8d7c6b-5a4f-5e3d-8c2b-1a0f9e8d7c6b"},
                                         "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
            "capacity": caps}


def _slice(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"00000-gpu.nvidia.com-{node}-x"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def _claim_spec(cls: str, memory: str | None = None, profile: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if profile:
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim(ns: str, name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
           "spec": spec}
    if status:
        obj["status"] = status
    return obj


def pod(ns: str, name: str, minute: int, claim_name: str | None = None, template: str | None = None,
        annotations: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    entry = {"name": "gpu", **({"resourceClaimName": claim_name} if claim_name else
                               {"resourceClaimTemplateName": template})}
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                            "creationTimestamp": f"2026-08-01T10:{minute:02d}:00Z"}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"resourceClaims": [entry], "containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    else:
        spec["schedulingGates"] = [{"name": "vramfit.io/allocate"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def allocated(node: str, device: str, memory: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device}
    if memory:
        result |= {"shareID": "5f0c2a9e-3d41-4b8a-9e67-1c2d3e4f5a6b", "consumedCapacity": {"memory": memory}}
    return {"allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


def base() -> list[dict[str, Any]]:
    """dra.md §10: node-a (H100 whole, A100 shared by memory), node-mig (3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6)."""
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-mig"}},
        _slice("node-a", [_gpu("gpu-0", "NVIDIA H100 80GB HBM3", "GPU-4a2f", False),
                          _gpu("gpu-1", "NVIDIA A100-SXM4-80GB", "GPU-7c1d", True)]),
        _slice("node-mig", [_mig("gpu-0-mig-1g10gb-19-6", "1g.10gb", 9728, range(6, 7)),
                            _mig("gpu-0-mig-2g20gb-14-4", "2g.20gb", 19968, range(4, 6)),
                            _mig("gpu-0-mig-3g40gb-9-0", "3g.40gb", 40192, range(0, 4))]),
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
         "spec": {"selectors": [_selector("gpu")]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": MIG_CLASS},
         "spec": {"selectors": [_selector("mig")]}},
    ]


def whatif(tmp_path: Path, capsys: Any, objs: list[dict[str, Any]]) -> tuple[int, dict[str, Any], str]:
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    code = main(["whatif", "--snapshot", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["pod"]: p for p in doc["dra"]["placements"]}


def devices(row: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d["pool"], d["device"]) for c in row["claims"] for d in c["devices"]]


def test_section10_claims_placed_with_schema_valid_allocations(tmp_path: Path, capsys: Any) -> None:
    chat = claim("team-a", "chat-14gi", _claim_spec(GPU_CLASS, memory="14Gi"))
    small = claim("team-a", "mig-small", _claim_spec(MIG_CLASS, profile="1g.10gb"))
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": "team-a"},
                "spec": {"spec": _claim_spec(GPU_CLASS, memory="10Gi")}}
    objs = [*base(), chat, small, template, pod("team-a", "chat-0", 1, "chat-14gi"),
            pod("team-a", "mig-0", 2, "mig-small"), pod("team-a", "tmpl-0", 3, template="one-gpu")]
    code, doc, err = whatif(tmp_path, capsys, objs)
    assert code == 0, err
    got = rows(doc)
    assert devices(got["team-a/chat-0"]) == [("node-a", "gpu-1")]  # the share, not the whole H100
    assert devices(got["team-a/mig-0"]) == [("node-mig", "gpu-0-mig-1g10gb-19-6")]
    assert devices(got["team-a/tmpl-0"]) == [("node-a", "gpu-1")]
    assert got["team-a/tmpl-0"]["claims"][0]["from_template"] == "one-gpu"
    specs = {"team-a/chat-14gi": chat["spec"], "team-a/mig-small": small["spec"],
             "team-a/tmpl-0-gpu-": template["spec"]["spec"]}
    for row in got.values():
        for c in row["claims"]:
            ns, name = c["claim"].split("/")
            obj = claim(ns, name.rstrip("-") or name, copy.deepcopy(specs[c["claim"]]), {"allocation": c["allocation"]})
            validate_object(obj)
            assert c["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [row["node"]]
    share = got["team-a/chat-0"]["claims"][0]["allocation"]["devices"]["results"][0]
    assert share["consumedCapacity"] == {"memory": "14Gi"} and share["shareID"]
    assert doc["dra"]["summary"]["allocated"] == 3


def test_existing_allocations_are_booked_never_used_twice(tmp_path: Path, capsys: Any) -> None:
    objs = [*base(),
            claim("team-a", "old-share", _claim_spec(GPU_CLASS, memory="60Gi"), allocated("node-a", "gpu-1", "60Gi")),
            claim("team-a", "old-h100", _claim_spec(GPU_CLASS), allocated("node-a", "gpu-0", None)),
            claim("team-a", "chat-a", _claim_spec(GPU_CLASS, memory="14Gi")),
            claim("team-a", "chat-b", _claim_spec(GPU_CLASS, memory="14Gi")),
            pod("team-a", "chat-a", 1, "chat-a"), pod("team-a", "chat-b", 2, "chat-b")]
    code, doc, err = whatif(tmp_path, capsys, objs)
    assert code == 0, err
    got = rows(doc)
    assert devices(got["team-a/chat-a"]) == [("node-a", "gpu-1")]  # 60Gi + 14Gi fits 80Gi
    assert got["team-a/chat-b"]["node"] is None and got["team-a/chat-b"]["reason"]  # 88Gi would not; H100 is held
    used = Fraction(60 * GIB) + sum(parse_quantity(d["consumed"]["memory"]) for r in got.values()
                                    for c in r["claims"] for d in c["devices"] if d["device"] == "gpu-1")
    assert used <= 80 * GIB


def test_hardware_isolation_never_lands_on_the_shared_gpu(tmp_path: Path, capsys: Any) -> None:
    objs = [*base(), claim("team-a", "iso", _claim_spec(GPU_CLASS, memory="10Gi")),
            claim("team-a", "old-h100", _claim_spec(GPU_CLASS), allocated("node-a", "gpu-0", None)),
            pod("team-a", "iso-0", 1, "iso", annotations={"vramfit.io/isolation": "hardware"})]
    code, doc, err = whatif(tmp_path, capsys, objs)
    assert code == 0, err
    row = rows(doc)["team-a/iso-0"]
    assert row["node"] is None and ("node-a", "gpu-1") not in devices(row)
    assert row["isolation"] == "hardware"


def test_second_tenant_never_joins_the_first_tenants_share(tmp_path: Path, capsys: Any) -> None:
    objs = [*base(), claim("team-a", "a", _claim_spec(GPU_CLASS, memory="10Gi")),
            claim("team-b", "b", _claim_spec(GPU_CLASS, memory="10Gi")),
            claim("team-c", "c", _claim_spec(GPU_CLASS, memory="10Gi")),
            pod("team-a", "a-0", 1, "a"), pod("team-b", "b-0", 2, "b"), pod("team-c", "c-0", 3, "c")]
    code, doc, err = whatif(tmp_path, capsys, objs)
    assert code == 0, err
    got = rows(doc)
    assert devices(got["team-a/a-0"]) == [("node-a", "gpu-1")]
    on_share = [k for k, r in got.items() if ("node-a", "gpu-1") in devices(r)]
    assert on_share == ["team-a/a-0"]
    assert got["team-b/b-0"]["node"] == "node-a" and devices(got["team-b/b-0"]) == [("node-a", "gpu-0")]
    assert got["team-c/c-0"]["node"] is None


def test_a_bad_dra_object_exits_2_naming_file_object_and_field(tmp_path: Path, capsys: Any) -> None:
    bad = claim("team-a", "bad", {"devices": {"requests": [{"name": "gpu", "exactly": {"count": 1}}]}})
    code, _, err = whatif(tmp_path, capsys, [*base(), bad, pod("team-a", "p", 1, "bad")])
    assert code == 2
    assert "snap.yaml" in err and "ResourceClaim team-a/bad" in err and "deviceClassName" in err


def test_demo_shows_dra_allocation(capsys: Any) -> None:
    assert main(["demo", "--online", "--format", "json"]) == 0
    dra = json.loads(capsys.readouterr().out)["vramfit"]["dra"]
    placed = {p["pod"]: p for p in dra["placements"]}
    assert placed["team-b/eval-0"]["claims"][0]["from_template"] == "mig-1g"
    assert placed["team-b/train-0"]["node"] is None  # team-a holds the shared GPU
    assert dra["summary"]["allocated"] == 3
    assert main(["demo", "--online"]) == 0
    assert "DRA claims" in capsys.readouterr().out


def test_inspect_lists_dra_gpus_and_why_each_dra_pod_waits(capsys: Any) -> None:
    from vramfit.demo import DEMO_DRA

    assert main(["inspect", "--snapshot", str(DEMO_DRA)]) == 0
    out = capsys.readouterr().out
    assert "dra-a100" in out and "1g.10gb@6" in out
    assert "team-b/train-0 [gated]: no node takes every claim" in out
    assert "team-a/chat-0 [gated]: allocatable now on dra-a100" in out
