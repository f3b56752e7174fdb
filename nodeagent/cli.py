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
    --signing-key KEYFILE [--state-dir DIR]
A dry run serves the device plugin in its own --device-plugin-dir (never the kubelet's) and writes nothing
else outside one directory: --state-dir, or a fresh temporary one (named at start) for its Allocate ledger
and MPS pipes. It never reads a real node's ledger or pod-resources socket.

Every bad flag, file or value ends the command with exit status 2 and one line naming it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # the imports themselves wait for the command that needs them (a fast --help)
    from nodeagent.config import AgentConfig
    from nodeagent.runtime_config import RuntimeVerdict

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_STATE_DIR = "/var/lib/vramfit"
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
T = TypeVar("T")
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes, the last a NUL

log = logging.getLogger("vramfit.node")


class FlagError(ValueError):
    """A bad flag, file or value: the message names it; the command ends with exit status 2."""


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, set from the downward API)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--kubeconfig", metavar="PATH", help="talk to the cluster of this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="talk to the cluster this pod runs in")
    source.add_argument("--snapshot", metavar="FILE",
                        help="dry run: pods from this file (kubectl get pods -A -o yaml); writes only in "
                             "--device-plugin-dir and --state-dir (default: a fresh temporary directory)")
    parser.add_argument("--inventory-file", metavar="GPUS.json",
                        help="the GPUs as a vramfit.io/gpus annotation value (JSON list with uuids) instead of NVML")
    parser.add_argument("--vendor", metavar="NAME",
                        help="whose GPUs the node has: the reader the agent reads them with (default: nvidia, "
                             "through NVML)")
    parser.add_argument("--config", metavar="FILE", help="agent config (modes per GPU, MPS, device list strategy); "
                                                          "see nodeagent/config.py")
    parser.add_argument("--signing-key", metavar="PATH",
                        help="the shared key file vramfit serve signs assignments with (one key per line; config "
                             "key signing_key_file); Allocate believes only assignments signed with it")
    parser.add_argument("--allow-unsigned-assignments", action="store_true",
                        help="INSECURE: without a signing key, believe any pod's vramfit.io/assignment (config "
                             "key allow_unsigned; single tenant or dry run only)")
    parser.add_argument("--device-plugin-dir", metavar="DIR",
                        help=f"kubelet device plugin directory (default {DEFAULT_PLUGIN_DIR}; a dry run needs "
                             "one of its own)")
    parser.add_argument("--pod-resources-socket", metavar="PATH",
                        help=f"kubelet pod-resources socket (default {DEFAULT_POD_RESOURCES}, off in a dry run; "
                             "'' turns it off)")
    parser.add_argument("--mps-control", default="nvidia-cuda-mps-control", metavar="PATH",
                        help="the MPS control executable (default nvidia-cuda-mps-control)")
    parser.add_argument("--state-dir", metavar="DIR",
                        help=f"where the agent keeps its Allocate ledger across restarts (default {DEFAULT_STATE_DIR}; "
                             "a dry run: a fresh temporary directory; '' = memory only)")
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


def runtime_verdict(config: AgentConfig) -> RuntimeVerdict:
    """What the node's NVIDIA runtime lets a container choose (`nodeagent.runtime_config`); FlagError where the
    agent's device list strategy cannot work under it, or where `open_runtime: refuse` and it is not closed."""
    from nodeagent.runtime_config import RuntimeConfigError, judge, read_runtime_config

    path = config.nvidia_runtime_config
    try:
        verdict = judge(config.device_list_strategy, path, read_runtime_config(path) if path else None)
    except RuntimeConfigError as err:
        raise FlagError(f"--config: {err}") from None
    if verdict.selection != "closed" and config.open_runtime == "refuse":
        raise FlagError(f"--config: open_runtime is refuse and {verdict.why}")
    return verdict


@dataclass(frozen=True)
class Paths:
    """Where the agent serves, reads and writes, every path absolute."""

    plugin_dir: str
    pod_resources_socket: str | None
    state_dir: str | None
    mps_root: str | None = None  # replaces the config's MPS root (a dry run keeps it in its own directory)
    dry_run_dir: str | None = None  # the one directory a dry run writes in besides the plugin socket


def _absolute(flag: str, value: str) -> str:
    if "\0" in value:
        raise FlagError(f"{flag} {value!r}: a path cannot hold a NUL byte")
    return os.path.abspath(os.path.expanduser(value))


