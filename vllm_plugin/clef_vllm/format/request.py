"""The SystemOne request: `parse_request` turns a body into a `ClefRequest` under a server's `Limits`.

The body is validated through the wire models (`wire_models`, the ones /openapi.json shows, whose bounds and
messages are written once in `wire_checks`); a refusal leaves as one `RequestError` naming the field
(`wire_errors`). The `ClefRequest` holds every question's options already in the order the model sees them,
so encoding and answer mapping never re-derive that order, and its media undecoded (`request_media`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from clef_vllm.errors import RequestError, SchemaTextTooLongError
from clef_vllm.format.limits import DEFAULT_LIMITS, SCHEMA_CHARS_PER_TOKEN, Limits, schema_chars_limit
from clef_vllm.format.media import MediaData, refuse_audio
from clef_vllm.format.request_media import VideoData, asset_images, media_data, video_data
from clef_vllm.format.schema import QuestionType
from clef_vllm.format.text import option_text, render
from clef_vllm.format.wire_errors import from_validation_error
from clef_vllm.format.wire_models import (
    IMAGES,
    ChoiceQuestion,
    NoulCriteria,
    NoulQuestion,
    ScoreQuestion,
    SystemOneRequest,
)

# `Limits` and `DEFAULT_LIMITS` are `parse_request`'s parameter and its default, so callers of the entry point
# find them here; they are defined in `limits`.
__all__ = [
    "DEFAULT_LIMITS",
    "ClefRequest",
    "Limits",
    "Option",
    "Question",
    "check_schema_chars",
    "parse_request",
]


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
    images: tuple[MediaData, ...] = ()  # `images`, then `assets` in order of first reference
    videos: tuple[VideoData, ...] = ()
    record_id: str = "unknown"

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos)


def parse_request(
    body: object, limits: Limits = DEFAULT_LIMITS, parts: Mapping[str, bytes] | None = None
) -> ClefRequest:
    """Validate a JSON body and return the request with every question's options in model order.

    `parts` are the named file parts of a multipart request, referenced by media objects as `{"part": name}`.
    Media stay undecoded here (`clef_vllm.format.media` decodes them while encoding). Raises `RequestError` with a
    message that names the field at fault.
    """
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    refuse_audio(body)
    _refuse_box_questions(body.get("questions"))
    try:
        wire = SystemOneRequest.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    questions = tuple(_question(qid, q) for qid, q in wire.questions.items())
    parts = parts or {}
    images = [media_data(value, f"images[{i}]", parts, "image") for i, value in enumerate(wire.images or ())]
    if wire.assets:  # the prompt's text is rendered only to order assets (a state may run to megabytes)
        images += asset_images(wire.assets, _prompt_text(wire.state, questions), parts)
    videos = [video_data(value, f"videos[{i}]", parts) for i, value in enumerate(wire.videos or ())]
    if assets_too := IMAGES.problem(len(images), limits):  # `images` alone was checked; with its assets now
        raise RequestError(assets_too, "images")
    return ClefRequest(
        model=wire.model,
        state=wire.state,
        questions=questions,
        images=tuple(images),
        videos=tuple(videos),
        record_id=str(body.get("id", "unknown")),
    )


def check_schema_chars(request: ClefRequest, max_length: int) -> None:
    """Refuse instructions and option texts (as the model reads them) longer than `schema_chars_limit`, one by
    one and in all, before anything is tokenized. Raises `SchemaTextTooLongError` naming the text."""
    limit = schema_chars_limit(max_length)
    why = f"{SCHEMA_CHARS_PER_TOKEN} per token of the maximum length {max_length:,}"
    total = 0
    for question in request.questions:
        where = f"questions.{question.id}"
        instructions = question.instructions
        texts = [(f"{where}.instructions", "" if instructions is None or instructions == "" else render(instructions))]
        for index, option in enumerate(question.options):
            place = f"[{index}]" if question.type is QuestionType.SCORE else f".{option.id}"
            texts.append((f"{where}.criteria{place}", option_text(option.id, option.description)))
        for name, text in texts:
            if len(text) > limit:
                message = f"{name} has {len(text):,} characters; at most {limit:,} ({why})"
                raise SchemaTextTooLongError(message, name, len(text), limit)
            total += len(text)
    if total > limit:
        message = f"schema texts have {total:,} characters in all; at most {limit:,} ({why})"
        raise SchemaTextTooLongError(message, "questions", total, limit)


def _refuse_box_questions(questions: object) -> None:
    if not isinstance(questions, dict):
        return
    for qid, question in questions.items():
        if isinstance(question, dict) and question.get("type") == "box":
            raise RequestError(
                f'question "{qid}": type box (an image region) is not supported: the Clef head has no region output',
                f"questions.{qid}.type",
            )


def _prompt_text(state: Any, questions: tuple[Question, ...]) -> str:
    """The strings of the prompt as the model reads them, where asset placeholders are looked for."""
    texts = [render(state)]
    for question in questions:
        texts.append(render(question.instructions) if question.instructions is not None else "")
        texts.extend(render(option.description) for option in question.options if option.description is not None)
    return "\n".join(texts)


def _question(qid: str, body: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> Question:
    """The validated question with its options in the order the model sees them."""
    qtype = QuestionType[body.type.upper()]
    if isinstance(body, NoulQuestion):
        given = body.criteria or NoulCriteria()
        options = (Option("true", given.true), Option("false", given.false))
        return Question(qid, qtype, body.instructions, options, ("true", "false"))
    if isinstance(body, ChoiceQuestion):
        # A list of option names is options without descriptions, read as the release reads a null description.
        criteria = body.criteria if isinstance(body.criteria, dict) else dict.fromkeys(body.criteria)
        options = tuple(Option(key, criteria[key]) for key in sorted(criteria, key=str))
        return Question(qid, qtype, body.instructions, options, tuple(criteria))
    options = tuple(Option(str(level), value) for level, value in enumerate(body.criteria))
    return Question(qid, qtype, body.instructions, options, tuple(o.id for o in options))
