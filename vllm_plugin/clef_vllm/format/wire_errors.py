"""A body the wire models refuse, told in one line that names the field at fault (`questions.q1.criteria`,
`images[0].type`): pydantic's error list becomes one `RequestError`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from clef_vllm.errors import RequestError
from clef_vllm.format.wire_checks import REFUSED
from clef_vllm.format.wire_models import QUESTION_TYPES


def from_validation_error(exc: ValidationError) -> RequestError:
    """One line naming the field: our own refusal when there is one (a union reports every branch), else
    pydantic's first. Under a question the field goes at most to the question's own field (`questions.q1.
    criteria`), and the message names the question."""
    errors = exc.errors(include_url=False)
    first = _body_path(errors[0])
    error = next((e for e in errors if e["type"] == REFUSED and _body_path(e)[:3] == first[:3]), errors[0])
    loc = _body_path(error)
    kind, message = error["type"], error["msg"]
    if loc[:1] == ["questions"] and len(loc) >= 2:
        qid = str(loc[1])
        if len(loc) == 2 and kind in ("model_attributes_type", "dict_type", "model_type"):
            return RequestError(f'question "{qid}" must be an object with a type', _joined(loc))
        if kind in ("union_tag_not_found", "union_tag_invalid"):
            loc = [*loc[:2], "type"]
            if kind == "union_tag_invalid":
                message = f"must be one of {', '.join(QUESTION_TYPES)}, not {str(error['input'].get('type'))[:40]!r}"
            else:
                kind = "missing"
        field = _joined(loc[:3])
        if loc[2:3] == ["[key]"]:  # the question id itself
            return RequestError(message, _joined(loc[:2]))
        inner = _joined(loc[2:3]) or "question"
        if kind == REFUSED:
            return RequestError(f'question "{qid}": {message}', field)
        if kind == "missing":
            return RequestError(f'question "{qid}": {inner} is required', field)
        return RequestError(f'question "{qid}": {inner}: {message}', field)
    field = _joined(loc)
    if kind == REFUSED:
        return RequestError(f"{field} {message}" if error.get("ctx", {}).get("named") else message, field)
    if kind == "missing":
        return RequestError(f"{field} is required", field)
    return RequestError(f"{field}: {message}", field)


def _body_path(error: Any) -> list[str | int]:
    """The error's location as a path into the body: pydantic also names union members, validators and the
    tags of tagged unions there."""
    loc = [part for part in error["loc"] if not _is_schema_step(part)]
    if loc[:1] == ["questions"] and len(loc) >= 3 and loc[2] in QUESTION_TYPES:
        del loc[2]
    return loc


def _joined(loc: list[str | int]) -> str:
    """`images[0].type`, `questions.q1.criteria`: indices in brackets, names after dots."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _is_schema_step(part: str | int) -> bool:
    if isinstance(part, int):
        return False
    return part.startswith(
        ("function-", "list[", "dict[", "nullable[", "json-or-python[", "media:", "video:")
    ) or part in ("NoulCriteria", "str")
