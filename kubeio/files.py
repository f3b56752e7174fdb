"""Reading snapshot and pod files, with errors that name the file, the object and the field.

`load_snapshot` is the one reader of cluster snapshots: `vramfit whatif`, `vramfit demo` and
`vramfit serve --snapshot` all go through it, so a file one of them rejects (or warns about) the others
reject (or warn about) too; the node agent's dry run reads its pod file with `read_yaml_documents`. Each
message names the file once, then the item (its place in the file and, where it has one, its kind and name),
then the field.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packing.catalog import Catalog
from packing.k8s.demand import is_active
from packing.k8s.dra_snapshot import DRA_KINDS, DraObjects, Ledger
from packing.k8s.inventory import agent_absent
from packing.k8s.snapshot import load_cluster, snapshot_trust
from packing.k8s.trust import Tenancy
from packing.model import InputError
from packing.state import ClusterState
from packing.vendors.nvidia.plugin_names import DEFAULT_DEVICE_PLUGIN_NAMES, DevicePluginNames

# Namespaces: the tenancy rules (packing.k8s.trust); DRA kinds: packing.k8s.dra_snapshot
READ_KINDS = ("Node", "Pod", "Namespace", *DRA_KINDS)
# What the API server emits at the top level of a Node or a Pod (`kubectl get -o yaml`); anything else is a
# typo or an edit (`specs:`, `annotations:` one level too high) whose content vramfit would never see.
TOP_LEVEL_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


class CliError(Exception):
    """A user-facing error of a command line (`vramfit`, `vramfit serve`, `vramfit node`): printed as is, exit
    code 2."""


def read_yaml_documents(path: str) -> list[Any]:
    """All YAML (or JSON) documents of a file; a `List` stays a List (callers flatten)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CliError(f"{path}: cannot read: {err}") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise CliError(f"{path}: not valid YAML{where}: {problem}") from None


def input_error(path: str, err: InputError) -> CliError:
    # Readers deeper down name their source as the object when they know nothing better: do not say the
    # path twice.
    obj = "" if err.obj in (path, "input", "snapshot") else f"{err.obj}: "
    return CliError(f"{path}: {obj}field {err.field_name}: {err.problem}")


@dataclass(frozen=True)
class Item:
    """One object of a file, with where it is: `document 2`, `items[3]`, `document 2 items[3]`."""

    where: str
    obj: Any

    @property
    def kind(self) -> Any:
        return self.obj.get("kind") if isinstance(self.obj, dict) else None

    @property
    def name(self) -> str:
        """`kind namespace/name` as far as the object says it (for messages)."""
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        kind = str(self.kind).lower() if isinstance(self.kind, str) else "object"
        if not isinstance(name, str) or not name:
            return f"{kind} without metadata.name"
        if self.kind == "Pod":
            return f"{kind} {namespace if isinstance(namespace, str) and namespace else 'default'}/{name}"
        return f"{kind} {name}"

    @property
    def label(self) -> str:
        return f"{self.where} ({self.name})"


def _is_list(obj: Any) -> bool:
    return isinstance(obj, dict) and str(obj.get("kind", "")).endswith("List") and "items" in obj


def iter_items(path: str, docs: list[Any]) -> Iterator[Item]:
    """The objects of a file's documents, `List`s flattened, each with its place in the file."""
    single = len(docs) == 1
    for d, doc in enumerate(docs, start=1):
        prefix = "" if single else f"document {d}"
        if _is_list(doc):
            items = doc["items"]
            if items is None:
                continue  # `kubectl get` of nothing prints `items: []`; some tools write null
            if not isinstance(items, list):
                where = f"{prefix} items" if prefix else "items"
                raise CliError(f"{path}: {where}: expected a list, got {type(items).__name__}")
            for j, obj in enumerate(items):
                yield Item(f"{prefix + ' ' if prefix else ''}items[{j}]", obj)
        else:
            yield Item(prefix or "document 1", doc)


@dataclass
class Snapshot:
    """A cluster snapshot file, read and checked: its Nodes and Pods (in file order), the cluster they make,
    and warnings (each naming the file and the item)."""

    path: str
    objects: list[dict[str, Any]]
    state: ClusterState
    warnings: list[str] = field(default_factory=list)
    tenancy: Tenancy = field(default_factory=Tenancy)  # its Namespaces' rules: which tenants their pods may name
    unserved: dict[str, str] = field(default_factory=dict)  # node -> why the node agent does not serve it
    dra: DraObjects | None = None  # its DRA objects (packing.k8s.dra_snapshot)
    ledger: Ledger = field(default_factory=Ledger)  # capacity its claims' allocations use on shared devices


