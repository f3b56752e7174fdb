"""charts/vramfit with the real helm binary (tests/helm_binary.py): lint, render with default and non-default
values, every rendered object validated strictly against the Kubernetes 1.31 schemas, values.schema.json
enforced, manifests/ equal to a fresh render (one source), and the Grafana dashboard querying only metrics
the code exports."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from extender.config import load_settings
from nodeagent.config import AgentConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vramfit"
MANIFESTS = ROOT / "manifests"
K8S_VERSION = "1.31.0"
NAMESPACE = "vramfit-system"
# CRD kinds: kubernetes-validate ships only Kubernetes' own schemas. These groups, and only these, are skipped.
CRD_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")

# The one value the chart cannot default (the API server's source addresses): every render here sets it.
API_SERVER = {"networkPolicy": {"apiServerCIDRs": ["192.168.10.11/32", "192.168.10.12/32"]}}
KONNECTIVITY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}}

CUSTOM = {
    "certManager": {"enabled": False},
    "signing": {"existingSecret": "my-signing-keys"},
    "networkPolicy": {"apiServerCIDRs": ["172.16.0.0/28"], "apiServerPeers": [KONNECTIVITY]},
    "tls": {"existingSecret": "my-serving-tls", "schedulerClientSecret": "my-scheduler-client-tls",
            "caBundle": "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ=="},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                "dashboard": {"enabled": True, "namespace": "monitoring"}},
    "extender": {"replicas": 3, "config": {"policy": "best-fit", "relax_tenancy": True, "url_prefix": "/x"},
                 "extraArgs": ["--log-level=debug"]},
    "image": {"repository": "registry.example.com/gpu/vramfit", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "scheduler": {"image": {"tag": "v1.30.8"}, "extenderWeight": 2},
    # null drops the default's key (helm merges maps)
    "nodeAgent": {"nodeSelector": {"vramfit.io/node": None, "node-role.example.com/gpu": "a100"},
                  "config": {"default": {"mode": "timeslice", "replicas": 4}, "device_list_strategy": "cdi"}},
}


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/vramfit-helm-cache"})
    if check and out.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def render(helm: Path, values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "vramfit", str(CHART), "--namespace", NAMESPACE, "--kube-version", K8S_VERSION, *extra]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump({**API_SERVER, **(values or {})}, fh)
    try:
        out = run_helm(helm, *args, "--values", fh.name)
    finally:
        os.unlink(fh.name)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} {name} rendered")


def schema_problems(docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(validation errors, skipped CRD kinds) of every rendered object."""
    errors, skipped = [], []
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        if d["apiVersion"].startswith(CRD_GROUPS):
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
            skipped.append(where)
            continue
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {exc.message} at {list(exc.path)}")
    return errors, skipped


# ---- lint ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_helm_lint(helm: Path, strict: bool) -> None:
    out = run_helm(helm, "lint", str(CHART), *(["--strict"] if strict else []),
                   "--set", "networkPolicy.apiServerCIDRs={192.168.10.11/32}")
    assert "0 chart(s) failed" in out.stdout


def test_helm_lint_strict_with_custom_values(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(CUSTOM))
    out = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(values))
    assert "0 chart(s) failed" in out.stdout


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["version"], chart["appVersion"]) == ("v2", "0.1.0", "0.1.0")


# ---- default values ------------------------------------------------------------------------------------------


def test_default_render_validates_strictly(helm: Path) -> None:
    docs = render(helm, {"namespace": {"create": True}})
    errors, skipped = schema_problems(docs)
    assert errors == []
    assert sorted(skipped) == ["Certificate/vramfit-ca", "Certificate/vramfit-scheduler-client",
                               "Certificate/vramfit-webhook", "Issuer/vramfit-ca", "Issuer/vramfit-selfsigned"]


