"""`vramfit node`: the node agent (DaemonSet on vramfit GPU nodes).

Reads the GPUs through NVML (read-only) or `--inventory-file`, publishes them as the node annotation
`vramfit.io/gpus`, serves the kubelet device plugin for `vramfit.io/gpu` in `--device-plugin-dir`, answers
each Allocate with the units the extender booked for the pod being admitted, runs one MPS control daemon
per MPS GPU, and compares its answers with the kubelet's pod-resources view.

Allocate believes only assignments signed with `--signing-key` (the key `vramfit serve` signs its Bindings
with); without one the agent does not start unless `--allow-unsigned-assignments` (INSECURE: single tenant or
dry run only) says so.

Dry run (no API server, no GPU):
  vramfit node --node-name NAME --inventory-file GPUS.json --snapshot CLUSTER.yaml --device-plugin-dir DIR \
    --signing-key KEYFILE
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, set from the downward API)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--kubeconfig", metavar="PATH", help="talk to the cluster of this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="talk to the cluster this pod runs in")
    source.add_argument("--snapshot", metavar="FILE",
                        help="dry run: pods from this file (kubectl get pods -A -o yaml); nothing is written")
    parser.add_argument("--inventory-file", metavar="GPUS.json",
                        help="the GPUs as a vramfit.io/gpus annotation value (JSON list with uuids) instead of NVML")
    parser.add_argument("--config", metavar="FILE", help="agent config (modes per GPU, MPS, device list strategy); "
                                                          "see nodeagent/config.py")
    parser.add_argument("--signing-key", metavar="PATH",
                        help="the shared key file vramfit serve signs assignments with (one key per line; config "
                             "key signing_key_file); Allocate believes only assignments signed with it")
    parser.add_argument("--allow-unsigned-assignments", action="store_true",
                        help="INSECURE: without a signing key, believe any pod's vramfit.io/assignment (config "
                             "key allow_unsigned; single tenant or dry run only)")
    parser.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR,
                        help=f"kubelet device plugin directory (default {DEFAULT_PLUGIN_DIR})")
    parser.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES,
                        help=f"kubelet pod-resources socket (default {DEFAULT_POD_RESOURCES}; '' turns it off)")
    parser.add_argument("--mps-control", default="nvidia-cuda-mps-control", metavar="PATH",
                        help="the MPS control executable (default nvidia-cuda-mps-control)")
    parser.add_argument("--state-dir", default="/var/lib/vramfit", metavar="DIR",
                        help="where the agent keeps its Allocate ledger across restarts ('' = memory only)")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of /metrics and /healthz")
    parser.add_argument("--metrics-port", type=int, default=9401, help="port of /metrics and /healthz (0 = off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def add_node_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("node", help="run the node agent (NVML inventory, device plugin, MPS daemons)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(parser)
    parser.set_defaults(func=run_node)
    return parser


def load_trust(args: argparse.Namespace, config: Any) -> Any:
    """Whose assignments Allocate believes; raises ValueError (one line naming the flag or the file)."""
    from nodeagent.allocate import Trust
    from packing.k8s.trust import SigningKeys
    from packing.model import InputError

    path = getattr(args, "signing_key", None) or config.signing_key_file
    if path:
        try:
            return Trust(keys=SigningKeys.from_file(path))
        except InputError as err:
            raise ValueError(f"--signing-key / signing_key_file: {err}") from None
    if getattr(args, "allow_unsigned_assignments", False) or config.allow_unsigned:
        return Trust(keys=None, allow_unsigned=True)
    raise ValueError("no signing key: pass --signing-key PATH (config key signing_key_file), the key file vramfit "
                     "serve signs assignments with; --allow-unsigned-assignments (config key allow_unsigned) "
                     "turns the check off, INSECURE, single tenant or dry run only")


def build_agent(args: argparse.Namespace) -> Any:
    """The agent for these arguments (not started); raises ValueError with a user-facing message."""
    from nodeagent.agent import AgentOptions, NodeAgent
    from nodeagent.config import load_config
    from nodeagent.inventory import FileInventory, NvmlInventory
    from nodeagent.pods import ApiPods, SnapshotPods
    from nodeagent.publish import KubePublisher, LogPublisher

    if not args.node_name:
        raise ValueError("--node-name is required (or set NODE_NAME)")
    config = load_config(args.config)
    trust = load_trust(args, config)
    inventory: Any = (FileInventory(args.inventory_file) if args.inventory_file
                      else NvmlInventory(config, args.node_name))
    if args.snapshot:
        pods: Any = SnapshotPods(args.snapshot, args.node_name)
        publisher: Any = LogPublisher()
    else:
        from extender.kube import api_client

        api = api_client(args.kubeconfig, in_cluster=args.in_cluster)
        api.user_agent = "vramfit-node/0.1"
        pods = ApiPods(api, args.node_name).start()
        publisher = KubePublisher(api, args.node_name)
    options = AgentOptions(node_name=args.node_name, plugin_dir=args.device_plugin_dir,
                           pod_resources_socket=args.pod_resources_socket or None,
                           mps_control=args.mps_control, state_dir=args.state_dir or None, trust=trust)
    return NodeAgent(options, config, inventory, pods, publisher)


def run_node(args: argparse.Namespace) -> int:
    from nodeagent.metrics import serve_http

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent = build_agent(args)
        agent.start()
    except Exception as err:  # noqa: BLE001 - config, inventory and API errors end the command plainly
        print(f"vramfit node: {err}", file=sys.stderr)
        return 2
    if args.metrics_port:
        serve_http(agent.metrics, args.metrics_host, args.metrics_port, agent.plugin.registered.is_set)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    agent.stop()
    return 0
