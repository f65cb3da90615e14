"""One way to read a YAML file into a pydantic model, so recipes, suites and gates report bad input alike:
one line naming the file (and line, for YAML syntax) or the key, and what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from quantkit.errors import QuantkitError

Model = TypeVar("Model", bound=BaseModel)


def load_yaml_model(path: Path, schema: type[Model]) -> Model:
    """`path` parsed and validated as `schema`; QuantkitError for invalid YAML, a non-mapping, or a bad key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise QuantkitError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from exc
    if not isinstance(data, dict):
        raise QuantkitError(f"{path}: must be a YAML mapping")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        message = message.removeprefix("Value error, ")
        raise QuantkitError(f"{path}: '{key}': {message}" if key else f"{path}: {message}") from exc
