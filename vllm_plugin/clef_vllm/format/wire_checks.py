"""Annotations that write a rule of the SystemOne body once: the JSON Schema keywords /openapi.json shows and
the check validation applies, with the message a client reads.

A `Bound` names the `Limits` field that holds its value under `LIMITS_KEYWORD` and checks the count against the
server's `Limits`, handed to validation as its context; `resolve_limits` writes a server's values into the
document. A check refuses with `refused`, whose message `wire_errors` passes on whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import (
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from clef_vllm.format.limits import DEFAULT_LIMITS, Limits

# The JSON Schema keyword under which a bound names the `Limits` field that holds its value (see `Bound`).
LIMITS_KEYWORD = "x-clef-limits"
# The pydantic error type of a refusal whose message is written here, whole (see `wire_errors`).
REFUSED = "clef_refused"


def resolve_limits(schema: Any, limits: Limits) -> Any:
    """`schema` with every `Bound` keyword replaced by its value under `limits`."""
    if isinstance(schema, list):
        return [resolve_limits(item, limits) for item in schema]
    if not isinstance(schema, dict):
        return schema
    resolved = {key: resolve_limits(value, limits) for key, value in schema.items() if key != LIMITS_KEYWORD}
    for keyword, bound in schema.get(LIMITS_KEYWORD, {}).items():
        resolved[keyword] = getattr(limits, bound) if isinstance(bound, str) else bound
    return resolved


def refused(message: str, named: bool = False) -> PydanticCustomError:
    """A refusal in our own words; `wire_errors.from_validation_error` adds the question it is about, and with
    `named` the field it is about at the front."""
    return PydanticCustomError(REFUSED, "{message}", {"message": message, "named": named})


def _limits_of(info: ValidationInfo) -> Limits:
    context = info.context if isinstance(info.context, dict) else {}
    return context.get("limits", DEFAULT_LIMITS)


@dataclass(frozen=True)
class Bound:
    """A count (items, properties) or a length, written once: the JSON Schema keywords /openapi.json shows and
    the check validation applies. `at_least` and `at_most` are `Limits` field names or numbers; the messages are
    formatted with `count`, `value` (cut to 40 characters), `at_least` and `at_most`."""

    keywords: tuple[str | None, str | None]  # the JSON Schema keywords of the lower and the upper bound, if any
    at_least: str | int
    at_most: str | int | None
    too_many: str = ""
    too_few: str = ""
    empty: str | None = None  # for a count of 0, when it needs other words than `too_few`
    off: str | None = None  # for any count when the upper bound is 0 (the server switched the thing off)
    named: bool = False  # the message follows the field's name ("videos[0] has ...")

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        document = handler(schema)
        bounds = zip(self.keywords, (self.at_least, self.at_most), strict=True)
        document[LIMITS_KEYWORD] = {keyword: bound for keyword, bound in bounds if keyword is not None}
        return document

    def problem(self, count: int, limits: Limits, value: Any = None) -> str | None:
        """Why `count` is refused under `limits`, or None."""
        low, high = (getattr(limits, b) if isinstance(b, str) else b for b in (self.at_least, self.at_most))
        template = None
        if high is not None and count > high:
            template = self.off if high == 0 and self.off else self.too_many
        elif count < low:
            template = self.empty if count == 0 and self.empty else self.too_few
        if template is None:
            return None
        shown = value[:40] if isinstance(value, str) else ""
        return template.format(count=count, value=shown, at_least=low, at_most=high)

    def _check(self, value: Any, info: ValidationInfo) -> Any:
        problem = self.problem(len(value), _limits_of(info), value)
        if problem is not None:
            raise refused(problem, self.named)
        return value


@dataclass(frozen=True)
class Unique:
    """List items that must differ (`uniqueItems`), with the message naming the first repeated one."""

    message: str  # formatted with `value`

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "uniqueItems": True}

    def _check(self, value: list[Any]) -> list[Any]:
        seen: set[Any] = set()
        for item in value:
            if item in seen:
                raise refused(self.message.format(value=str(item)[:60]))
            seen.add(item)
        return value


@dataclass(frozen=True)
class Shape:
    """What a value that has the wrong shape is told (the types pydantic would list mean little to a client);
    a refusal from inside the value (an id, a count) is kept as it is."""

    message: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._check, handler(source))

    named: bool = False  # the message follows the field's name ("images[0] must be ...")
    when: tuple[str, ...] | None = None  # only these pydantic errors are told in `message` (None: any)

    def _check(self, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            kinds = {error["type"] for error in exc.errors()}
            if REFUSED in kinds or (self.when is not None and not kinds & set(self.when)):
                raise
            raise refused(self.message, self.named) from None
