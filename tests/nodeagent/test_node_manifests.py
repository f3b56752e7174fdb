"""manifests/50-node-agent.yaml: the DaemonSet runs what `vramfit node` accepts, with least privilege."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from nodeagent.cli import add_node_parser
from nodeagent.config import AgentConfig

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "50-node-agent.yaml"
DOCS = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _daemonset() -> dict[str, Any]:
    return DOCS[("DaemonSet", "vramfit-node")]


def test_daemonset_args_parse_with_the_node_parser() -> None:
    container = _daemonset()["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    add_node_parser(parser.add_subparsers())
    args = parser.parse_args(container["args"])
    assert args.in_cluster and args.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    assert Path(args.config).parent.as_posix() in mounted
    assert Path(args.pod_resources_socket).parent.as_posix() in mounted
    assert args.state_dir in mounted
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_agent_gets_the_signing_key_from_the_secret_read_only() -> None:
    """Without a key the agent does not start; the chart mounts Secret <fullname>-signing (data key `key`)."""
    container = _daemonset()["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    add_node_parser(parser.add_subparsers())
    args = parser.parse_args(container["args"])
    config = AgentConfig.model_validate(yaml.safe_load(DOCS[("ConfigMap", "vramfit-node-config")]["data"]["config.yaml"]))
    assert not args.allow_unsigned_assignments and not config.allow_unsigned
    assert (args.signing_key or config.signing_key_file) == "/etc/vramfit/signing/key"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/vramfit/signing")
    assert mount["readOnly"] is True
    volume = next(v for v in _daemonset()["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "vramfit-signing"
    assert {i["key"] for i in volume["secret"].get("items") or [{"key": "key"}]} == {"key"}


def test_only_the_host_paths_the_agent_uses_and_pod_resources_read_only() -> None:
    spec = _daemonset()["spec"]["template"]["spec"]
    host = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/run/nvidia/mps",
                    "/run/nvidia/mps/shm", "/var/lib/vramfit"}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True
    assert spec["nodeSelector"] == {"vramfit.io/node": "true"}
    sc = spec["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert "privileged" not in sc


def test_node_agent_rbac_reads_pods_and_writes_only_node_annotations_and_events() -> None:
    role = DOCS[("ClusterRole", "vramfit-node")]
    granted = {(res, verb) for r in role["rules"] for res in r["resources"] for verb in r["verbs"]}
    assert granted == {("pods", "list"), ("pods", "watch"), ("nodes", "patch"), ("events", "create")}
    binding = DOCS[("ClusterRoleBinding", "vramfit-node")]
    assert binding["subjects"][0]["name"] == _daemonset()["spec"]["template"]["spec"]["serviceAccountName"]


def test_shipped_agent_config_loads() -> None:
    text = DOCS[("ConfigMap", "vramfit-node-config")]["data"]["config.yaml"]
    config = AgentConfig.model_validate(yaml.safe_load(text))
    assert config.mode_for("any", 0, None).mode == "exclusive"
    assert config.mps.root == "/run/nvidia/mps"
