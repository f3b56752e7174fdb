"""Check a `resource.k8s.io/v1` object against the Kubernetes 1.37 JSON schema (tests only).

Uses `kubernetes-validate` (its bundled 1.37 schemas) in strict mode: unknown fields are errors.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

SCHEMA_VERSION = "1.37"


class SchemaError(AssertionError):
    """The object does not match the schema; the message names the kind, the object and the field."""


def validate_object(obj: dict[str, Any]) -> None:
    """Raise SchemaError unless `obj` (a plain dict, wire format) is valid for its apiVersion and kind."""
    name = (obj.get("metadata") or {}).get("name", "")
    try:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(p) for p in err.path)
        raise SchemaError(f"{obj.get('kind')} {name!r}: {where or '<root>'}: {err.message}") from None
    except kubernetes_validate.SchemaNotFoundError as err:
        raise SchemaError(f"{obj.get('kind')} {name!r}: no {SCHEMA_VERSION} schema: {err}") from None