def test_default_render_installs_what_manifests_install(helm: Path) -> None:
    docs = render(helm)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("ServiceAccount", "vramfit"), ("ClusterRole", "vramfit-extender"), ("ClusterRoleBinding", "vramfit-extender"),
        ("ClusterRole", "vramfit-extender-dra"), ("ClusterRoleBinding", "vramfit-extender-dra"),
        ("Role", "vramfit-extender-leader"), ("RoleBinding", "vramfit-extender-leader"),
        ("ConfigMap", "vramfit-config"), ("Deployment", "vramfit"), ("Service", "vramfit"),
        ("PodDisruptionBudget", "vramfit"), ("NetworkPolicy", "vramfit"),
        ("MutatingWebhookConfiguration", "vramfit"),
        ("Issuer", "vramfit-selfsigned"), ("Certificate", "vramfit-ca"), ("Issuer", "vramfit-ca"),
        ("Certificate", "vramfit-webhook"), ("Certificate", "vramfit-scheduler-client"),
        ("ServiceAccount", "vramfit-scheduler"), ("ClusterRoleBinding", "vramfit-scheduler-as-kube-scheduler"),
        ("ClusterRoleBinding", "vramfit-scheduler-as-volume-scheduler"),
        ("RoleBinding", "vramfit-scheduler-auth-reader"), ("Role", "vramfit-scheduler-lease"),
        ("RoleBinding", "vramfit-scheduler-lease"), ("ConfigMap", "vramfit-scheduler-config"),
        ("Deployment", "vramfit-scheduler"),
        ("ServiceAccount", "vramfit-node"), ("ClusterRole", "vramfit-node"), ("ClusterRoleBinding", "vramfit-node"),
        ("ConfigMap", "vramfit-node-config"), ("DaemonSet", "vramfit-node"),
        ("Secret", "vramfit-signing"),
        ("ValidatingAdmissionPolicy", "vramfit-trust"), ("ValidatingAdmissionPolicyBinding", "vramfit-trust"),
    }  # the Namespace only with namespace.create (helm install --create-namespace makes it otherwise)
    assert ("Namespace", NAMESPACE) in {(d["kind"], d["metadata"]["name"]) for d in render(helm, {"namespace": {"create": True}})}
    dep = find(docs, "Deployment", "vramfit")
    assert dep["spec"]["replicas"] == 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/vramfit/vramfit:0.1.0"  # appVersion
    hook = find(docs, "MutatingWebhookConfiguration", "vramfit")
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/vramfit-webhook"


def test_manifests_are_the_charts_fresh_render(helm: Path, tmp_path: Path) -> None:
    """manifests/ is generated (scripts/render-manifests.sh): it cannot drift from the chart."""
    out = subprocess.run([str(ROOT / "scripts" / "render-manifests.sh"), str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "HELM": str(helm)})
    assert out.returncode == 0, out.stderr
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.yaml")}
    committed = {p.name: p.read_text() for p in MANIFESTS.glob("*.yaml")}
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"manifests/ differs from the chart in {stale}: run scripts/render-manifests.sh"
    assert (MANIFESTS / "README.md").exists() and any((MANIFESTS / "examples").glob("*.yaml"))


# ---- non-default values --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def custom(helm: Path) -> list[dict[str, Any]]:
    return render(helm, CUSTOM)


def test_custom_render_validates_strictly(custom: list[dict[str, Any]]) -> None:
    errors, skipped = schema_problems(custom)
    assert errors == []
    assert sorted(skipped) == ["PodMonitor/vramfit-node", "ServiceMonitor/vramfit"]


def test_custom_render_without_cert_manager_uses_the_existing_secrets(custom: list[dict[str, Any]]) -> None:
    assert not [d for d in custom if d["apiVersion"].startswith("cert-manager.io/")]
    hook = find(custom, "MutatingWebhookConfiguration", "vramfit")
    assert "cert-manager.io/inject-ca-from" not in (hook["metadata"].get("annotations") or {})
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == CUSTOM["tls"]["caBundle"]
    dep = find(custom, "Deployment", "vramfit")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "my-serving-tls"
    sched = find(custom, "Deployment", "vramfit-scheduler")
    volumes = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
    assert volumes["extender-client-tls"]["secret"]["secretName"] == "my-scheduler-client-tls"


