"""docs/dra.md: every YAML example is what it says. Kubernetes objects validate strictly against the 1.37 schema
(tests/fakes/dra_schema.py), the claims read with vramfit's own DRA parser ask for what the prose says, the pods
use claim templates the doc defines, the MIG selector picks the profile it names, and the config block is the
extender's defaults; README links the doc."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.dra_schema import SchemaError, validate_object

from extender.config import Settings
from packing.dra.cel import CelDevice, device_matches
from packing.dra.objects import GATE
from packing.dra.parse import claim
from packing.k8s.demand import pod_isolation
from packing.model import Isolation

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "dra.md"
TEXT = DOC.read_text()
BLOCKS = re.findall(r"^```yaml\n(.*?)^```$", TEXT, re.M | re.S)
DOCS = [d for block in BLOCKS for d in yaml.safe_load_all(block) if d]
OBJECTS = [d for d in DOCS if "kind" in d]
GIB = 1 << 30


def _one(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [d for d in OBJECTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return obj


def _template_claim(name: str) -> Any:
    """The claim the resource-claim controller would make from the doc's template (its spec copied)."""
    tmpl = _one("ResourceClaimTemplate", name)
    return claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": f"pod-{name}-x7k2p", "namespace": tmpl["metadata"]["namespace"]},
                  "spec": tmpl["spec"]["spec"]})


def test_the_doc_has_its_examples() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in OBJECTS)
    assert kinds == [("Pod", "chat-0"), ("Pod", "finetune-0"), ("ResourceClaimTemplate", "gpu-14gi"),
                     ("ResourceClaimTemplate", "gpu-40gi"), ("ResourceClaimTemplate", "mig-10gb")]
    assert len(DOCS) == len(OBJECTS) + 1  # and the config block


@pytest.mark.parametrize("obj", OBJECTS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in OBJECTS])
def test_every_object_validates_against_the_137_schema(obj: dict[str, Any]) -> None:
    validate_object(obj)


def test_the_schema_check_is_strict() -> None:
    bad = yaml.safe_load(yaml.safe_dump(_one("ResourceClaimTemplate", "gpu-14gi")))
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["request"] = {"memory": "14Gi"}
    with pytest.raises(SchemaError, match="capacity"):
        validate_object(bad)


def test_the_14gi_template_asks_the_gpu_class_for_14_gib() -> None:
    c = _template_claim("gpu-14gi")
    (request,) = c.requests
    (exact,) = request.alternatives
    assert (exact.device_class, exact.count, exact.all_devices) == ("gpu.nvidia.com", 1, False)
    assert exact.capacity == {"memory": Fraction(14 * GIB)}
    assert "memory: 14Gi" in TEXT


def test_the_mig_template_asks_for_memory_and_its_selector_picks_the_profile() -> None:
    c = _template_claim("mig-10gb")
    ((exact,),) = (r.alternatives for r in c.requests)
    assert exact.device_class == "mig.nvidia.com" and exact.capacity == {"memory": Fraction(9 * GIB)}
    (selector,) = exact.selectors

    def mig(profile: str, memory_mib: int) -> CelDevice:
        return CelDevice("gpu.nvidia.com", {"gpu.nvidia.com/type": "mig", "gpu.nvidia.com/profile": profile},
                         {"gpu.nvidia.com/memory": Fraction(memory_mib << 20)})

    assert device_matches(selector, mig("1g.10gb", 9728)) is True  # A100-80GB 1g.10gb: 9728Mi, >= 9Gi
    assert device_matches(selector, mig("2g.20gb", 19968)) is False
    assert 9728 << 20 >= 9 * GIB


@pytest.mark.parametrize("name", ["chat-0", "finetune-0"])
def test_each_pod_uses_a_template_of_its_namespace_by_the_claim_its_containers_name(name: str) -> None:
    pod = _one("Pod", name)
    ns = pod["metadata"]["namespace"]
    claims = {c["name"]: c for c in pod["spec"]["resourceClaims"]}
    for c in claims.values():
        assert _one("ResourceClaimTemplate", c["resourceClaimTemplateName"])["metadata"]["namespace"] == ns
    used = {u["name"] for ctr in pod["spec"]["containers"] for u in ctr["resources"]["claims"]}
    assert used == set(claims)
    assert "schedulingGates" not in pod["spec"]  # the webhook adds the gate, the user never writes it
    assert "schedulerName" not in pod["spec"]  # kube-scheduler schedules it once vramfit allocated


def test_the_hardware_pod_reads_as_hardware_isolation() -> None:
    pods = {name: _one("Pod", name) for name in ("chat-0", "finetune-0")}
    isolation = {n: pod_isolation(p["metadata"].get("annotations") or {}, n) for n, p in pods.items()}
    assert isolation == {"chat-0": Isolation.NONE, "finetune-0": Isolation.HARDWARE}


def test_the_config_block_is_the_extenders_defaults() -> None:
    (values,) = [d for d in DOCS if "kind" not in d]
    config = values["extender"]["config"]
    dra_keys = {k for k in Settings.model_fields if k.startswith("dra")}
    assert set(config) == dra_keys
    assert Settings(**config) == Settings()
    chart = yaml.safe_load((ROOT / "charts" / "vramfit" / "values.yaml").read_text())["extender"]["config"]
    assert {k: chart[k] for k in dra_keys} == config


def test_the_doc_states_the_protocol_the_trust_rules_and_the_limits() -> None:
    for fact in (GATE, "resource.kubernetes.io/delete-protection", "resourceclaims/status", "resourceclaims/binding",
                 "resourceVersion", "nodeSelector", "shareID", "consumedCapacity", "vramfit.io/isolation: hardware",
                 "vramfit.io/tenant", "vramfit-trust", "1.34", "once in its log", "kubelet plugin",
                 "vramfit.io/node=true"):
        assert fact in TEXT, fact
    limits = TEXT.split("## Not supported", 1)[1]
    for item in ("List-type attributes", "Admin access", "NoSchedule", "Binding conditions", "not node-local"):
        assert item in limits, item


def test_the_readme_links_the_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "[`docs/dra.md`](docs/dra.md)" in readme
