"""JSON and YAML files a user hands the tools (task files, scan files, results), read and validated so that any
problem with one is a single line naming the file: unreadable, not parseable, or not the expected shape."""

from __future__ import annotations

import json
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from clef_vllm.errors import first_validation_error

Model = TypeVar("Model", bound=BaseModel)


def read_document(
    path: Path | Traversable, *, what: str, error: type[Exception], syntax: Literal["JSON", "YAML"] = "JSON"
) -> tuple[Any, bytes]:
    """The parsed content of `path` and its bytes (for hashing what was read, not what is there later)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    if syntax == "YAML":
        import yaml

        try:
            return yaml.safe_load(raw), raw
        except yaml.YAMLError as exc:
            # PyYAML explains over several lines (with a caret under the spot); one line keeps the CLI's contract.
            raise error(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(raw), raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise error(f"{path} is not valid JSON: {detail}") from None


def validated(model: type[Model], data: Any, *, error: type[Exception], prefix: str, top: str = "top level") -> Model:
    """`data` as `model`, or `error("PREFIX: where: what")` for its first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{prefix}: {first_validation_error(exc, top=top)}") from None