def test_custom_render_replicas_image_selector_and_config(custom: list[dict[str, Any]], tmp_path: Path) -> None:
    dep = find(custom, "Deployment", "vramfit")
    assert dep["spec"]["replicas"] == 3
    spec = dep["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "registry.example.com/gpu/vramfit:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always" and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["args"][-1] == "--log-level=debug"
    ds = find(custom, "DaemonSet", "vramfit-node")
    ds_spec = ds["spec"]["template"]["spec"]
    assert ds_spec["nodeSelector"] == {"node-role.example.com/gpu": "a100"}
    assert ds_spec["containers"][0]["image"] == container["image"]
    sched = find(custom, "Deployment", "vramfit-scheduler")
    assert sched["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.k8s.io/kube-scheduler:v1.30.8"
    # The configs the chart writes load with the programs' own strict loaders.
    cfg = tmp_path / "config.yaml"
    cfg.write_text(find(custom, "ConfigMap", "vramfit-config")["data"]["config.yaml"])
    settings = load_settings(str(cfg))
    assert (settings.policy, settings.relax_tenancy, settings.url_prefix) == ("best-fit", True, "/x")
    agent = AgentConfig.model_validate(yaml.safe_load(find(custom, "ConfigMap", "vramfit-node-config")["data"]["config.yaml"]))
    assert agent.mode_for("n", 0, None).mode == "timeslice" and agent.device_list_strategy == "cdi"
    sched_cfg = yaml.safe_load(find(custom, "ConfigMap", "vramfit-scheduler-config")["data"]["scheduler-config.yaml"])
    (ext,) = sched_cfg["extenders"]
    assert ext["urlPrefix"] == f"https://vramfit.{NAMESPACE}.svc:8888/x" and ext["weight"] == 2


def test_custom_render_monitoring(custom: list[dict[str, Any]]) -> None:
    sm = find(custom, "ServiceMonitor", "vramfit")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    svc = find(custom, "Service", "vramfit")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    pm = find(custom, "PodMonitor", "vramfit-node")
    ds = find(custom, "DaemonSet", "vramfit-node")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    dash = find(custom, "ConfigMap", "vramfit-dashboard")
    assert dash["metadata"]["namespace"] == "monitoring" and dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["vramfit.json"]) == json.loads((CHART / "dashboards" / "vramfit.json").read_text())


def test_one_replica_renders_no_pdb_that_would_block_drains(helm: Path) -> None:
    docs = render(helm, {"extender": {"replicas": 1}})
    assert "PodDisruptionBudget" not in {d["kind"] for d in docs}


# ---- values.schema.json --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({"extender": {"replicas": "two"}}, "/extender/replicas"),
    ({"extender": {"replicas": 0}}, "/extender/replicas"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
    ({"scheduler": {"httpTimeout": 10}}, "/scheduler/httpTimeout"),
    ({"nodeAgent": {"config": {"default": {"mode": "shared"}}}}, "/nodeAgent/config/default/mode"),
    ({"replicas": 2}, "replicas"),  # a typo'd top-level key
    ({"extender": {"config": {"plan_cpus": [1]}}}, "/extender/config/plan_cpus"),
    ({"extender": {"config": {"plan_cpus": -1}}}, "/extender/config/plan_cpus"),
    ({"networkPolicy": {"apiServerCIDRs": ["10.0.0.1"]}}, "/networkPolicy/apiServerCIDRs/0"),
    ({"networkPolicy": {"apiServerPeers": [{"pods": {}}]}}, "/networkPolicy/apiServerPeers/0"),
    ({"networkPolicy": {"apiServerCidrs": []}}, "apiServerCidrs"),
    ({"signing": {"existingSecret": "My Keys"}}, "/signing/existingSecret"),
    # the extender's and the agent's config files: what would render and then crash-loop (issue 27.8)
    ({"extender": {"config": {"policy": "best_fit"}}}, "'best-fit', 'first-fit'"),
    ({"extender": {"config": {"polcy": "best-fit"}}}, "additional properties 'polcy' not allowed"),
    ({"extender": {"config": {"policy": "vramfit", "policy_params": {"lamda": 1}}}}, "invalid propertyName 'lamda'"),
    ({"extender": {"config": {"policy": "best-fit", "policy_params": {"lam": 1}}}}, "policy_params"),
    ({"extender": {"config": {"policy": "frag-dual"}}}, "/extender/config/policy"),  # a benchmark's variant
    ({"extender": {"config": {"admission_wait_s": -1}}}, "/extender/config/admission_wait_s"),
    ({"extender": {"config": {"plan_max_pods": 0}}}, "/extender/config/plan_max_pods"),
    ({"nodeAgent": {"config": {"default": {"mode": "timeslice"}}}}, "missing property 'replicas'"),
    ({"nodeAgent": {"config": {"default": {"mode": "timeslice", "replicas": 1}}}}, "/nodeAgent/config/default/replicas"),
    ({"nodeAgent": {"config": {"default": {"mode": "exclusive", "replicas": 4}}}}, "/nodeAgent/config/default/replicas"),
    ({"nodeAgent": {"config": {"gpus": [{"match": "1", "mode": "timeslice"}]}}}, "missing property 'replicas'"),
    ({"nodeAgent": {"config": {"gpus": [{"mode": "mps"}]}}}, "missing property 'match'"),
    ({"nodeAgent": {"config": {"nodes": {"n1": {"default": {"mode": "timeslice"}}}}}}, "/nodeAgent/config/nodes/n1"),
    ({"nodeAgent": {"config": {"nodes": {"n1": {"defaults": {}}}}}}, "additional properties 'defaults'"),
    ({"nodeAgent": {"config": {"mps": {"active_thread_percentage": 0}}}}, "/nodeAgent/config/mps"),
    ({"nodeAgent": {"config": {"device_list_strategy": "volumes"}}}, "/nodeAgent/config/device_list_strategy"),
    ({"nodeAgent": {"config": {"open_runtime": "ignore"}}}, "/nodeAgent/config/open_runtime"),
    ({"nodeAgent": {"config": {"nvidia_runtime_config": "config.toml"}}}, "/nodeAgent/config/nvidia_runtime_config"),
    ({"nodeAgent": {"config": {"publish_interval": 30}}}, "additional properties 'publish_interval' not allowed"),
    ({"namespace": {"checkPodSecurity": "yes"}}, "/namespace/checkPodSecurity"),
    ({"extender": {"config": {"dra": "yes"}}}, "/extender/config/dra"),
    ({"extender": {"config": {"dra_device_classes": ["GPU.nvidia.com"]}}}, "/extender/config/dra_device_classes/0"),
    ({"extender": {"config": {"dra_device_classes": "gpu.nvidia.com"}}}, "/extender/config/dra_device_classes"),
    ({"extender": {"config": {"dra_batch_window_s": 10}}}, "/extender/config/dra_batch_window_s"),
    ({"extender": {"config": {"dra_batch_max_pods": 0}}}, "/extender/config/dra_batch_max_pods"),
])
def test_schema_rejects_bad_values(helm: Path, tmp_path: Path, values: dict[str, Any], message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(helm, "template", "vramfit", str(CHART), "--values", str(path), check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def _config_schemas() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]
    return (props["extender"]["properties"]["config"], props["nodeAgent"]["properties"]["config"],
            schema["definitions"])


def test_the_schema_names_exactly_the_config_files_keys() -> None:
    """values.schema.json checks the two config files key for key: it cannot drift from the programs' models."""
    from extender.config import Settings
    from nodeagent.config import GpuOverride, ModeSpec, MpsSettings, NodeSection

    extender, agent, defs = _config_schemas()
    assert extender["additionalProperties"] is False and agent["additionalProperties"] is False
    assert set(extender["properties"]) == set(Settings.model_fields)
    assert set(agent["properties"]) == set(AgentConfig.model_fields)
    for name, model in (("modeSpec", ModeSpec), ("gpuOverride", GpuOverride), ("nodeSection", NodeSection)):
        assert defs[name]["additionalProperties"] is False and set(defs[name]["properties"]) == set(model.model_fields)
    assert set(agent["properties"]["mps"]["properties"]) == set(MpsSettings.model_fields)


def test_the_schemas_policies_and_their_parameters_are_the_registrys() -> None:
    from packing.policies.registry import _REGISTRY, core_policy_names

    # The core's own policies: a benchmark imported earlier in the run registers its own beside them.
    core = {name: _REGISTRY[name] for name in core_policy_names()}
    extender, _, _ = _config_schemas()
    assert extender["properties"]["policy"]["enum"] == list(core)
    allowed: dict[str, set[str]] = {}
    for rule in extender["allOf"]:
        params = rule["then"]["properties"]["policy_params"]
        names = set(params["propertyNames"]["enum"]) if "propertyNames" in params else set()
        assert "propertyNames" in params or params["additionalProperties"] is False
        for policy in rule["if"]["properties"]["policy"]["enum"]:
            assert policy not in allowed
            allowed[policy] = names
    assert allowed == {name: set(entry.param_names()) for name, entry in core.items()}


@pytest.mark.parametrize("config", [
    {"nodeAgent": {"config": {"default": {"mode": "mps"}, "gpus": [{"match": "GPU-1", "mode": "timeslice",
                                                                   "replicas": 4}],
                              "nodes": {"n1": {"default": {"mode": "mps", "replicas": 2}}},
                              "mps": {"active_thread_percentage": 50}, "signing_key_file": "/k"}}},
    {"extender": {"config": {"policy": "vramfit", "policy_params": {"resolve": 32}, "admission_wait_s": 8,
                             "plan_max_pods": 10, "allow_unsigned": False}}},
    {"extender": {"config": {"admission_wait_s": 28}}, "scheduler": {"httpTimeout": "30s"}},
    {"extender": {"config": {"dra": False, "dra_device_classes": []}}},
    {"extender": {"config": {"dra": True, "dra_device_classes": ["gpu.nvidia.com", "a100.example.com"],
                             "dra_batch_window_s": 0, "dra_batch_max_pods": 50}}},
])
def test_good_config_values_render(helm: Path, tmp_path: Path, config: dict[str, Any]) -> None:
    docs = render(helm, config)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(find(docs, "ConfigMap", "vramfit-config")["data"]["config.yaml"])
    load_settings(str(cfg))
    AgentConfig.model_validate(yaml.safe_load(find(docs, "ConfigMap", "vramfit-node-config")["data"]["config.yaml"]))


@pytest.mark.parametrize(("values", "says"), [
    ({"extender": {"config": {"admission_wait_s": 9}}}, "extender.config.admission_wait_s (9 s) must be at most "
                                                        "scheduler.httpTimeout (10s) minus 2 s"),
    ({"scheduler": {"httpTimeout": "6500ms"}}, "extender.config.admission_wait_s (5 s) must be at most "
                                               "scheduler.httpTimeout (6500ms)"),
    ({"extender": {"config": {"admission_wait_s": 59}}, "scheduler": {"httpTimeout": "1m"}}, "(1m) minus 2 s"),
])
def test_a_bind_wait_past_kube_schedulers_timeout_is_refused(helm: Path, tmp_path: Path, values: dict[str, Any],
                                                             says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**API_SERVER, **values}))
    out = run_helm(helm, "template", "vramfit", str(CHART), "--values", str(path), "--kube-version", K8S_VERSION,
                   check=False)
    assert out.returncode != 0 and says in out.stderr, out.stderr
    assert len([line for line in out.stderr.splitlines() if "admission_wait_s" in line]) == 1


