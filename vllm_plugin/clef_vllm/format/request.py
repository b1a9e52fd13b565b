"""The SystemOne request: wire schema, the release's checks and the limits a server needs.

`parse_request` validates a body through the models below, the ones /openapi.json shows, and turns it into a
`ClefRequest` whose questions already hold their options in the order the model sees them, so encoding and
answer mapping never re-derive that order. Each limit is a `Bound` in a model's annotation, written once: it
puts its JSON Schema keywords (naming the `Limits` field) into the document and checks the count against the
server's `Limits`, handed to validation as its context, with a message naming the field.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    StrictStr,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from clef_vllm.errors import RequestError, SchemaTextTooLongError
from clef_vllm.format.media import DEFAULT_MEDIA_LIMITS, MIN_VIDEO_FRAMES, MediaData, MediaLimits, refuse_audio
from clef_vllm.format.schema import QuestionType, QuestionTypeName
from clef_vllm.format.text import option_text, render

NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}


@dataclass(frozen=True)
class Limits:
    """Server-side limits; defaults follow the documented limits of the fastest public Clef server."""

    max_questions: int = 64
    max_choice_options: int = 256
    max_score_levels: int = 256
    min_options: int = 1  # the release and the SystemOne schema accept a one-option choice and a one-level score
    max_id_length: int = 100
    max_images: int = 8  # per request, `images` and `assets` together; 0 switches images off
    max_videos: int = 2  # per request; 0 switches videos off
    media: MediaLimits = field(default_factory=lambda: DEFAULT_MEDIA_LIMITS)

    @property
    def media_enabled(self) -> bool:
        return self.max_images > 0 or self.max_videos > 0


DEFAULT_LIMITS = Limits()

# Schema texts are refused, before they are tokenized, past this many characters per token of the maximum
# length (English runs about 4): tokenizing 12 MB of instructions only to find they do not fit took 15 s.
SCHEMA_CHARS_PER_TOKEN = 32
# Below this the exact token count is cheap and decides alone (one tokenizer call, see state_cut).
MIN_SCHEMA_CHARS = 65_536


def schema_chars_limit(max_length: int) -> int:
    """Characters a schema text, and the schema in all, may have at `max_length` tokens."""
    return max(SCHEMA_CHARS_PER_TOKEN * max_length, MIN_SCHEMA_CHARS)


# The JSON Schema keyword under which a bound names the `Limits` field that holds its value (see `Bound`).
LIMITS_KEYWORD = "x-clef-limits"
# The pydantic error type of a refusal whose message is written here, whole (see `_from_validation_error`).
REFUSED = "clef_refused"

SCHEMA_TEXT = (
    f"as text (JSON rendered compactly), instructions and each option at most {SCHEMA_CHARS_PER_TOKEN} characters "
    f"per token of the server's max model length (never fewer than {MIN_SCHEMA_CHARS:,}), and all of them together "
    "the same, else 400 schema_too_long naming the text"
)


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
    """A refusal in our own words; `_from_validation_error` adds the question it is about, and with `named` the
    field it is about at the front."""
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


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an absent field means something other than null


def _id(what: str) -> Bound:
    return Bound(
        ("minLength", "maxLength"),
        1,
        "max_id_length",
        too_few=f'{what} "{{value}}" must be a non-empty string',
        too_many=f'{what} "{{value}}..." is longer than {{at_most}} characters',
    )


QuestionId = Annotated[str, _id("question id")]
OptionId = Annotated[str, _id("option id")]


def _options(kind: str, noun: str, keywords: tuple[str, str], most: str) -> Bound:
    return Bound(
        keywords,
        "min_options",
        most,
        too_few=f"needs at least {{at_least}} {noun}, got {{count}}",
        too_many=f"too many {noun}: {{count}} (at most {{at_most}})",
        empty=f"{kind} needs non-empty criteria",
    )


class QuestionFields(BaseModel):
    """What every question has, whatever its type."""

    model_config = ConfigDict(extra="allow")

    instructions: JsonValue = Field(
        default=None, description="Any JSON; the question id when missing or empty; " + SCHEMA_TEXT
    )


class NoulCriteria(BaseModel):
    """Descriptions of the two answers; other keys are ignored."""

    model_config = ConfigDict(extra="allow")

    true: JsonValue = Field(default=NOUL_DEFAULTS["true"], description="The description of `true`")
    false: JsonValue = Field(default=NOUL_DEFAULTS["false"], description="The description of `false`")


class NoulQuestion(QuestionFields):
    """A proposition: the answer is the probability that it is true."""

    type: Literal["noul"]
    criteria: Annotated[NoulCriteria | None, Shape("noul criteria must be an object with true/false")] = Field(
        default=None, description="Optional descriptions of `true` and `false`"
    )


class ChoiceQuestion(QuestionFields):
    """One option out of several: the answer is the option and every option's probability."""

    type: Literal["choice"]
    criteria: Annotated[
        Annotated[
            dict[OptionId, JsonValue],
            Field(description="Option id -> description (any JSON; null for none)"),
            _options("choice", "options", ("minProperties", "maxProperties"), "max_choice_options"),
        ]
        | Annotated[
            list[OptionId],
            Field(description="Option ids without descriptions (read as null descriptions)"),
            Unique('option "{value}" is listed twice in criteria'),
            _options("choice", "options", ("minItems", "maxItems"), "max_choice_options"),
        ],
        Shape("choice criteria must be an object of option id -> description or a list of option names (strings)"),
    ] = Field(description="The options, in the order the answer lists them")