def load_snapshot(path: str, catalog: Catalog, relax_tenancy: bool = False,
                  names: DevicePluginNames = DEFAULT_DEVICE_PLUGIN_NAMES) -> Snapshot:
    """Read and check a snapshot (`kubectl get nodes,pods -A -o yaml`); raises CliError (exit 2) where any
    answer from it would be meaningless: unreadable, empty, no Node at all, an object without a kind, or a
    Node or Pod the core cannot read. What is only suspicious becomes a warning:

    - objects of kinds vramfit does not read (a Deployment, `kind: Nod`): they are ignored;
    - unknown top-level fields of a Node or a Pod: their content is ignored;
    - unknown fields in a Node's or a Pod's metadata, spec, status, containers and their resources (the
      Kubernetes API's own field names, with "did you mean"): their content is ignored;
    - a running pod whose `spec.nodeName` names no node in the file: what it holds would count as free.
    `unserved` names the nodes the node agent does not serve (`packing.k8s.inventory.agent_absent`).
    """
    docs = read_yaml_documents(path)
    if not docs:
        raise CliError(f"{path}: empty: expected Node and Pod objects (as `kubectl get nodes,pods -A -o yaml` "
                       "writes them)")
    warnings: list[str] = []
    ignored: list[str] = []
    kept = [item for item in iter_items(path, docs) if _kept(path, item, warnings, ignored)]
    objects: list[dict[str, Any]] = [item.obj for item in kept]
    node_names = {_name(o) for o in objects if o.get("kind") == "Node"}
    if not node_names:
        found = f" (found only {', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''})" if ignored else ""
        raise CliError(f"{path}: no Node objects{found}: a snapshot needs the cluster's nodes "
                       "(`kubectl get nodes,pods -A -o yaml`)")
    warnings.extend(_orphan_warnings(path, kept, node_names))
    try:
        trust = snapshot_trust(objects)
        loaded = load_cluster(objects, catalog, relax_tenancy=relax_tenancy, source=path, names=names, trust=trust)
    except InputError as err:
        raise input_error(path, err) from None
    # The core says the same about orphans (for pods it can read the holding of): said once is enough.
    warnings.extend(f"{path}: {w}" for w in loaded.warnings if "which vramfit does not know" not in w)
    # A DRA node's devices are allocated through claims: vramfit's node agent does not run there.
    dra_nodes = loaded.dra.node_names
    unserved = {_name(o): why for o in objects if o.get("kind") == "Node" and _name(o) not in dra_nodes
                and (why := agent_absent(o)) is not None}
    return Snapshot(path, objects, loaded.state, warnings, trust.tenancy, unserved, loaded.dra, loaded.ledger)


def _kept(path: str, item: Item, warnings: list[str], ignored: list[str]) -> bool:
    """Whether the snapshot reads `item` (a Node, Pod or Namespace); CliError where no answer could be
    trusted, a warning (in `warnings`) for what is only suspicious, the names of skipped kinds in `ignored`."""
    if not isinstance(item.obj, dict):
        raise CliError(f"{path}: {item.where}: expected an object, got {type(item.obj).__name__}")
    kind = item.kind
    if kind is None:
        raise CliError(f"{path}: {item.where}: field kind: missing (expected Node or Pod)")
    if kind not in READ_KINDS:
        close = difflib.get_close_matches(str(kind), READ_KINDS, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.append(f"{path}: {item.label}: kind {kind!r} is not read by vramfit (only Node, Pod, Namespace "
                        "and the DRA kinds)"
                        f"{hint}: ignored")
        ignored.append(item.name)
        return False
    meta = item.obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        # Said here, where the item's place in the file is known; the core could only say "pod".
        raise CliError(f"{path}: {item.where} ({kind}): field metadata.name: missing or not a string")
    unknown = sorted(str(k) for k in item.obj if k not in TOP_LEVEL_FIELDS)
    if unknown:
        warnings.append(f"{path}: {item.label}: unknown top-level field{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(unknown)} (a {kind} has {', '.join(sorted(TOP_LEVEL_FIELDS))}): ignored")
    if kind in ("Node", "Pod"):
        warnings.extend(f"{path}: {item.label}: {w}" for w in unknown_field_warnings(item.obj))
    return True


def _orphan_warnings(path: str, kept: list[Item], node_names: set[str]) -> list[str]:
    """A warning for each running pod whose node is not in the file."""
    return [f"{path}: {item.label}: spec.nodeName {item.obj['spec']['nodeName']!r} names no node in "
            "the file: what it holds is not counted (its GPUs would look free)"
            for item in kept
            if item.obj.get("kind") == "Pod" and is_active(item.obj)
            and str(item.obj["spec"]["nodeName"]) not in node_names]


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name")) if isinstance(meta, dict) else ""


# ---------------------------------------------------------------------------------------------------------------
# Unknown fields inside a Node or a Pod. The names are the Kubernetes API's own, from the official client's
# models (their `attribute_map` values are the JSON field names), not a list kept here by hand.


@functools.cache
def _fields() -> dict[str, dict[str, frozenset[str]]]:
    from kubernetes.client import models as m

    def names(model: Any) -> frozenset[str]:
        return frozenset(model.attribute_map.values())

    return {"Pod": {"metadata": names(m.V1ObjectMeta), "spec": names(m.V1PodSpec), "status": names(m.V1PodStatus)},
            "Node": {"metadata": names(m.V1ObjectMeta), "spec": names(m.V1NodeSpec), "status": names(m.V1NodeStatus)},
            "container": {"": names(m.V1Container), "resources": names(m.V1ResourceRequirements)}}


def unknown_field_warnings(obj: dict[str, Any]) -> list[str]:
    """One line per field of a Node's or a Pod's metadata, spec and status (and a Pod's containers and their
    resources) that Kubernetes does not have: `spec.nodeNmae` would leave a running pod's GPU looking free."""
    kind = obj.get("kind")
    if kind not in ("Node", "Pod"):
        return []
    known = _fields()
    out: list[str] = []
    for section, allowed in known[str(kind)].items():
        out += _unknown_in(obj.get(section), allowed, section)
    spec = obj.get("spec")
    if kind == "Pod" and isinstance(spec, dict):
        for group in ("initContainers", "containers"):
            containers = spec.get(group)
            if not isinstance(containers, list):
                continue
            for i, c in enumerate(containers):
                if not isinstance(c, dict):
                    continue
                where = f"spec.{group}[{i}]"
                out += _unknown_in(c, known["container"][""], where)
                out += _unknown_in(c.get("resources"), known["container"]["resources"], f"{where}.resources")
    return out


def _unknown_in(section: Any, allowed: frozenset[str], where: str) -> list[str]:
    if not isinstance(section, dict):
        return []
    out = []
    for key in section:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"field {where}.{key}: unknown to Kubernetes{hint}: ignored")
    return out
