"""YAML config files read into pydantic models, with errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def load_yaml_model(path: str | Path, model: type[M], error: type[ValueError]) -> M:
    """A YAML file validated into a pydantic model; every problem names the file and the key (raises `error`).
    The extender's and the node agent's config files are read with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"config {path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"config {path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise error(f"config {path}: {problems}") from None
