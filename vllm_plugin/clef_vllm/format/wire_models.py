"""The `POST /v1/systemone` body as pydantic models: the ones /openapi.json is generated from and the ones
`parse_request` validates a body through, so the document and the checks cannot drift apart. Every limit is a
`wire_checks.Bound` in a model's annotation; `SystemOneRequest` is the body.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, StrictStr, Tag

from clef_vllm.format.limits import MIN_SCHEMA_CHARS, SCHEMA_CHARS_PER_TOKEN
from clef_vllm.format.media import MIN_VIDEO_FRAMES
from clef_vllm.format.schema import QuestionTypeName
from clef_vllm.format.wire_checks import Bound, Shape, Unique

NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}

SCHEMA_TEXT = (
    f"as text (JSON rendered compactly), instructions and each option at most {SCHEMA_CHARS_PER_TOKEN} characters "
    f"per token of the server's max model length (never fewer than {MIN_SCHEMA_CHARS:,}), and all of them together "
    "the same, else 400 schema_too_long naming the text"
)


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


# Tags of the media unions (pydantic puts them into error locations; `wire_errors` drops them).
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