def test_the_chart_refuses_a_cluster_without_match_conditions(helm: Path) -> None:
    out = run_helm(helm, "template", "vramfit", str(CHART), "--kube-version", "1.29.9", check=False)
    assert out.returncode != 0 and "kubeVersion" in out.stderr


def test_the_api_servers_addresses_are_required(helm: Path) -> None:
    """No default admits the webhook port from a guess: the render fails and says what to set."""
    out = run_helm(helm, "template", "vramfit", str(CHART), "--kube-version", K8S_VERSION, check=False)
    assert out.returncode != 0 and "networkPolicy.apiServerCIDRs" in out.stderr and "per distribution" in out.stderr


# ---- trust: the signing key, its mounts and flags, the NetworkPolicy ---------------------------------------


def _pod_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return find(docs, kind, name)["spec"]["template"]["spec"]


def _signing_mounts(spec: dict[str, Any]) -> tuple[str, dict[str, Any], list[str]]:
    """(the mounted Secret's name, the volume, the container's args) for the signing key."""
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/vramfit/signing"]
    assert mount["readOnly"] is True and "subPath" not in mount
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return volume["secret"]["secretName"], volume, container["args"]


def test_the_signing_key_is_a_secret_mounted_in_the_extender_and_the_node_agent(helm: Path) -> None:
    docs = render(helm)
    secret = find(docs, "Secret", "vramfit-signing")
    assert secret["metadata"]["namespace"] == NAMESPACE and secret["type"] == "Opaque"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # bound pods' signatures
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert len(key) == 64 and key.isalnum()
    assert base64.b64decode(find(render(helm), "Secret", "vramfit-signing")["data"]["key"]).decode() != key
    for kind, name in (("Deployment", "vramfit"), ("DaemonSet", "vramfit-node")):
        spec = _pod_spec(docs, kind, name)
        secret_name, volume, args = _signing_mounts(spec)
        assert secret_name == "vramfit-signing"
        assert "--signing-key=/etc/vramfit/signing/key" in args
        assert volume["secret"]["defaultMode"] in (0o440, 0o400)
    # The extender runs as 65532: the key's group is its fsGroup, so 0440 is readable by it alone.
    extender = _pod_spec(docs, "Deployment", "vramfit")
    assert extender["securityContext"]["fsGroup"] == extender["securityContext"]["runAsUser"] == 65532
    (container,) = extender["containers"]
    config = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert (config["mountPath"], config["subPath"]) == ("/etc/vramfit/config.yaml", "config.yaml")
    assert "--config=/etc/vramfit/config.yaml" in container["args"]


