"""Reading snapshot and pod files for the CLI, with errors that name the file, the object and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from packing.model import InputError


class CliError(Exception):
    """A user-facing error: printed as is, exit code 2."""


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
    return CliError(f"{path}: {err.obj}: field {err.field_name}: {err.problem}")
