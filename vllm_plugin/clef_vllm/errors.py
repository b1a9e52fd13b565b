"""Errors that describe something wrong with what a user or client gave us.

Each carries a message meant to be shown as it is: one line, naming the field or file at fault.
"""

from __future__ import annotations

import json

# What a command exits with when what it was given is wrong (argparse and click use 2 for usage errors too).
USAGE_EXIT = 2


def usage_error_line(message: str) -> str:
    """The one line a command (clef-systemone, clef-quant) prints on stderr when it refuses its input."""
    return f"error: {message}"


def first_validation_error(exc: Exception, top: str = "top level") -> str:
    """A pydantic ValidationError as one line: where the first problem is, what it is, and how many more."""
    errors = exc.errors(include_url=False)  # type: ignore[attr-defined]
    error = errors[0]
    where = ".".join(str(part) for part in error["loc"]) or top
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {error['msg']}{more}"


def not_valid_json(where: str, exc: json.JSONDecodeError | UnicodeDecodeError, *, one_line: bool = False) -> str:
    """The one wording for text that does not parse as JSON, whatever holds it (a request body, a file, one line of
    a JSONL file): `WHERE is not valid UTF-8 at byte N`, or `WHERE is not valid JSON: why (line L column C)`, the
    line left out for one line of a file (`where` names that line)."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{where} is not valid UTF-8 at byte {exc.start}"
    at = f"column {exc.colno}" if one_line else f"line {exc.lineno} column {exc.colno}"
    return f"{where} is not valid JSON: {exc.msg} ({at})"


class ClefError(Exception):
    """Base class: a problem with user input, never a bug in our code."""


class RequestError(ClefError):
    """A SystemOne request that breaks the format or a limit; `field` names where (e.g. `questions.q1.criteria`)
    and `code` is a stable machine-readable reason that clients can switch on."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code


class SchemaTooLongError(RequestError):
    """The prompt without its state already exceeds the maximum length."""

    def __init__(self, required: int, maximum: int) -> None:
        super().__init__(
            f"schema requires {required} tokens before state; maximum is {maximum}", "questions", "schema_too_long"
        )
        self.required = required
        self.maximum = maximum


class SchemaTextTooLongError(SchemaTooLongError):
    """A schema text, or the schema in all, with more characters than the maximum length can hold; refused
    before it is tokenized. `field` names the text (`questions.q1.instructions`), or `questions` for the sum."""

    def __init__(self, message: str, field: str, characters: int, maximum_characters: int) -> None:
        RequestError.__init__(self, message, field, "schema_too_long")
        self.required = characters
        self.maximum = maximum_characters


class CheckpointError(ClefError):
    """A release folder or head file that is missing, incomplete or inconsistent."""


class SettingsError(ClefError):
    """Engine or server settings that contradict each other."""