def test_an_existing_signing_secret_is_mounted_and_none_is_made(custom: list[dict[str, Any]]) -> None:
    assert not [d for d in custom if d["kind"] == "Secret"]
    for kind, name in (("Deployment", "vramfit"), ("DaemonSet", "vramfit-node")):
        assert _signing_mounts(_pod_spec(custom, kind, name))[0] == "my-signing-keys"


def _ingress_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """port -> the `from` peers that may reach it (None: any source)."""
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["port"] not in out
            out[port["port"]] = rule.get("from")
    return out


def test_network_policy_admits_the_webhook_from_the_api_server_only(helm: Path, custom: list[dict[str, Any]]) -> None:
    ports = _ingress_by_port(find(render(helm), "NetworkPolicy", "vramfit"))
    assert ports[8443] == [{"ipBlock": {"cidr": "192.168.10.11/32"}}, {"ipBlock": {"cidr": "192.168.10.12/32"}}]
    assert ports[8888] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vramfit-scheduler"}}}]
    assert ports[8081] is None  # kubelet probes and Prometheus
    custom_ports = _ingress_by_port(find(custom, "NetworkPolicy", "vramfit"))
    assert custom_ports[8443] == [{"ipBlock": {"cidr": "172.16.0.0/28"}}, KONNECTIVITY]
    only_peers = render(helm, {"networkPolicy": {"apiServerCIDRs": [], "apiServerPeers": [KONNECTIVITY]}})
    assert _ingress_by_port(find(only_peers, "NetworkPolicy", "vramfit"))[8443] == [KONNECTIVITY]
    # The ports are the ones the extender listens on.
    (container,) = _pod_spec(custom, "Deployment", "vramfit")["containers"]
    assert {p["containerPort"] for p in container["ports"]} == set(custom_ports)


