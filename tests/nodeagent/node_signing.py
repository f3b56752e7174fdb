"""Signing for the node agent's tests: what the extender's Binding writes, done by hand."""

from __future__ import annotations

from typing import Any

from packing.k8s.demand import ANN_ASSIGNMENT
from packing.k8s.trust import ANN_SIGNATURE, SigningKeys, sign

KEYS = SigningKeys.from_text("x" * 48)
OTHER_KEYS = SigningKeys.from_text("y" * 48)
KEY_TEXT = "x" * 48 + "\n"


def sign_pod(pod: dict[str, Any], keys: SigningKeys = KEYS, *, uid: str | None = None,
             node: str | None = None) -> dict[str, Any]:
    """Set the pod's assignment signature (for its own UID and node unless told otherwise); returns the pod."""
    meta = pod["metadata"]
    ann = meta.setdefault("annotations", {})
    ann[ANN_SIGNATURE] = sign(keys, uid or meta["uid"], node or pod["spec"]["nodeName"], ann[ANN_ASSIGNMENT])
    return pod
