"""Who may say what: tenants come from namespaces, assignments from vramfit's own signature.

A pod author writes a pod's labels and annotations, so neither may decide which failure domain the pod joins
nor which unit its container receives. Two rules, one place:

- **Tenancy.** A pod's tenant is its namespace's: the Namespace label `vramfit.io/tenant`, else the
  namespace's name. A pod may name another tenant (pod label `vramfit.io/tenant`) only when its Namespace
  lists that tenant in the annotation `vramfit.io/allowed-tenants` (comma list). Namespaces are written by
  cluster admins, pods by their authors; a namespace vramfit has not seen allows nothing beyond its own name.
- **Signed assignments.** The extender signs what it binds (HMAC-SHA256 over the pod UID, the node and the
  exact assignment text, `vramfit.io/assignment-signature`), with a key the extender and the node agent
  share (a Secret). The node agent hands out units only for a signature that verifies, and the extender
  books an assignment from the API only when it does. HMAC, not a public-key signature: the standard library
  has it, both ends are vramfit's own, and a node that could read the key can already reach its own GPUs
  (the NodeRestriction admission plugin keeps its credentials off other nodes' pods).

Pure: objects and keys in, answers out.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packing.model import InputError

LABEL_TENANT = "vramfit.io/tenant"  # on a Pod: the tenant it names; on a Namespace: the namespace's tenant
ANN_ALLOWED_TENANTS = "vramfit.io/allowed-tenants"  # on a Namespace: more tenants its pods may name
ANN_SIGNATURE = "vramfit.io/assignment-signature"
SIGNATURE_VERSION = "v1"
MIN_KEY_BYTES = 32


# ---- tenancy -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceTenancy:
    """What one Namespace allows: its own tenant, and the others its pods may name."""

    tenant: str
    allowed: frozenset[str] = frozenset()

    def permits(self, tenant: str) -> bool:
        return tenant == self.tenant or tenant in self.allowed


def _tenant_list(raw: Any, who: str, where: str) -> frozenset[str]:
    if not isinstance(raw, str):
        raise InputError(who, where, f"expected a comma-separated list of tenants, got {raw!r}")
    return frozenset(t.strip() for t in raw.split(",") if t.strip())


def namespace_tenancy(obj: Mapping[str, Any]) -> tuple[str, NamespaceTenancy]:
    """A Namespace object -> (its name, what it allows). Raises InputError naming the field."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InputError("namespace", "metadata.name", "missing or not a string")
    name: str = meta["name"]
    who = f"namespace {name}"
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise InputError(who, "metadata", "labels and annotations must be objects")
    tenant = labels.get(LABEL_TENANT) or name
    if not isinstance(tenant, str):
        raise InputError(who, f"metadata.labels[{LABEL_TENANT}]", "not a string")
    allowed: frozenset[str] = frozenset()
    if ANN_ALLOWED_TENANTS in annotations:
        allowed = _tenant_list(annotations[ANN_ALLOWED_TENANTS], who, f"metadata.annotations[{ANN_ALLOWED_TENANTS}]")
    return name, NamespaceTenancy(tenant=tenant, allowed=allowed)


@dataclass(frozen=True)
class Tenancy:
    """The namespaces' rules, by namespace name. A namespace not listed is its own tenant and allows no other."""

    namespaces: Mapping[str, NamespaceTenancy] = field(default_factory=dict)

    @classmethod
    def from_objects(cls, objs: Iterable[Mapping[str, Any]]) -> Tenancy:
        """From Namespace objects (a snapshot's, or a list); raises InputError for a malformed one."""
        return cls(dict(namespace_tenancy(o) for o in objs))

    def of(self, namespace: str) -> NamespaceTenancy:
        return self.namespaces.get(namespace) or NamespaceTenancy(tenant=namespace)

    def resolve(self, namespace: str, named: Any, who: str) -> str:
        """The pod's tenant: its namespace's, or the one it names when the namespace allows it.
        Raises InputError (the pod's label named) for any other."""
        rules = self.of(namespace)
        if named is None or named == "":
            return rules.tenant
        where = f"metadata.labels[{LABEL_TENANT}]"
        if not isinstance(named, str):
            raise InputError(who, where, "not a string")
        if not rules.permits(named):
            allowed = ", ".join(sorted({rules.tenant, *rules.allowed}))
            raise InputError(who, where, f"namespace {namespace} does not allow tenant {named!r} (it allows: "
                                         f"{allowed}); a cluster admin adds tenants with the Namespace "
                                         f"annotation {ANN_ALLOWED_TENANTS}")
        return named


NO_NAMESPACE_RULES = Tenancy()


@dataclass(frozen=True)
class PodTrust:
    """What reading a pod may believe: the namespaces' tenancy rules, and the keys an assignment must be
    signed with (None: a snapshot or a what-if, whose files an operator wrote, are taken as written)."""

    tenancy: Tenancy = NO_NAMESPACE_RULES
    keys: SigningKeys | None = None


TRUST_AS_WRITTEN = PodTrust()


# ---- signed assignments ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKeys:
    """The shared HMAC keys: the first signs, any verifies (so a new key can be rolled out before it signs)."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise InputError("signing key", "(keys)", "no key given")
        for i, k in enumerate(self.keys):
            if len(k) < MIN_KEY_BYTES:
                raise InputError("signing key", f"line {i + 1}", f"a key needs at least {MIN_KEY_BYTES} bytes, "
                                                                 f"got {len(k)}")

    @classmethod
    def from_text(cls, text: str, source: str = "signing key") -> SigningKeys:
        """One key per non-empty line (surrounding whitespace dropped)."""
        keys = tuple(line.strip().encode() for line in text.splitlines() if line.strip())
        try:
            return cls(keys)
        except InputError as err:
            raise InputError(source, err.field_name, err.problem) from None

    @classmethod
    def from_file(cls, path: str | Path) -> SigningKeys:
        """Raises InputError (naming the file) when it cannot be read or holds no usable key."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"signing key file {path}", "(contents)", f"cannot be read: {err}") from None
        return cls.from_text(text, f"signing key file {path}")


def _message(uid: str, node: str, assignment: str) -> bytes:
    # Length-prefixed fields: no choice of UID, node and text can make two messages equal.
    parts = [SIGNATURE_VERSION, uid, node, assignment]
    return b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in parts)


def sign(keys: SigningKeys, uid: str, node: str, assignment: str) -> str:
    """The signature annotation's value for an assignment annotation text bound to `node` for pod `uid`."""
    digest = hmac.new(keys.keys[0], _message(uid, node, assignment), hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}:{digest}"


def verify(keys: SigningKeys, uid: str, node: str, assignment: str, signature: Any) -> bool:
    """Whether `signature` is vramfit's for exactly this pod UID, node and assignment text."""
    if not uid or not node or not isinstance(signature, str) or not isinstance(assignment, str):
        return False
    message = _message(uid, node, assignment)
    for key in keys.keys:
        expected = f"{SIGNATURE_VERSION}:{hmac.new(key, message, hashlib.sha256).hexdigest()}"
        if hmac.compare_digest(expected, signature):
            return True
    return False


def signed_assignment(keys: SigningKeys, obj: Mapping[str, Any], assignment_key: str) -> str | None:
    """The pod's assignment annotation text when its signature verifies for its UID and node; else None."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        return None
    raw = annotations.get(assignment_key)
    uid, node = meta.get("uid"), spec.get("nodeName")
    if not isinstance(raw, str) or not isinstance(uid, str) or not isinstance(node, str):
        return None
    return raw if verify(keys, uid, node, raw, annotations.get(ANN_SIGNATURE)) else None