def test_the_trust_policy_binds_the_extenders_service_account_of_this_release(helm: Path) -> None:
    docs = render(helm, {}, "--namespace", "gpu-system")
    policy = find(docs, "ValidatingAdmissionPolicy", "vramfit-trust")
    (is_extender,) = [v for v in policy["spec"]["variables"] if v["name"] == "isExtender"]
    assert "'system:serviceaccount:gpu-system:vramfit'" in is_extender["expression"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "vramfit-trust")
    assert binding["spec"] == {"policyName": "vramfit-trust", "validationActions": ["Deny"]}
    sa = find(docs, "ServiceAccount", "vramfit")
    assert sa["metadata"]["namespace"] == "gpu-system"
    assert find(docs, "Deployment", "vramfit")["spec"]["template"]["spec"]["serviceAccountName"] == "vramfit"


def test_without_cert_manager_the_secrets_are_required(helm: Path) -> None:
    out = run_helm(helm, "template", "vramfit", str(CHART), "--set", "certManager.enabled=false",
                   "--set", "networkPolicy.apiServerCIDRs={10.1.0.0/16}", check=False)
    assert out.returncode != 0 and "is required when certManager.enabled is false" in out.stderr


# ---- the Grafana dashboard -----------------------------------------------------------------------------------

SERIES_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported_metric_names() -> set[str]:
    """Every vramfit_* metric family name written as a string in the code of the extender and the agent."""
    names: set[str] = set()
    for package in ("extender", "nodeagent", "vramfit"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"""["'](vramfit_[a-z0-9_]+)["']""", path.read_text()))
    return names