def _socket_fits(flag: str, value: str, socket: str) -> None:
    if len(os.fsencode(socket)) > MAX_UNIX_PATH:
        raise FlagError(f"{flag} {value}: the socket path {socket} is {len(os.fsencode(socket))} bytes, more than "
                        f"the {MAX_UNIX_PATH} a unix socket allows")


def _plugin_dir(value: str, *, dry_run: bool) -> str:
    from nodeagent.plugin import KUBELET_SOCKET, PLUGIN_SOCKET

    path = _absolute("--device-plugin-dir", value)
    if dry_run and path == DEFAULT_PLUGIN_DIR:
        raise FlagError(f"--device-plugin-dir {value}: is the kubelet's device plugin directory; a dry run serves "
                        "in a directory of its own")
    if not os.path.isdir(path):
        problem = "not a directory" if os.path.exists(path) else "no such directory"
        raise FlagError(f"--device-plugin-dir {value}: {problem}")
    for name in (PLUGIN_SOCKET, KUBELET_SOCKET):
        _socket_fits("--device-plugin-dir", value, os.path.join(path, name))
    return path


def _state_dir(value: str) -> str:
    path = _absolute("--state-dir", value)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise FlagError(f"--state-dir {value}: cannot create it: {err.strerror or err}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise FlagError(f"--state-dir {value}: not writable")
    return path


def resolve_paths(args: argparse.Namespace, config: Any) -> Paths:
    """The agent's paths from the flags; raises FlagError naming the flag. A dry run (--snapshot) never
    touches a real node's directories: its ledger and MPS pipes go to --state-dir or a fresh temp dir."""
    dry_run = bool(args.snapshot)
    if args.device_plugin_dir is None and dry_run:
        raise FlagError(f"--device-plugin-dir: a dry run needs a directory of its own for the plugin socket (the "
                        f"default, {DEFAULT_PLUGIN_DIR}, is the kubelet's)")
    plugin_dir = _plugin_dir(args.device_plugin_dir or DEFAULT_PLUGIN_DIR, dry_run=dry_run)
    raw_pr = args.pod_resources_socket
    if raw_pr is None:
        raw_pr = "" if dry_run else DEFAULT_POD_RESOURCES
    pod_resources = _absolute("--pod-resources-socket", raw_pr) if raw_pr else None
    if pod_resources is not None:
        _socket_fits("--pod-resources-socket", raw_pr, pod_resources)
    if not dry_run:
        raw_state = DEFAULT_STATE_DIR if args.state_dir is None else args.state_dir
        return Paths(plugin_dir, pod_resources, _state_dir(raw_state) if raw_state else None)
    if args.state_dir and _absolute("--state-dir", args.state_dir) == DEFAULT_STATE_DIR:
        raise FlagError(f"--state-dir {args.state_dir}: is a real node's Allocate ledger; a dry run neither reads "
                        "nor writes it (name another directory, or leave the flag out for a temporary one)")
    own = _state_dir(args.state_dir) if args.state_dir else tempfile.mkdtemp(prefix="vramfit-dry-run-")
    state = own if args.state_dir != "" else None  # '' keeps the ledger in memory
    mps_root = os.path.join(own, "mps") if os.path.abspath(config.mps.root) == DEFAULT_MPS_ROOT else None
    return Paths(plugin_dir, pod_resources, state, mps_root=mps_root, dry_run_dir=own)


_FILE_FLAGS = (("--inventory-file", "inventory_file"), ("--snapshot", "snapshot"), ("--config", "config"),
               ("--signing-key", "signing_key"), ("--kubeconfig", "kubeconfig"))


def one_line(err: BaseException) -> str:
    """An error's text on one line (YAML and API errors span several)."""
    return " ".join(str(err).split()) or type(err).__name__


def _flagged(flag: str, read: Callable[[], T]) -> T:
    """`read()`, its error turned into one line naming the flag."""
    try:
        return read()
    except Exception as err:  # noqa: BLE001 - whatever the reader raises is a bad flag's answer
        text = one_line(err)
        raise FlagError(text if text.startswith(flag) else f"{flag}: {text}") from None


def check_files(args: argparse.Namespace) -> None:
    """Every file a flag names exists and is readable (their content is checked by their readers)."""
    for flag, attr in _FILE_FLAGS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        if not value or not os.path.isfile(value):
            problem = "not a file" if value and os.path.exists(value) else "no such file"
            raise FlagError(f"{flag} {value or repr(value)}: {problem}")
        if not os.access(value, os.R_OK):
            raise FlagError(f"{flag} {value}: not readable")
    control = args.mps_control
    if "/" in control and not (os.path.isfile(control) and os.access(control, os.X_OK)):
        raise FlagError(f"--mps-control {control}: not an executable file")
    check_port(args)


def check_port(args: argparse.Namespace) -> None:
    if not 0 <= args.metrics_port <= 65535:
        raise FlagError(f"--metrics-port {args.metrics_port}: not a port (0..65535; 0 turns metrics off)")


def build_agent(args: argparse.Namespace, metrics: Any = None) -> Any:
    """The agent for these arguments (not started); raises ValueError with a user-facing message."""
    from nodeagent.agent import AgentOptions, NodeAgent
    from nodeagent.config import load_config
    from nodeagent.inventory import FileInventory, NvmlInventory, reader_for
    from nodeagent.pods import ApiPods, SnapshotPods
    from nodeagent.publish import KubePublisher, LogPublisher

    if not args.node_name:
        raise FlagError("--node-name is required (or set NODE_NAME)")
    check_files(args)
    config = _flagged("--config", lambda: load_config(args.config))
    trust = load_trust(args, config)
    runtime = runtime_verdict(config)
    paths = resolve_paths(args, config)
    reader = _flagged("--vendor", lambda: reader_for(getattr(args, "vendor", None)))
    inventory: Any = (FileInventory(args.inventory_file) if args.inventory_file
                      else NvmlInventory(config, args.node_name, reader=reader))
    if args.inventory_file:
        _flagged("--inventory-file", inventory.read)  # a bad file is a bad flag, not a first failed pass
    from nodeagent.overuse import KubeEvictor, LogEvictor

    if args.snapshot:
        pods: Any = _flagged("--snapshot", lambda: SnapshotPods(args.snapshot, args.node_name))
        publisher: Any = LogPublisher()
        evictor: Any = LogEvictor()
        log.info("dry run: the Allocate ledger and MPS pipes live in %s (%s); nothing else is written outside "
                 "it but the plugin socket in %s", paths.dry_run_dir,
                 "ledger in memory" if paths.state_dir is None else f"ledger {paths.state_dir}/allocations.json",
                 paths.plugin_dir)
    else:
        from kubeio.client import api_client

        api = _flagged("--kubeconfig" if args.kubeconfig else "--in-cluster",
                       lambda: api_client(args.kubeconfig, in_cluster=args.in_cluster))
        api.user_agent = "vramfit-node/0.1"
        pods = ApiPods(api, args.node_name).start()
        publisher = KubePublisher(api, args.node_name)
        evictor = KubeEvictor(api)
    options = AgentOptions(node_name=args.node_name, plugin_dir=paths.plugin_dir,
                           pod_resources_socket=paths.pod_resources_socket, mps_control=args.mps_control,
                           state_dir=paths.state_dir, trust=trust, mps_root=paths.mps_root, runtime=runtime)
    return NodeAgent(options, config, inventory, pods, publisher, metrics=metrics, evictor=evictor)


def run_node(args: argparse.Namespace) -> int:
    from nodeagent.metrics import AgentMetrics, serve_http

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_port(args)
    except FlagError as err:
        print(f"vramfit node: {err}", file=sys.stderr)
        return 2
    metrics = AgentMetrics(args.node_name or "")
    built: list[Any] = []  # the agent, once built: /healthz reads its registration
    if args.metrics_port:
        # Listen first: a port in use ends the command before anything is read or written.
        try:
            serve_http(metrics, args.metrics_host, args.metrics_port,
                       lambda: bool(built) and built[0].plugin.registered.is_set())
        except OSError as err:  # a port in use, an address not of this host
            print(f"vramfit node: --metrics-host/--metrics-port {args.metrics_host}:{args.metrics_port}: cannot "
                  f"listen: {err.strerror or err}", file=sys.stderr)
            return 2
    try:
        agent = build_agent(args, metrics=metrics)
        built.append(agent)
        agent.start()
    except Exception as err:  # noqa: BLE001 - config, inventory and API errors end the command plainly
        if built:
            built[0].stop()
        print(f"vramfit node: {one_line(err)}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    agent.stop()
    return 0
