"""`vramfit inspect` (also `kubectl vramfit`): who holds which GPU unit, for which tenant, free and stranded
VRAM, and why each pending pod waits — from a live cluster (kubeconfig, the default) or a snapshot file.

The same view the extender serves at `GET /` (extender/view.py), built from the same objects the extender
reads (Nodes, Pods and the Namespaces' tenancy rules), so the two never disagree. Only nodes whose kubelet
advertises vramfit.io/gpu (the node agent runs there) count as vramfit capacity; the others are listed apart.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Sequence
from typing import Any

from extender.view import cluster_view, to_html, to_text
from kubeio.files import CliError, load_snapshot
from packing.k8s.demand import pending_demand
from packing.k8s.dra_snapshot import DraObjects, Ledger
from packing.k8s.snapshot import snapshot_trust
from packing.policies import DEFAULT_POLICY
from packing.state import ClusterState
from vramfit import inspect_usage
from vramfit.served import count_served
from vramfit.whatif import load_catalog_arg, place_dra


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="PATH", help="read the cluster of this kubeconfig (default: "
                                                           "$KUBECONFIG or ~/.kube/config)")
    src.add_argument("--snapshot", metavar="FILE", help="read a `kubectl get namespaces,nodes,pods -A -o yaml` "
                                                         "file instead")
    p.add_argument("--context", metavar="NAME", help="the kubeconfig context to use (default: its current one)")
    p.add_argument("-n", "--namespace", metavar="NS", help="explain only this namespace's pending pods (the "
                                                            "GPUs and their holders are the whole cluster's)")
    p.add_argument("--catalog", metavar="FILE", help="GPU catalog override (as whatif takes it)")
    p.add_argument("--format", choices=("text", "html"), default="text")
    return p


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="show who holds which GPU unit, free and stranded VRAM, pending pods",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)
    p.set_defaults(func=run)
    return p


def _api(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    try:
        kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except Exception as err:  # noqa: BLE001 - the client raises several kinds for one mistake: say it plainly
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "kubeconfig ($KUBECONFIG or ~/.kube/config)"
        flag = f", --context {context}" if context else ""
        raise CliError(f"{where}{flag}: cannot load: {err}") from None
    return kclient.ApiClient(cfg)


def _live_objects(kubeconfig: str | None, context: str | None = None) -> list[dict[str, Any]]:
    """Nodes, Pods and Namespaces (their tenancy rules: which tenant a pending pod's namespace gives it), and the
    DRA objects (`resource.k8s.io/v1`: ResourceSlices, DeviceClasses, ResourceClaims and their templates)."""
    from kubernetes import client as kclient

    api = _api(kubeconfig, context)
    core, resource = kclient.CoreV1Api(api), kclient.ResourceV1Api(api)
    objs: list[dict[str, Any]] = []
    for kind, call in (("Namespace", core.list_namespace), ("Node", core.list_node),
                       ("Pod", core.list_pod_for_all_namespaces)):
        objs += _listed(kind, call)
    dra: tuple[tuple[str, Any], ...] = (
        ("ResourceSlice", resource.list_resource_slice), ("DeviceClass", resource.list_device_class),
        ("ResourceClaim", resource.list_resource_claim_for_all_namespaces),
        ("ResourceClaimTemplate", resource.list_resource_claim_template_for_all_namespaces))
    for kind, call in dra:
        try:
            objs += _listed(kind, call)
        except kclient.ApiException as err:
            if err.status != 404:  # a cluster older than 1.34 has no resource.k8s.io/v1: no DRA to show
                raise
    return objs


def _listed(kind: str, call: Any) -> list[dict[str, Any]]:
    resp = call(_preload_content=False, _request_timeout=30)
    try:
        items = json.loads(resp.data).get("items") or []
    finally:
        resp.release_conn()
    return [dict(o, kind=kind) for o in items]  # list items carry no kind


def run(args: argparse.Namespace) -> int:
    catalog = load_catalog_arg(args.catalog)
    try:
        if args.snapshot:
            if args.context:
                raise CliError("--context: only applies to a live cluster (a kubeconfig), not with --snapshot")
            snap = load_snapshot(args.snapshot, catalog)
            warnings = list(snap.warnings)
            state, objects, unserved = snap.state, snap.objects, snap.unserved
            dra, ledger = snap.dra, snap.ledger
            # A snapshot may be of a cluster before vramfit is installed: the what-if's rule.
            nodes, more = count_served(state, unserved, args.snapshot, strict=False)
        else:
            from packing.k8s.inventory import agent_absent
            from packing.k8s.snapshot import load_cluster

            objects = _live_objects(args.kubeconfig, args.context)
            loaded = load_cluster(objects, catalog, source="cluster")
            state, warnings, dra, ledger = loaded.state, loaded.warnings, loaded.dra, loaded.ledger
            # DRA nodes are served through claims, not by the node agent.
            unserved = {str(o["metadata"]["name"]): why for o in objects if o.get("kind") == "Node"
                        and o["metadata"]["name"] not in dra.node_names and (why := agent_absent(o)) is not None}
            # Live, vramfit is what runs: only the nodes its agent serves are its capacity.
            nodes, more = count_served(state, unserved, "cluster", strict=True)
        warnings += more
    except CliError as err:
        print(f"vramfit inspect: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - API problems, shown plainly
        print(f"vramfit inspect: cannot read the cluster: {err}", file=sys.stderr)
        return 2
    usage = inspect_usage.node_reports(objects, warnings)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    tenancy = snapshot_trust(objects).tenancy
    pending = [p for o in objects if _in_namespace(o, args.namespace)
               and (p := pending_demand(o, tenancy)) is not None]
    # The page's own section lists the nodes left out of vramfit's capacity, each with why.
    view = cluster_view(state, pending, catalog=catalog, not_served=sorted(nodes["not_counted"].items()))
    # Why each DRA pod waits: computed before anything else could touch the state.
    waits = dra_waits(state, dra, ledger, args.namespace)
    if args.format == "html":
        page = to_html(view)
        section = f"<h2>DRA pods waiting</h2><pre>{html.escape(chr(10).join(waits))}</pre>" if waits else ""
        section += inspect_usage.to_html(usage)
        print(page.replace("</body>", section + "</body>", 1) if "</body>" in page else page + section)
    else:
        used = inspect_usage.to_text(usage)
        print(to_text(view) + ("\n\nDRA pods waiting for their claims:\n" + "\n".join(waits) if waits else "")
              + ("\n\n" + used if used else ""))
    return 0


def dra_waits(state: ClusterState, dra: DraObjects | None, ledger: Ledger, namespace: str | None) -> list[str]:
    """One line per DRA pod waiting for its claims (those at vramfit's gate marked): why it waits, by what the
    live allocator would answer for it now (on a copy of the state, in queue order)."""
    if dra is None or not (dra.pending or dra.waiting):
        return []
    doc = place_dra(state.copy(), dra, _copy_ledger(ledger), DEFAULT_POLICY)
    lines = []
    for p in doc["placements"]:
        if namespace is not None and not p["pod"].startswith(f"{namespace}/"):
            continue
        gate = " [gated]" if p["gated"] else ""
        if p["node"]:
            devices = ", ".join(f"{d['driver']}/{d['pool']}/{d['device']}" for c in p["claims"] for d in c["devices"])
            why = f"allocatable now on {p['node']} ({devices or 'claims allocated with another pod'}): waiting " \
                  "for vramfit's allocator"
        else:
            why = p["reason"]
        lines.append(f"  {p['pod']}{gate}: {why}")
    return lines


def _copy_ledger(ledger: Ledger) -> Ledger:
    return Ledger({d: dict(u) for d, u in ledger.used.items()}, dict(ledger.by_holder))


def _in_namespace(obj: dict[str, Any], namespace: str | None) -> bool:
    if namespace is None:
        return True
    meta = obj.get("metadata")
    return isinstance(meta, dict) and (meta.get("namespace") or "default") == namespace


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl vramfit [...]` (kubectl runs `kubectl-vramfit` from PATH): the inspect view."""
    parser = _configure(argparse.ArgumentParser(prog="kubectl vramfit", description=__doc__,
                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(kubectl_main())