def dashboard_series() -> set[str]:
    dash = json.loads((CHART / "dashboards" / "vramfit.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    assert exprs
    return {m for e in exprs for m in re.findall(r"\bvramfit_[a-z0-9_]+", e)}


def test_dashboard_queries_only_exported_metrics() -> None:
    exported = exported_metric_names()
    assert "vramfit_request_duration_seconds" in exported  # the grep finds the code's names
    missing = []
    for series in sorted(dashboard_series()):
        family = next((series.removesuffix(s) for s in SERIES_SUFFIXES if series.endswith(s)
                       and series.removesuffix(s) in exported), series)
        if family not in exported:
            missing.append(series)
    assert missing == [], f"the dashboard queries series no code exports: {missing}"


def test_dashboard_covers_the_operators_questions() -> None:
    series = dashboard_series()
    for needed in ("vramfit_request_duration_seconds_bucket", "vramfit_binds_total", "vramfit_leader",
                   "vramfit_conflicted_pods", "vramfit_node_reconcile_divergences", "vramfit_node_mps_daemon_healthy"):
        assert needed in series
    assert any("free_vram" in s for s in series) and any("stranded_vram" in s for s in series)
    assert any(s.startswith("vramfit_node_allocations") for s in series)
    dash = json.loads((CHART / "dashboards" / "vramfit.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "vramfit"


# ---- DRA mode ------------------------------------------------------------------------------------------------


def _webhook_sends(docs: list[dict[str, Any]], obj: dict[str, Any]) -> bool:
    """Whether the API server calls the rendered webhook for this pod: its one matchCondition, as CEL."""
    from k8s_cel import evaluate

    (cond,) = find(docs, "MutatingWebhookConfiguration", "vramfit")["webhooks"][0]["matchConditions"]
    return evaluate(cond["expression"], {"object": obj, "oldObject": None}) is True


def _claim_pod(claims: list[dict[str, Any]] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}
    if claims is not None:
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


@pytest.mark.parametrize(("claims", "sent"), [
    ([{"name": "gpu", "resourceClaimTemplateName": "gpu-14gi"}], True),
    ([{"name": "gpu", "resourceClaimName": "shared-gpu"}], True),
    ([{"name": "nic", "resourceClaimTemplateName": "rdma"}, {"name": "gpu", "resourceClaimName": "g"}], True),
    ([], False),  # what the API server never hands over (omitempty), guarded all the same
    (None, False),
])
def test_the_webhook_is_sent_every_pod_with_resource_claims(helm: Path, claims: list[dict[str, Any]] | None,
                                                            sent: bool) -> None:
    """The webhook reads the claims (CEL cannot see a template's device class) and gates the pods asking for
    dra_device_classes: every pod with claims must reach it. With dra: false nothing changes for them."""
    assert _webhook_sends(render(helm), _claim_pod(claims)) is sent
    assert _webhook_sends(render(helm, {"extender": {"config": {"dra": True}}}), _claim_pod(claims)) is sent
    assert _webhook_sends(render(helm, {"extender": {"config": {"dra": False}}}), _claim_pod(claims)) is False


def test_the_dra_condition_leaves_the_other_pods_as_they_were(helm: Path) -> None:
    off, on = render(helm, {"extender": {"config": {"dra": False}}}), render(helm)
    vram = _claim_pod(None)
    vram["spec"]["containers"][0]["resources"] = {"limits": {"vramfit.io/vram": "14Gi"}}
    plain = _claim_pod(None)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    for obj, sent in ((vram, True), (plain, False)):
        assert _webhook_sends(off, obj) is sent and _webhook_sends(on, obj) is sent
    (cond_off,) = find(off, "MutatingWebhookConfiguration", "vramfit")["webhooks"][0]["matchConditions"]
    (cond_on,) = find(on, "MutatingWebhookConfiguration", "vramfit")["webhooks"][0]["matchConditions"]
    assert cond_on["expression"].startswith(cond_off["expression"] + " ||")  # one clause added, nothing changed


def test_dra_off_drops_the_dra_rbac(helm: Path) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render(helm, {"extender": {"config": {"dra": False}}})}
    assert ("ClusterRole", "vramfit-extender") in kinds
    assert not {k for k in kinds if k[1] == "vramfit-extender-dra"}
    docs = render(helm, {"extender": {"config": {"dra": True}}}, "--namespace", "gpu-system")
    binding = find(docs, "ClusterRoleBinding", "vramfit-extender-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vramfit", "namespace": "gpu-system"}]


def test_the_dra_values_reach_the_extenders_config(helm: Path, tmp_path: Path) -> None:
    values = {"extender": {"config": {"dra": True, "dra_device_classes": ["mig.nvidia.com"], "dra_batch_window_s": 0.2,
                                      "dra_batch_max_pods": 64}}}
    cfg = tmp_path / "config.yaml"
    cfg.write_text(find(render(helm, values), "ConfigMap", "vramfit-config")["data"]["config.yaml"])
    settings = load_settings(str(cfg))
    assert (settings.dra, settings.dra_device_classes, settings.dra_batch_window_s, settings.dra_batch_max_pods) == (
        True, ["mig.nvidia.com"], 0.2, 64)
    cfg.write_text(find(render(helm), "ConfigMap", "vramfit-config")["data"]["config.yaml"])
    from extender.config import Settings

    defaults = Settings()
    settings = load_settings(str(cfg))
    assert (settings.dra, settings.dra_device_classes, settings.dra_batch_window_s, settings.dra_batch_max_pods) == (
        defaults.dra, defaults.dra_device_classes, defaults.dra_batch_window_s, defaults.dra_batch_max_pods)
