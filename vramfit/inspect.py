"""`vramfit inspect` (also `kubectl vramfit`): who holds which GPU unit, for which tenant, free and stranded
VRAM, and why each pending pod waits — from a live cluster (kubeconfig, the default) or a snapshot file.

The same view the extender serves at `GET /` (extender/view.py), built from the same objects the extender
reads (Nodes and Pods), so the two never disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from extender.view import cluster_view, to_html, to_text
from packing.k8s.demand import pending_demand
from vramfit.files import CliError, load_snapshot
from vramfit.whatif import load_catalog_arg


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="PATH", help="read the cluster of this kubeconfig (default: "
                                                           "$KUBECONFIG or ~/.kube/config)")
    src.add_argument("--snapshot", metavar="FILE", help="read a `kubectl get nodes,pods -A -o yaml` file instead")
    p.add_argument("--catalog", metavar="FILE", help="GPU catalog override (as whatif takes it)")
    p.add_argument("--format", choices=("text", "html"), default="text")
    return p


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="show who holds which GPU unit, free and stranded VRAM, pending pods",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)
    p.set_defaults(func=run)
    return p


def _live_objects(kubeconfig: str | None) -> list[dict[str, Any]]:
    from kubernetes import client as kclient

    from extender.kube import api_client

    core = kclient.CoreV1Api(api_client(kubeconfig))
    objs: list[dict[str, Any]] = []
    for kind, call in (("Node", core.list_node), ("Pod", core.list_pod_for_all_namespaces)):
        resp = call(_preload_content=False, _request_timeout=30)
        try:
            items = json.loads(resp.data).get("items") or []
        finally:
            resp.release_conn()
        objs += [dict(o, kind=kind) for o in items]  # list items carry no kind
    return objs


def run(args: argparse.Namespace) -> int:
    catalog = load_catalog_arg(args.catalog)
    try:
        if args.snapshot:
            snap = load_snapshot(args.snapshot, catalog)
            for w in snap.warnings:
                print(f"warning: {w}", file=sys.stderr)
            state, objects = snap.state, snap.objects
        else:
            from packing.k8s.snapshot import load_objects

            objects = _live_objects(args.kubeconfig)
            state, _ = load_objects(objects, catalog, source="cluster")
    except CliError as err:
        print(f"vramfit inspect: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - kubeconfig / API problems, shown plainly
        print(f"vramfit inspect: cannot read the cluster: {err}", file=sys.stderr)
        return 2
    pending = [p for p in map(pending_demand, objects) if p is not None]
    view = cluster_view(state, pending, catalog=catalog)
    print(to_html(view) if args.format == "html" else to_text(view))
    return 0


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl vramfit [...]` (kubectl runs `kubectl-vramfit` from PATH): the inspect view."""
    parser = _configure(argparse.ArgumentParser(prog="kubectl vramfit", description=__doc__,
                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(kubectl_main())
