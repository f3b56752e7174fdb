"""Tenancy from namespaces and signed assignments (packing/k8s/trust.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.k8s.trust import (
    ANN_ALLOWED_TENANTS,
    ANN_SIGNATURE,
    LABEL_TENANT,
    SigningKeys,
    Tenancy,
    sign,
    signed_assignment,
    verify,
)
from packing.model import InputError

KEYS = SigningKeys.from_text("k" * 48)
OTHER = SigningKeys.from_text("o" * 48)
text = st.text(min_size=1, max_size=40)


def _ns(name: str, tenant: str | None = None, allowed: str | None = None) -> dict:
    meta: dict = {"name": name}
    if tenant:
        meta["labels"] = {LABEL_TENANT: tenant}
    if allowed is not None:
        meta["annotations"] = {ANN_ALLOWED_TENANTS: allowed}
    return {"metadata": meta}


def test_a_pod_gets_its_namespaces_tenant_unless_the_namespace_allows_the_one_it_names() -> None:
    rules = Tenancy.from_objects([_ns("ml", tenant="team-a", allowed="team-b, team-c"), _ns("web")])
    assert rules.resolve("ml", None, "pod ml/p") == "team-a"
    assert rules.resolve("ml", "team-c", "pod ml/p") == "team-c"
    assert rules.resolve("web", "web", "pod web/p") == "web"
    with pytest.raises(InputError, match="namespace web does not allow tenant 'team-a'"):
        rules.resolve("web", "team-a", "pod web/p")
    with pytest.raises(InputError, match="does not allow"):
        rules.resolve("unseen", "team-a", "pod unseen/p")  # an unknown namespace allows nothing else


def test_a_malformed_namespace_is_named() -> None:
    with pytest.raises(InputError, match=r"namespace ml: field metadata.annotations\[vramfit.io/allowed-tenants\]"):
        Tenancy.from_objects([{"metadata": {"name": "ml", "annotations": {ANN_ALLOWED_TENANTS: 3}}}])


def test_short_or_missing_keys_are_refused(tmp_path) -> None:
    with pytest.raises(InputError, match="at least 32 bytes"):
        SigningKeys.from_text("short")
    with pytest.raises(InputError, match="no key"):
        SigningKeys.from_text("\n\n")
    with pytest.raises(InputError, match=r"signing key file .*missing: field \(contents\): cannot be read"):
        SigningKeys.from_file(tmp_path / "missing")


@given(uid=text, node=text, assignment=text, other=text)
def test_a_signature_verifies_for_exactly_what_was_signed(uid: str, node: str, assignment: str, other: str) -> None:
    sig = sign(KEYS, uid, node, assignment)
    assert verify(KEYS, uid, node, assignment, sig)
    assert not verify(OTHER, uid, node, assignment, sig)
    if other != uid:
        assert not verify(KEYS, other, node, assignment, sig)
    if other != node:
        assert not verify(KEYS, uid, other, assignment, sig)
    if other != assignment:
        assert not verify(KEYS, uid, node, other, sig)


def test_a_rolled_key_still_verifies_what_the_old_one_signed() -> None:
    sig = sign(OTHER, "u1", "n1", "{}")
    rolled = SigningKeys.from_text("k" * 48 + "\n" + "o" * 48)
    assert verify(rolled, "u1", "n1", "{}", sig)
    assert sign(rolled, "u1", "n1", "{}") == sign(KEYS, "u1", "n1", "{}")


def test_signed_assignment_reads_uid_and_node_from_the_pod() -> None:
    raw = '{"gpus":[{"index":0,"mig":null,"vram_mib":100}]}'
    pod = {"metadata": {"uid": "u1", "annotations": {"vramfit.io/assignment": raw,
                                                     ANN_SIGNATURE: sign(KEYS, "u1", "n1", raw)}},
           "spec": {"nodeName": "n1"}}
    assert signed_assignment(KEYS, pod, "vramfit.io/assignment") == raw
    moved = {**pod, "spec": {"nodeName": "n2"}}
    assert signed_assignment(KEYS, moved, "vramfit.io/assignment") is None
    forged = {**pod, "metadata": {**pod["metadata"], "uid": "u2"}}
    assert signed_assignment(KEYS, forged, "vramfit.io/assignment") is None
