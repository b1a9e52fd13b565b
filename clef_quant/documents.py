"""JSON and YAML files a user hands the tools (task files, scan files, results, manifests), read and validated so
that any problem with one is a single line naming the file: unreadable, not parseable, or not the expected shape.

JSON is nested at most as deep as a request body may be (`strict_json.MAX_DEPTH`), checked on the bytes before
parsing: Python's parser recurses, and a file nested a few thousand levels deep would end in a RecursionError."""

from __future__ import annotations

import json
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from clef_vllm.errors import RequestError, first_validation_error, not_valid_json
from clef_vllm.format.strict_json import check_depth

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
        return parse_yaml(raw, where=str(path), error=error), raw
    return parse_json(raw, where=str(path), error=error), raw


def parse_yaml(raw: bytes | str, *, where: str, error: type[Exception]) -> Any:
    """The YAML document in `raw`, or `error("WHERE is not valid YAML: why")` on one line."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        # PyYAML explains over several lines (with a caret under the spot); one line keeps the CLI's contract.
        raise error(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None


def parse_json(raw: bytes | str, *, where: str, error: type[Exception]) -> Any:
    """The JSON document in `raw`, or `error("WHERE is not valid JSON: why (line L column C)")`, nesting limited
    (module docstring)."""
    data = _nesting_checked(raw, where, error)
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(not_valid_json(where, exc)) from None


def parse_json_line(line: str, *, where: str, error: type[Exception]) -> Any:
    """One line of a JSONL file, `where` naming it (`FILE:N`, `line N`); refused in `parse_json`'s words."""
    _nesting_checked(line, where, error)
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(not_valid_json(where, exc, one_line=True)) from None


def _nesting_checked(raw: bytes | str, where: str, error: type[Exception]) -> bytes:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        check_depth(data)
    except RequestError as exc:
        # The request wording leads with the JSON path; a file is pointed at by line and column instead.
        raise error(f"{where} is not valid JSON: {exc.message.rsplit(': ', 1)[-1]}") from None
    return data


def validated(model: type[Model], data: Any, *, error: type[Exception], prefix: str, top: str = "top level") -> Model:
    """`data` as `model`, or `error("PREFIX: where: what")` for its first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{prefix}: {first_validation_error(exc, top=top)}") from None
