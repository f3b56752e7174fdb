"""manifests/: every object validates against the Kubernetes schemas (kubernetes-validate ships them, so
this runs offline), and the KubeSchedulerConfiguration against the v1 field list and kube-scheduler's
validation rules (shared/reference/extender-protocol.md §3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from extender.cli import build_serve_parser
from extender.config import load_settings
from packing.k8s.demand import pod_demand
from packing.k8s.trust import Tenancy
from packing.model import InputError, Isolation

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_VERSION = "1.31.0"


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(ROOT)), doc))
    return out


DOCS = _docs()


def _find(kind: str, name: str) -> dict[str, Any]:
    for _, doc in DOCS:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} in manifests/")


def test_all_expected_objects_present() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in DOCS}
    for expected in [("Namespace", "vramfit-system"), ("ServiceAccount", "vramfit"),
                     ("ClusterRole", "vramfit-extender"), ("ClusterRoleBinding", "vramfit-extender"),
                     ("ClusterRole", "vramfit-extender-dra"), ("ClusterRoleBinding", "vramfit-extender-dra"),
                     ("Deployment", "vramfit"), ("Service", "vramfit"), ("ConfigMap", "vramfit-config"),
                     ("ConfigMap", "vramfit-scheduler-config"), ("Deployment", "vramfit-scheduler"),
                     ("ServiceAccount", "vramfit-scheduler"), ("Pod", "llm-7b-inference"),
                     ("Pod", "embeddings-mps"), ("Pod", "finetune-isolated"),
                     ("ValidatingAdmissionPolicy", "vramfit-trust"),
                     ("ValidatingAdmissionPolicyBinding", "vramfit-trust"), ("NetworkPolicy", "vramfit")]:
        assert expected in kinds


@pytest.mark.parametrize(("path", "doc"), DOCS, ids=[f"{p}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCS])
def test_manifest_validates_against_kubernetes_schema(path: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("cert-manager.io/"):
        pytest.skip("cert-manager CRD kind: no schema in kubernetes-validate (checked in tests/extender/test_webhook.py)")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{path}: {exc.message} at {list(exc.path)}")


def test_schema_validation_catches_a_typo() -> None:
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": [{"name": "a", "imagex": "b"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_extender_rbac_is_least_privilege() -> None:
    role = _find("ClusterRole", "vramfit-extender")
    granted = {(tuple(r["apiGroups"]), res, verb) for r in role["rules"] for res in r["resources"] for verb in r["verbs"]}
    assert granted == {
        (("",), "nodes", "list"), (("",), "nodes", "watch"),
        (("",), "pods", "get"), (("",), "pods", "list"), (("",), "pods", "watch"),
        (("",), "namespaces", "list"), (("",), "namespaces", "watch"),  # the tenancy rules (read only)
        (("",), "pods/binding", "create"), (("",), "events", "create"),
    }
    binding = _find("ClusterRoleBinding", "vramfit-extender")
    assert binding["roleRef"]["name"] == "vramfit-extender"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vramfit", "namespace": "vramfit-system"}]


def test_the_dra_rbac_is_the_allocators_calls_and_nothing_a_driver_needs() -> None:
    """DRA mode (dra: auto in the manifests): read the resource.k8s.io kinds, the finalizer by a plain claim update,
    the allocation by a status update plus the granular-authorization subresource resourceclaims/binding, the
    gate's removal by a pod update, the condition of a pod it cannot place by a status patch. Never resourceclaims/driver (status.devices is the driver's), never a write
    to slices, classes or templates, never create or delete."""
    role = _find("ClusterRole", "vramfit-extender-dra")
    granted = {(g, res, verb) for r in role["rules"] for g in r["apiGroups"] for res in r["resources"]
               for verb in r["verbs"]}
    rk = "resource.k8s.io"
    assert granted == {
        *{(rk, kind, verb) for kind in ("resourceslices", "deviceclasses", "resourceclaimtemplates", "resourceclaims")
          for verb in ("list", "watch")},
        (rk, "resourceclaims", "update"),
        (rk, "resourceclaims/status", "update"), (rk, "resourceclaims/binding", "update"),
        ("", "pods", "update"), ("", "pods/status", "patch"),
    }
    assert not any("resourceNames" in r for r in role["rules"])  # the binding check names no object
    binding = _find("ClusterRoleBinding", "vramfit-extender-dra")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "vramfit-extender-dra"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vramfit", "namespace": "vramfit-system"}]


# ---- KubeSchedulerConfiguration v1 -------------------------------------------------------------------

# Field lists of kubescheduler.config.k8s.io/v1 (kubernetes/kube-scheduler config/v1/types.go). The real
# decoder is strict, so any other key (or a mis-cased one like the legacy `enableHttps`) is an error.
TOP_FIELDS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
              "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
              "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"}
LEADER_FIELDS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                 "resourceNamespace"}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                   "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
MANAGED_FIELDS = {"name", "ignoredByScheduler"}
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def scheduler_config_problems(cfg: Any) -> list[str]:
    """kube-scheduler's strict decode + validateExtenders, as a list of problems (empty = valid)."""
    if not isinstance(cfg, dict):
        return ["not a mapping"]
    problems = _top_level_problems(cfg) + _profile_problems(cfg.get("profiles") or [])
    extenders = cfg.get("extenders") or []
    seen_resources: set[str] = set()
    for i, ext in enumerate(extenders):
        problems += _extender_problems(ext, f"extenders[{i}]", seen_resources)
    if sum(1 for ext in extenders if ext.get("bindVerb")) > 1:
        problems.append("only one extender can implement bind")
    return problems


