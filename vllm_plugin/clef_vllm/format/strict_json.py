"""Strict JSON for request bodies: refuse what `json.loads` would let through or choke on.

RFC 8259 JSON only: no `NaN`/`Infinity`, no number that overflows a double, no integer longer than
`MAX_INTEGER_DIGITS`, no lone UTF-16 surrogate escape, no duplicate key, and no nesting deeper than
`MAX_DEPTH` (checked on the raw bytes before parsing, so the parser never recurses past it). Every refusal
is a `RequestError` whose `field` names the place (`state.items[3].price`) or, for nesting, the line and
column where the limit was crossed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from clef_vllm.errors import RequestError, not_valid_json

MAX_DEPTH = 64
MAX_INTEGER_DIGITS = 100

# A JSON string literal (unrolled loop: no backtracking blow-up on long strings).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# A UTF-16 surrogate escape, when an even number of backslashes comes before it (so it is an escape, not text).
# The pattern starts with a literal, so `re` skips to candidates: a 12 MB string is searched in milliseconds, not
# the seconds (with the GIL held, stalling every request) that a leading lookbehind costs.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


class _Bad:
    """Stands in for a refused value during parsing, so the walk afterwards can name where it was."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message


class _Object(dict):
    duplicate: str | None = None


def loads(raw: bytes) -> Any:
    """Parse a request body; raise `RequestError` (400) for anything that is not strict JSON."""
    check_depth(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(not_valid_json("body", exc), None, "invalid_json") from None
    suspicious = False

    def on_constant(name: str) -> _Bad:
        nonlocal suspicious
        suspicious = True
        return _Bad("invalid_number", f"{name} is not a JSON number")

    def on_float(literal: str) -> float | _Bad:
        value = float(literal)
        if math.isinf(value):
            nonlocal suspicious
            suspicious = True
            return _Bad("invalid_number", f"number {literal[:40]} overflows a 64-bit float")
        return value

    def on_int(literal: str) -> int | _Bad:
        if len(literal.lstrip("-")) > MAX_INTEGER_DIGITS:
            nonlocal suspicious
            suspicious = True
            return _Bad("invalid_number", f"integer of {len(literal)} digits (at most {MAX_INTEGER_DIGITS})")
        return int(literal)

    def on_object(pairs: list[tuple[str, Any]]) -> _Object:
        result = _Object(pairs)
        if len(result) != len(pairs):
            nonlocal suspicious
            suspicious = True
            seen: set[str] = set()
            result.duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        return result

    try:
        value = json.loads(
            text, parse_constant=on_constant, parse_float=on_float, parse_int=on_int, object_pairs_hook=on_object
        )
    except json.JSONDecodeError as exc:
        raise RequestError(not_valid_json("body", exc), None, "invalid_json") from None
    except RecursionError:  # only reachable for malformed bodies the depth scan could not read
        raise RequestError(f"JSON nested more than {MAX_DEPTH} levels deep", None, "json_too_deep") from None
    if suspicious or _has_surrogate_escape(raw):
        _refuse_first_bad(value, "")
    return value


def _has_surrogate_escape(raw: bytes) -> bool:
    for match in _SURROGATE_ESCAPE.finditer(raw):
        start = before = match.start()
        while before > 0 and raw[before - 1] == 0x5C:  # backslash
            before -= 1
        if (start - before) % 2 == 0:
            return True
    return False


def check_depth(raw: bytes) -> None:
    """Refuse nesting deeper than `MAX_DEPTH` without parsing: strings are blanked, brackets counted."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    skeleton = _STRING.sub(b"0", raw)
    depth = np.cumsum(_BRACKET_STEP[np.frombuffer(skeleton, dtype=np.uint8)], dtype=np.int32)
    too_deep = np.flatnonzero(depth > MAX_DEPTH)
    if too_deep.size == 0:
        return
    offset = _original_offset(raw, int(too_deep[0]))
    line = raw.count(b"\n", 0, offset) + 1
    column = offset - (raw.rfind(b"\n", 0, offset) + 1) + 1
    path = _short(_path_at(raw, offset))
    raise RequestError(
        f"{path or 'body'}: JSON nested more than {MAX_DEPTH} levels deep (line {line} column {column})",
        path or None,
        "json_too_deep",
    )


def _original_offset(raw: bytes, skeleton_offset: int) -> int:
    """Map an offset in the string-blanked skeleton back to the raw body."""
    shift = 0
    for match in _STRING.finditer(raw):
        if match.start() - shift > skeleton_offset:
            break
        shift += len(match.group()) - 1
    return skeleton_offset + shift


def _path_at(raw: bytes, offset: int) -> str:
    """The JSON path of the container open at `offset`, read from the tokens before it."""
    frames: list[list[Any]] = []  # [key or index, is_object]
    expect_key = False
    for token in _TOKEN.finditer(raw, 0, offset):
        text = token.group()
        if text in (b"{", b"["):
            frames.append([None if text == b"{" else 0, text == b"{"])
            expect_key = text == b"{"
        elif text in (b"}", b"]"):
            if frames:
                frames.pop()
        elif text == b",":
            if frames and not frames[-1][1]:
                frames[-1][0] += 1
            expect_key = bool(frames and frames[-1][1])
        elif text == b":":
            expect_key = False
        elif expect_key and frames:
            frames[-1][0] = json.loads(text).encode("utf-8", "backslashreplace").decode("utf-8")
    path = ""
    for key, is_object in frames:
        path += (f".{key}" if path else str(key)) if is_object else f"[{key}]"
    return path


def _refuse_first_bad(value: Any, path: str) -> None:
    """Walk the parsed body in document order and raise for the first refused value, naming its path."""
    if isinstance(value, _Bad):
        path = _short(path)
        raise RequestError(f"{path or 'body'}: {value.message}", path or None, value.code)
    if isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_first_bad(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        if isinstance(value, _Object) and value.duplicate is not None:
            path = _short(path)
            where = path or "body"
            shown = value.duplicate[:60].encode("utf-8", "backslashreplace").decode("utf-8")
            raise RequestError(f'{where}: duplicate key "{shown}"', path or None, "duplicate_key")
        for key, item in value.items():
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")  # a bad key must not break the message
            child = f"{path}.{shown}" if path else shown
            _check_text(key, child)
            _refuse_first_bad(item, child)


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        path = _short(path)
        raise RequestError(
            f"{path or 'body'}: lone UTF-16 surrogate escape in a string", path or None, "invalid_string"
        ) from None


def _short(path: str, limit: int = 300) -> str:
    """Paths name the place; a very long one (long keys, deep nesting) keeps its two ends."""
    return path if len(path) <= limit else f"{path[: limit - 60]}...{path[-50:]}"
