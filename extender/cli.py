"""`vramfit serve`: run the extender on uvicorn.

The cluster view comes from exactly one source: `--kubeconfig PATH` or `--in-cluster` (list+watch, binds
write to the API), or `--snapshot FILE` (Node/Pod objects from a file; binds change memory only).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

DEFAULT_PORT = 8888
_CONFIG_LINE = re.compile(r"^    (\w+):\s*(.*?)\s*(?:#\s?(.*))?$")
_CONFIG_MORE = re.compile(r"^\s{8,}#\s?(.*)$")


def config_keys_help() -> str:
    """serve --help's epilog: every `Settings` key with its default and the meaning the config module's
    docstring gives it. Built from the model's fields, so a new key shows up here (with its default) even
    before someone documents it, and nothing is listed that the model does not accept."""
    from extender import config

    notes: dict[str, list[str]] = {}
    last: str | None = None
    for line in (config.__doc__ or "").splitlines():
        if (m := _CONFIG_LINE.match(line)) is not None:
            last = m.group(1)
            notes[last] = [m.group(3)] if m.group(3) else []
        elif last is not None and (m := _CONFIG_MORE.match(line)) is not None:
            notes[last].append(m.group(1))
        else:
            last = None
    lines = ["config keys (--config FILE, YAML; every key optional):"]
    for name, field in config.Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        text = " ".join(notes.get(name, []))
        entry = f"{name} (default {json.dumps(default)}){': ' + text if text else ''}"
        lines.extend(textwrap.wrap(entry, width=100, initial_indent="  ", subsequent_indent="      ",
                                   break_on_hyphens=False))
    return "\n".join(lines)


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; use 0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--config", metavar="FILE", help="YAML config (policy, relax_tenancy, reservation TTL, "
                                                          "body cap, URL prefix, admission waits); "
                                                          "see extender/config.py")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--kubeconfig", metavar="PATH", help="watch the cluster of this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="watch the cluster this pod runs in")
    source.add_argument("--snapshot", metavar="FILE",
                        help="serve a fixed cluster from Node/Pod objects (YAML or JSON); binds are in-memory. "
                             "In every mode the verbs are served at /vramfit/filter etc. (the chart's urlPrefix) "
                             "and, unless the config sets url_prefix, also at /filter etc.")
    parser.add_argument("--signing-key", metavar="PATH",
                        help="the HMAC key file shared with the node agents (one key per line; the first signs): "
                             "each Binding's assignment is signed, and only signed assignments are booked. "
                             "Required in cluster mode unless the config sets allow_unsigned: true (insecure); "
                             "overrides the config's signing_key_file")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    parser.add_argument("--client-ca", metavar="FILE",
                        help="require client certificates signed by this CA (kube-scheduler's tlsConfig) on --port")
    parser.add_argument("--webhook-port", type=int, metavar="PORT",
                        help="serve the admission webhook (/mutate) on its own HTTPS port, without client "
                             "certificates (default: on --port)")
    parser.add_argument("--health-port", type=int, metavar="PORT",
                        help="serve /healthz, /readyz and /metrics on this plain-HTTP port (default: on --port)")
    election = parser.add_argument_group("leader election (cluster mode; on by default: run >= 2 replicas)")
    election.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                          help="hold a coordination.k8s.io/v1 Lease before answering verbs (default on)")
    election.add_argument("--lease-name", default="vramfit-extender", help="the Lease's name")
    election.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "vramfit-system"),
                          help="the Lease's namespace (default $POD_NAMESPACE, else vramfit-system)")
    # Shorter than kube-scheduler's 15/10/2: a crashed leader's pods wait about lease-duration for the
    # standby, and a bind's API write must fit in lease-duration - renew-deadline (2 s here). Why these
    # values: extender/leader.py's docstring.
    election.add_argument("--lease-duration", type=float, default=4.0, metavar="S",
                          help="how long a silent leader keeps the Lease, whole seconds (default 4)")
    election.add_argument("--renew-deadline", type=float, default=2.0, metavar="S",
                          help="a leader that could not renew for this long stops binding (default 2)")
    election.add_argument("--retry-period", type=float, default=0.5, metavar="S",
                          help="how often to try to acquire or renew (default 0.5)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def build_serve_parser() -> argparse.ArgumentParser:
    """A standalone parser with the same options (tests, and `python -m extender.cli`)."""
    return _configure(argparse.ArgumentParser(prog="vramfit serve", description=__doc__, epilog=config_keys_help(),
                                              formatter_class=argparse.RawDescriptionHelpFormatter))


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the `vramfit` command's subparsers; func(args) -> exit code."""
    parser = subparsers.add_parser("serve", help="run the kube-scheduler extender (filter/prioritize/bind/preempt)",
                                   description=__doc__, epilog=config_keys_help(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(parser)
    parser.set_defaults(func=run_serve)
    return parser


class _Refused(Exception):
    """Why `vramfit serve` stops before serving (exit 2), printed as `vramfit serve: <why>`."""


def run_serve(args: argparse.Namespace) -> int:
    from extender.listeners import plan, serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings, catalog, (main_ssl, webhook_ssl) = _inputs(args)
        keys = _keys(args, settings)
        if args.snapshot:
            replica = None
            store, asgi = _snapshot_server(args, settings, catalog, keys)
        else:
            replica = _cluster_replica(args, settings, catalog, keys)
            store, asgi = replica.store, replica.asgi
    except _Refused as err:
        print(f"vramfit serve: {err}", file=sys.stderr)
        return 2
    app = replica.app if replica is not None else asgi
    planner = app.state.services.planner  # the queue planner (planning: true), stopped below
    stop = threading.Event()
    _start_background(store, settings, planner, replica, stop)
    try:
        listeners = plan(port=args.port, webhook_port=args.webhook_port, health_port=args.health_port,
                         url_prefix=settings.url_prefix, main_ssl=main_ssl, webhook_ssl=webhook_ssl)
    except ValueError as err:
        print(f"vramfit serve: {err}", file=sys.stderr)
        return 2
    try:
        started = serve(asgi, args.host, listeners, args.log_level)
    finally:
        stop.set()
        if planner is not None:
            planner.stop()
        if replica is not None:
            replica.stop()  # hands the Lease back: a standby takes over without waiting for it to expire
    if not started:
        print("vramfit serve: a listener could not start (see the log above)", file=sys.stderr)
        return 1
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, tuple[dict[str, Any], dict[str, Any]]]:
    """(settings, catalog, (main TLS, webhook TLS)), every port checked first; _Refused naming a bad input."""
    from extender.config import ConfigError, load_settings
    from extender.listeners import check_port, ssl_options
    from packing.catalog import load_catalog
    from packing.model import InputError

    try:
        for flag, port in (("--port", args.port), ("--webhook-port", args.webhook_port),
                           ("--health-port", args.health_port)):
            check_port(flag, port)  # before anything starts: a replica would take the Lease first
        tls = ssl_options(args.tls_cert, args.tls_key, args.client_ca)
        settings = load_settings(args.config)
        return settings, load_catalog(settings.catalog_path), tls
    except (ValueError, ConfigError, InputError) as err:
        raise _Refused(str(err)) from err


def _keys(args: argparse.Namespace, settings: Any) -> Any:
    from packing.model import InputError

    try:
        return signing_keys(args.signing_key or settings.signing_key_file, cluster=not args.snapshot,
                            allow_unsigned=settings.allow_unsigned)
    except (ValueError, InputError) as err:
        raise _Refused(str(err)) from err


def _store_kwargs(settings: Any) -> dict[str, Any]:
    from packing.vendors.nvidia.plugin_names import DevicePluginNames

    return {"relax_tenancy": settings.relax_tenancy, "reservation_ttl_s": settings.reservation_ttl_s,
            "device_plugin_names": DevicePluginNames(settings.device_plugin_resources)}


def _snapshot_server(args: argparse.Namespace, settings: Any, catalog: Any, keys: Any) -> tuple[Any, Any]:
    """(store, app) over the snapshot file, its warnings printed; _Refused for a file or settings it rejects."""
    from extender.app import create_app
    from extender.binder import MemoryBinder
    from extender.config import ConfigError
    from extender.store import Store, agent_rule
    from kubeio.files import CliError, load_snapshot

    store_kwargs = _store_kwargs(settings)
    # The same reader and checks as `vramfit whatif --snapshot`: a file one rejects, the other rejects.
    try:
        snap = load_snapshot(args.snapshot, catalog, relax_tenancy=settings.relax_tenancy,
                             names=store_kwargs["device_plugin_names"])
    except CliError as err:
        raise _Refused(str(err)) from err
    for warning in snap.warnings:
        print(f"vramfit serve: warning: {warning}", file=sys.stderr)
    store = Store.from_objects(snap.objects, catalog, serves=agent_rule(settings.nodes_without_agent),
                               **store_kwargs)
    for name, why in sorted(store.unserved.items()):
        print(f"vramfit serve: warning: {args.snapshot}: node {name} is not counted: {why}", file=sys.stderr)
    try:
        return store, create_app(settings, store, MemoryBinder(keys))
    except ConfigError as err:
        raise _Refused(str(err)) from err


def _cluster_replica(args: argparse.Namespace, settings: Any, catalog: Any, keys: Any) -> Any:
    """The started replica watching the cluster (leader-elected when asked); _Refused when it cannot start."""
    from extender.config import ConfigError
    from extender.leader import LeaseConfig
    from extender.replica import cluster_replica
    from kubeio.client import api_client

    try:
        api = api_client(args.kubeconfig, in_cluster=args.in_cluster)
    except Exception as err:  # noqa: BLE001 - kubeconfig/service-account problems, shown plainly
        raise _Refused(f"cannot configure the Kubernetes client: {err}") from err
    try:
        lease = (LeaseConfig(namespace=args.lease_namespace, name=args.lease_name,
                             lease_duration_s=args.lease_duration, renew_deadline_s=args.renew_deadline,
                             retry_period_s=args.retry_period) if args.leader_elect else None)
        return cluster_replica(api, settings, catalog, lease=lease, keys=keys).start()
    except (ValueError, ConfigError) as err:
        raise _Refused(str(err)) from err


def _start_background(store: Any, settings: Any, planner: Any, replica: Any, stop: threading.Event) -> None:
    """The reservation sweeper, and the heap freeze that then starts the planner (a standby's plans once it
    leads); all end when `stop` is set."""
    if planner is not None and replica is not None:
        planner.active = replica.serving  # a standby plans once it leads
    if planner is not None:
        planner.after_full_copy = freeze_heap
    # Bookings whose bind never finished expire even when no request comes in to sweep them.
    sweeper = threading.Thread(target=_sweep_forever, args=(store, stop, max(1.0, settings.reservation_ttl_s / 4)),
                               name="reservation-sweeper", daemon=True)
    sweeper.start()
    # The planner starts once the heap is frozen: its first round copies the whole view, and a full collection
    # of the unfrozen view inside that copy's hold of the store's lock (~150 ms at 40,000 GPUs) would stall verbs.
    threading.Thread(target=freeze_heap_when_ready, args=(store, stop, planner.start if planner else None),
                     name="heap-freeze", daemon=True).start()


def signing_keys(path: str | None, *, cluster: bool, allow_unsigned: bool) -> Any:
    """The signing keys (`packing.k8s.trust.SigningKeys`) from `path`; None without one. Raises ValueError in
    cluster mode without a key unless `allow_unsigned` (then warns), InputError naming an unusable file."""
    from packing.k8s.trust import SigningKeys

    if path:
        return SigningKeys.from_file(path)
    if cluster and not allow_unsigned:
        raise ValueError("cluster mode needs a signing key: pass --signing-key PATH or set signing_key_file in the "
                         "config (allow_unsigned: true runs without one, insecurely)")
    if cluster:
        logging.getLogger("vramfit.serve").warning(
            "running without a signing key (allow_unsigned: true): INSECURE, any pod author's hand-written "
            "vramfit.io/assignment is booked as written and node agents cannot tell vramfit's assignments apart")
    return None


def freeze_heap() -> None:
    """Move everything alive now (the cluster view: ~50 objects per GPU) out of the cyclic collector's
    reach. Without it an eventual full collection walks the whole view (~130 ms at 40,000 GPUs) inside some
    unlucky filter call; the view changes only a little after the first sync, so it need not be rescanned.
    Called again after the planner's full copy of the view: its first round imports the solver and builds
    what the server keeps for good (~30,000 objects at 5,000 nodes: a full collection of ~5 ms)."""
    gc.collect()
    gc.freeze()


def freeze_heap_when_ready(store: Any, stop: threading.Event, then: Callable[[], Any] | None = None) -> None:
    """Freeze the heap once the store has its first view, then call `then` (the planner's start)."""
    while not store.ready:
        if stop.wait(0.5):
            return
    freeze_heap()
    if then is not None and not stop.is_set():
        then()


def _sweep_forever(store: Any, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        store.sweep()


if __name__ == "__main__":
    sys.exit(run_serve(build_serve_parser().parse_args()))