def _unknown(obj: dict[str, Any], allowed: set[str], where: str) -> list[str]:
    return [f"{where}: unknown field {k!r}" for k in obj if k not in allowed]


def _top_level_problems(cfg: dict[str, Any]) -> list[str]:
    problems = _unknown(cfg, TOP_FIELDS, "config")
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        problems.append("apiVersion must be kubescheduler.config.k8s.io/v1")
    if cfg.get("kind") != "KubeSchedulerConfiguration":
        problems.append("kind must be KubeSchedulerConfiguration")
    if "leaderElection" in cfg:
        problems += _unknown(cfg["leaderElection"], LEADER_FIELDS, "leaderElection")
    pct = cfg.get("percentageOfNodesToScore")
    if pct is not None and not (isinstance(pct, int) and 0 <= pct <= 100):
        problems.append("percentageOfNodesToScore must be 0..100")
    return problems


def _profile_problems(profiles: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for i, prof in enumerate(profiles):
        problems += _unknown(prof, PROFILE_FIELDS, f"profiles[{i}]")
    names = [prof.get("schedulerName") for prof in profiles]
    if len(names) != len(set(names)):
        problems.append("duplicate schedulerName")
    return problems


def _extender_problems(ext: dict[str, Any], where: str, seen_resources: set[str]) -> list[str]:
    problems = _unknown(ext, EXTENDER_FIELDS, where)
    if not isinstance(ext.get("urlPrefix"), str) or not re.match(r"^https?://", ext["urlPrefix"]):
        problems.append(f"{where}.urlPrefix must be an http(s) URL")
    if ext.get("prioritizeVerb") and not (isinstance(ext.get("weight"), int) and ext["weight"] > 0):
        problems.append(f"{where}.weight: must have a positive weight applied to it")
    timeout = ext.get("httpTimeout")
    if timeout is not None and not (isinstance(timeout, str) and GO_DURATION.match(timeout)):
        problems.append(f"{where}.httpTimeout must be a duration string like 30s")
    problems += [f"{where}.{key} must be a boolean" for key in ("nodeCacheCapable", "ignorable", "enableHTTPS")
                 if key in ext and not isinstance(ext[key], bool)]
    if "tlsConfig" in ext:
        problems += _unknown(ext["tlsConfig"], TLS_FIELDS, f"{where}.tlsConfig")
    for j, res in enumerate(ext.get("managedResources") or []):
        problems += _managed_resource_problems(res, f"{where}.managedResources[{j}]", seen_resources)
    return problems


def _managed_resource_problems(res: dict[str, Any], where: str, seen_resources: set[str]) -> list[str]:
    problems = _unknown(res, MANAGED_FIELDS, where)
    name = res.get("name")
    if not isinstance(name, str) or not QUALIFIED_NAME.match(name):
        return [*problems, f"{where}.name {name!r} is not a qualified name"]
    # IsExtendedResourceName: not native (no "/" or a kubernetes.io/ prefix) and not requests.*
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        problems.append(f"{where}.name {name!r} is not a valid extended resource name")
    if name in seen_resources:
        problems.append(f"{where}.name {name!r} is duplicated")
    seen_resources.add(name)
    return problems


def _scheduler_config() -> dict[str, Any]:
    cm = _find("ConfigMap", "vramfit-scheduler-config")
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


def test_scheduler_config_is_valid_v1() -> None:
    assert scheduler_config_problems(_scheduler_config()) == []


def test_scheduler_config_extender_entry() -> None:
    cfg = _scheduler_config()
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["vramfit-scheduler"]
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter", "prioritize", "bind", "preempt")
    assert ext["weight"] > 0
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["managedResources"] == [{"name": "vramfit.io/vram", "ignoredByScheduler": True},
                                       {"name": "vramfit.io/gpu", "ignoredByScheduler": False}]
    # HTTPS with the client certificate the extender's --client-ca accepts.
    assert ext["enableHTTPS"] is True and set(ext["tlsConfig"]) == {"certFile", "keyFile", "caFile"}
    assert GO_DURATION.match(ext["httpTimeout"])
    # The URL reaches the Service and the prefix the extender serves.
    svc = _find("Service", "vramfit")
    settings = load_settings_from_configmap()
    port = svc["spec"]["ports"][0]["port"]
    assert ext["urlPrefix"].rstrip("/") == f"https://vramfit.vramfit-system.svc:{port}{settings.url_prefix}"


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda e: e.update(weight=0), "positive weight"),
    (lambda e: e.update(enableHttps=True), "unknown field 'enableHttps'"),
    (lambda e: e.update(httpTimeout=30000000000), "duration"),
    (lambda e: e["managedResources"].append({"name": "vramfit.io/vram"}), "duplicated"),
    (lambda e: e["managedResources"].append({"name": "kubernetes.io/vram"}), "extended resource"),
    (lambda e: e["managedResources"].append({"name": "vram"}), "extended resource"),
])
def test_scheduler_config_rules_reject_bad_variants(mutate: Any, expected: str) -> None:
    cfg = _scheduler_config()
    mutate(cfg["extenders"][0])
    assert any(expected in p for p in scheduler_config_problems(cfg))


