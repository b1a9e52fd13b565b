"""The SystemOne request: wire schema, the release's checks and the limits a server needs.

`parse_request` turns a JSON body into a `ClefRequest` whose questions already hold their options in the
order the model sees them, so encoding and answer mapping never re-derive that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictStr, ValidationError

from clef_vllm.errors import RequestError

MAX_QUESTIONS = 64
MAX_CHOICE_OPTIONS = 256
MAX_SCORE_LEVELS = 256
MIN_OPTIONS = 1  # the release and the SystemOne schema accept a one-option choice and a one-level score
MAX_ID_LENGTH = 100

NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}


class QuestionType(IntEnum):
    """Type ids as the head's `type_embedding` indexes them."""

    NOUL = 0
    CHOICE = 1
    SCORE = 2


@dataclass(frozen=True)
class Limits:
    """Server-side limits; defaults follow the documented limits of the fastest public Clef server."""

    max_questions: int = MAX_QUESTIONS
    max_choice_options: int = MAX_CHOICE_OPTIONS
    max_score_levels: int = MAX_SCORE_LEVELS
    min_options: int = MIN_OPTIONS
    max_id_length: int = MAX_ID_LENGTH


DEFAULT_LIMITS = Limits()


class QuestionBody(BaseModel):
    """One question as a client sends it."""

    model_config = ConfigDict(extra="allow")

    type: Literal["noul", "choice", "score"]
    instructions: JsonValue = Field(default=None, description="Any JSON; the question id when missing or empty")
    criteria: dict[str, JsonValue] | list[JsonValue] | None = Field(
        default=None,
        description="choice: option id -> description; score: level descriptions; noul: optional true/false overrides",
    )


class SystemOneRequestBody(BaseModel):
    """The `POST /v1/systemone` body (Jev / SystemOne)."""

    model_config = ConfigDict(extra="allow")

    # Optional, but a string when given: an explicit null is refused (the default is not validated).
    model: StrictStr = Field(default=None, description="Echoed in the response; the served name when absent")  # type: ignore[assignment]
    state: JsonValue = Field(description="Any JSON; rendered as text, cut from its end when too long")
    images: list[str] | None = Field(default=None, description="Base64 images or data URLs")
    videos: list[list[str]] | None = Field(default=None, description="Videos as lists of base64 frames")
    questions: dict[str, QuestionBody] = Field(description="Question id -> question, in the order to encode")


@dataclass(frozen=True)
class Option:
    id: str
    description: Any  # None means the option has no description key


@dataclass(frozen=True)
class Question:
    id: str
    type: QuestionType
    instructions: Any
    options: tuple[Option, ...]  # the order the model sees
    answer_order: tuple[str, ...]  # the order the answer lists them (the request's)

    @property
    def type_name(self) -> str:
        return self.type.name.lower()


@dataclass(frozen=True)
class ClefRequest:
    model: str | None  # None when the client left it out; servers answer with their served name
    state: Any
    questions: tuple[Question, ...]
    images: tuple[str, ...] = ()
    videos: tuple[tuple[str, ...], ...] = ()
    record_id: str = "unknown"

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos)


def parse_request(body: object, limits: Limits = DEFAULT_LIMITS) -> ClefRequest:
    """Validate a JSON body and return the request with every question's options in model order.

    Raises `RequestError` with a message that names the field at fault.
    """
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if "state" not in body:
        raise RequestError("state is required", field="state")
    try:
        wire = SystemOneRequestBody.model_validate(body)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    if not wire.questions:
        raise RequestError("questions must be a non-empty object", field="questions")
    if len(wire.questions) > limits.max_questions:
        raise RequestError(
            f"too many questions: {len(wire.questions)} (at most {limits.max_questions})", field="questions"
        )
    questions = tuple(_question(qid, q, limits) for qid, q in wire.questions.items())
    return ClefRequest(
        model=wire.model,
        state=wire.state,
        questions=questions,
        images=tuple(wire.images or ()),
        videos=tuple(tuple(v) for v in wire.videos or ()),
        record_id=str(body.get("id", "unknown")),
    )


def _question(qid: str, body: QuestionBody, limits: Limits) -> Question:
    where = f"questions.{qid}"
    _check_id(qid, f'question id "{qid}"', where, limits)
    qtype = QuestionType[body.type.upper()]
    criteria = body.criteria
    if qtype is QuestionType.NOUL:
        if criteria is not None and not isinstance(criteria, dict):
            raise RequestError(
                f'question "{qid}": noul criteria must be an object with true/false', f"{where}.criteria"
            )
        overrides = criteria or {}
        options = tuple(Option(key, overrides.get(key, default)) for key, default in NOUL_DEFAULTS.items())
        return Question(qid, qtype, body.instructions, options, ("true", "false"))
    if not criteria:
        raise RequestError(f'question "{qid}": {body.type} needs non-empty criteria', f"{where}.criteria")
    if qtype is QuestionType.CHOICE:
        if not isinstance(criteria, dict):
            raise RequestError(
                f'question "{qid}": choice criteria must be an object of option id -> description',
                f"{where}.criteria",
            )
        _check_count(qid, len(criteria), "options", limits.max_choice_options, where, limits)
        for option_id in criteria:
            _check_id(option_id, f'question "{qid}": option id "{option_id}"', f"{where}.criteria", limits)
        options = tuple(Option(key, criteria[key]) for key in sorted(criteria, key=str))
        return Question(qid, qtype, body.instructions, options, tuple(criteria))
    if not isinstance(criteria, list):
        raise RequestError(
            f'question "{qid}": score criteria must be a list of level descriptions', f"{where}.criteria"
        )
    _check_count(qid, len(criteria), "levels", limits.max_score_levels, where, limits)
    options = tuple(Option(str(level), value) for level, value in enumerate(criteria))
    return Question(qid, qtype, body.instructions, options, tuple(o.id for o in options))


def _check_id(value: str, what: str, where: str, limits: Limits) -> None:
    if not value:
        raise RequestError(f"{what} must be a non-empty string", where)
    if len(value) > limits.max_id_length:
        raise RequestError(f"{what[:60]}... is longer than {limits.max_id_length} characters", where)


def _check_count(qid: str, count: int, noun: str, maximum: int, where: str, limits: Limits) -> None:
    if count < limits.min_options:
        raise RequestError(
            f'question "{qid}": needs at least {limits.min_options} {noun}, got {count}', f"{where}.criteria"
        )
    if count > maximum:
        raise RequestError(f'question "{qid}": too many {noun}: {count} (at most {maximum})', f"{where}.criteria")


def _from_validation_error(exc: ValidationError) -> RequestError:
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"] if not str(part).startswith(("function-", "list[", "dict["))]
    # pydantic appends union member names to the location; keep only the path into the body.
    field = ".".join(loc)
    message = error["msg"]
    if len(loc) >= 2 and loc[0] == "questions":
        qid, inner = loc[1], ".".join(loc[2:]) or "question"
        if error["type"] == "missing":
            return RequestError(f'question "{qid}": {inner} is required', field)
        return RequestError(f'question "{qid}": {inner}: {message}', field)
    if error["type"] == "missing":
        return RequestError(f"{field} is required", field)
    return RequestError(f"{field}: {message}", field)