class ScoreQuestion(QuestionFields):
    """A level on a scale: the answer is the expected level and every level's probability."""

    type: Literal["score"]
    criteria: Annotated[
        list[JsonValue],
        _options("score", "levels", ("minItems", "maxItems"), "max_score_levels"),
        Shape("score criteria must be a list of level descriptions"),
    ] = Field(description="Level descriptions, level 0 first")


AnyQuestion = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]
QUESTION_TYPES = typing.get_args(QuestionTypeName)


class MediaObject(BaseModel):
    """The object form of an image, video or frame that some clients send instead of a plain string: exactly one
    of data, base64, data_base64 or part; the media type from media_type, content_type or format."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["image", "video"] | None = Field(
        default=None, description="What the item is (SDKs send it); must match where the item is"
    )
    data: StrictStr | None = Field(default=None, description="Base64 data or a data: URL")
    base64_data: StrictStr | None = Field(default=None, alias="base64")
    data_base64: StrictStr | None = None
    part: StrictStr | None = Field(default=None, description="Name of a part of a multipart request")
    media_type: StrictStr | None = None
    content_type: StrictStr | None = None
    format: StrictStr | None = Field(default=None, description="e.g. png, jpeg, mp4 (informative)")


# Tags of the media unions (pydantic puts them into error locations; `_body_path` drops them).
_STRING, _OBJECT, _FILE, _FRAMES = "media:string", "media:object", "video:file", "video:frames"
MEDIA_SHAPE = "must be a base64 string, a data: URL or an object with data_base64"


def _media_form(value: Any) -> str | None:
    return _STRING if isinstance(value, str) else _OBJECT if isinstance(value, dict) else None


def _video_form(value: Any) -> str:
    return _FRAMES if isinstance(value, list) else _FILE


# What pydantic says when a value is none of a tagged union's forms; told in our words instead (see `Shape`).
NO_FORM = ("union_tag_not_found", "union_tag_invalid")


Media = Annotated[
    Annotated[StrictStr, Tag(_STRING), Field(description="Base64 data or a data: URL")]
    | Annotated[MediaObject, Tag(_OBJECT)],
    Discriminator(_media_form),
    Shape(MEDIA_SHAPE, named=True, when=NO_FORM),
]
Frames = Annotated[
    list[Media],
    Field(description="Frames taken as already sampled"),
    Bound(
        ("minItems", None),
        MIN_VIDEO_FRAMES,
        None,
        too_few="has {count} frames; a video needs at least {at_least}",
        named=True,
    ),
]
Video = Annotated[Annotated[Media, Tag(_FILE)] | Annotated[Frames, Tag(_FRAMES)], Discriminator(_video_form)]
IMAGES = Bound(
    (None, "maxItems"),
    0,
    "max_images",
    too_many="too many images: {count} (at most {at_most} per request, assets included)",
    off="images are switched off on this server (--limit-images 0)",
)
VIDEOS = Bound(
    (None, "maxItems"),
    0,
    "max_videos",
    too_many="too many videos: {count} (at most {at_most} per request)",
    off="videos are switched off on this server (--limit-videos 0)",
)


class SystemOneRequest(BaseModel):
    """The `POST /v1/systemone` body (Jev / SystemOne)."""

    model_config = ConfigDict(extra="allow")

    # Optional, but a string when given: an explicit null is refused (the default is not validated).
    model: StrictStr = Field(  # type: ignore[assignment]
        default=None, description="Echoed in the response; the served name when absent", json_schema_extra=_no_default
    )
    state: JsonValue = Field(description="Any JSON; rendered as text, cut from its end when too long")
    images: Annotated[list[Media], IMAGES] | None = Field(
        default=None,
        description="Images (PNG, JPEG, WebP, GIF): base64 strings, data URLs or objects {data_base64, format}",
    )
    videos: Annotated[list[Video], VIDEOS] | None = Field(
        default=None,
        description="Videos: each a video file (MP4, WebM, MOV; base64 / data URL / object), sampled as the "
        "checkpoint's video processor samples it, or a list of frames",
    )
    assets: dict[str, Media] | None = Field(
        default=None, description="Placeholder -> image; referenced by the placeholder inside strings"
    )
    questions: Annotated[
        dict[QuestionId, AnyQuestion],
        Bound(
            ("minProperties", "maxProperties"),
            1,
            "max_questions",
            too_few="questions must be a non-empty object",
            too_many="too many questions: {count} (at most {at_most})",
        ),
    ] = Field(description="Question id -> question, in the order to encode")


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


VideoData = MediaData | tuple[MediaData, ...]  # a video file, or frames already sampled


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
        raise _from_validation_error(exc) from None
    questions = tuple(_question(qid, q) for qid, q in wire.questions.items())
    parts = parts or {}
    images = [_media(value, f"images[{i}]", parts, "image") for i, value in enumerate(wire.images or ())]
    images += _assets(wire.assets or {}, wire.state, questions, parts)
    videos = [_video(value, f"videos[{i}]", parts) for i, value in enumerate(wire.videos or ())]
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


def _media(
    item: str | MediaObject, where: str, parts: Mapping[str, bytes], kind: Literal["image", "video"]
) -> MediaData:
    """One image, video file or frame (an image), validated in either wire form."""
    if isinstance(item, str):
        return MediaData(where, item)
    if item.type is not None and item.type != kind:
        raise RequestError(f'{where} has type "{item.type}" where {kind} data belongs', f"{where}.type")
    sources = {
        name: source
        for name, source in (
            ("data", item.data),
            ("base64", item.base64_data),
            ("data_base64", item.data_base64),
            ("part", item.part),
        )
        if source is not None
    }
    if len(sources) != 1:
        raise RequestError(f"{where} needs exactly one of data, base64, data_base64 or part", where)
    media_type = item.media_type or item.content_type or item.format
    ((name, source),) = sources.items()
    if name != "part":
        return MediaData(where, source, media_type)
    if source not in parts:
        raise RequestError(f'{where} names part "{source[:60]}", which the multipart request does not have', where)
    return MediaData(where, parts[source], media_type)


def _video(value: str | MediaObject | list[str | MediaObject], where: str, parts: Mapping[str, bytes]) -> VideoData:
    if isinstance(value, list):
        return tuple(_media(frame, f"{where}[{j}]", parts, "image") for j, frame in enumerate(value))
    return _media(value, where, parts, "video")


def _assets(
    assets: dict[str, str | MediaObject], state: Any, questions: tuple[Question, ...], parts: Mapping[str, bytes]
) -> list[MediaData]:
    """Assets as images, in the order their placeholders first appear in the prompt's text; the release has a
    single place for media (before the state), so the placeholders themselves stay in the text as written.
    Assets that no string references come after the referenced ones, in the order given."""
    if not assets:
        return []
    texts = [render(state)]
    for question in questions:
        texts.append(render(question.instructions) if question.instructions is not None else "")
        texts.extend(render(option.description) for option in question.options if option.description is not None)
    prompt = "\n".join(texts)

    def first_reference(name: str) -> tuple[int, int]:
        position = prompt.find(name) if name else -1
        return (0, position) if position >= 0 else (1, list(assets).index(name))

    order = sorted(assets, key=first_reference)
    return [_media(assets[name], f"assets.{name}", parts, "image") for name in order]


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


def _from_validation_error(exc: ValidationError) -> RequestError:
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