def test_two_binders_rejected() -> None:
    cfg = _scheduler_config()
    cfg["extenders"].append(dict(cfg["extenders"][0], managedResources=[]))
    assert "only one extender can implement bind" in scheduler_config_problems(cfg)


# ---- the extender's own config and command line -----------------------------------------------------


def load_settings_from_configmap(tmp: Path | None = None):  # type: ignore[no-untyped-def]
    import tempfile

    cm = _find("ConfigMap", "vramfit-config")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(cm["data"]["config.yaml"])
    return load_settings(fh.name)


def test_extender_configmap_loads() -> None:
    s = load_settings_from_configmap()
    assert s.url_prefix == "/vramfit"
    assert s.relax_tenancy is False
    assert s.dra == "auto" and s.dra_device_classes == ["gpu.nvidia.com", "mig.nvidia.com"]


def test_extender_deployment_args_parse_with_serve_parser() -> None:
    dep = _find("Deployment", "vramfit")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "serve"
    ns = build_serve_parser().parse_args(args[1:])
    assert ns.signing_key == "/etc/vramfit/signing/key"
    assert ns.in_cluster is True and ns.port == 8888 and ns.config == "/etc/vramfit/config.yaml"
    assert ns.client_ca and ns.tls_cert and ns.webhook_port == 8443 and ns.health_port == 8081
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert ports["health"] == ns.health_port and ports["webhook"] == ns.webhook_port
    # HA: two replicas with leader election, a rolling update that never drops below one, and a PDB.
    assert dep["spec"]["replicas"] >= 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert ns.leader_elect is True and ns.lease_name == "vramfit-extender"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    pdb = _find("PodDisruptionBudget", "vramfit")
    assert pdb["spec"]["minAvailable"] == 1


# ---- example pods ------------------------------------------------------------------------------------


def _example_tenancy() -> Tenancy:
    """The examples' Namespaces, as an admin would apply them."""
    return Tenancy.from_objects([d for p, d in DOCS if p.startswith("manifests/examples/") and d["kind"] == "Namespace"])


def test_example_pods_parse_with_the_core() -> None:
    tenancy = _example_tenancy()
    llm = pod_demand(_find("Pod", "llm-7b-inference"), tenancy)
    assert llm is not None and llm.vram_mib == 14 * 1024 and llm.gpu_count == 1
    assert llm.tenant == "team-search"  # the Namespace's label; the pod names none
    mps = pod_demand(_find("Pod", "embeddings-mps"), tenancy)
    assert mps is not None and mps.isolation is Isolation.PROCESS and mps.tenant == "team-recsys"
    hw = pod_demand(_find("Pod", "finetune-isolated"), tenancy)
    assert hw is not None and hw.isolation is Isolation.HARDWARE and hw.models
    # Without its Namespace's annotation the MPS pod's tenant label is refused: the tenant is the admin's call.
    with pytest.raises(InputError, match=r"metadata.labels\[vramfit.io/tenant\]"):
        pod_demand(_find("Pod", "embeddings-mps"))


def test_example_pods_pass_the_trust_policy() -> None:
    from k8s_cel import request, run_policy

    policy = _find("ValidatingAdmissionPolicy", "vramfit-trust")
    namespaces = {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == "Namespace"}
    for name in ("llm-7b-inference", "embeddings-mps", "finetune-isolated"):
        obj = _find("Pod", name)
        ns = obj["metadata"]["namespace"]
        namespace = namespaces.get(ns, {"metadata": {"name": ns}})
        out = run_policy(policy, obj=obj, old=None, req=request("CREATE", namespace=ns), namespace=namespace)
        assert out.denied == [], (name, out)


def test_the_signing_key_is_not_published_in_manifests() -> None:
    """A key in manifests/ would sign for anyone who reads the repository: the README has the operator make it."""
    assert not [d for _, d in DOCS if d["kind"] == "Secret"]
    for kind, name in (("Deployment", "vramfit"), ("DaemonSet", "vramfit-node")):
        spec = _find(kind, name)["spec"]["template"]["spec"]
        secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        assert "vramfit-signing" in secrets
        assert "--signing-key=/etc/vramfit/signing/key" in spec["containers"][0]["args"]
    readme = (MANIFESTS / "README.md").read_text()
    assert "kubectl -n vramfit-system create secret generic vramfit-signing" in readme
    for name in ("llm-7b-inference", "embeddings-mps", "finetune-isolated"):
        assert _find("Pod", name)["spec"]["schedulerName"] == "vramfit-scheduler"
