"""Request validation (clef-format.md "A request", plus server limits) and answer mapping ("The answer")."""

from __future__ import annotations

import base64
import io
import re

import pytest

from clef_vllm.errors import RequestError
from clef_vllm.format.answers import build_response
from clef_vllm.format.limits import Limits
from clef_vllm.format.media import MediaData
from clef_vllm.format.request import parse_request
from clef_vllm.format.schema import QuestionType


def body(questions=None, **overrides):
    request = {
        "model": "clef-test",
        "state": {"text": "hi"},
        "questions": questions or {"q1": {"type": "noul"}},
    }
    request.update(overrides)
    return request


def without(key):
    request = body()
    del request[key]
    return request


def choice(n, qid="q1"):
    return {qid: {"type": "choice", "criteria": {f"o{i}": f"option {i}" for i in range(n)}}}


def score(n, qid="q1"):
    return {qid: {"type": "score", "criteria": [f"level {i}" for i in range(n)]}}


LONG_ID = "x" * 101

# (request body, text the message must contain, field)
BAD_REQUESTS = [
    pytest.param([1, 2], ["JSON object"], None, id="not-a-dict-list"),
    pytest.param("text", ["JSON object"], None, id="not-a-dict-string"),
    pytest.param(None, ["JSON object"], None, id="not-a-dict-null"),
    pytest.param(body(model=5), ["model"], "model", id="model-not-a-string"),
    pytest.param(body(model=None), ["model"], "model", id="model-null"),
    pytest.param(without("state"), ["state", "required"], "state", id="missing-state"),
    pytest.param(without("questions"), ["questions"], "questions", id="missing-questions"),
    pytest.param(body() | {"questions": {}}, ["questions", "non-empty"], "questions", id="empty-questions"),
    pytest.param(body() | {"questions": []}, ["questions"], "questions", id="questions-a-list"),
    pytest.param(body({"q1": {"type": "yesno"}}), ['"q1"', "type"], "questions.q1.type", id="unknown-type"),
    pytest.param(body({"q1": {}}), ["q1", "type"], "questions.q1.type", id="missing-type"),
    pytest.param(body({"q1": "noul"}), ['"q1"'], "questions.q1", id="question-not-an-object"),
    pytest.param(
        body({"q1": {"type": "choice"}}),
        ['"q1"', "criteria"],
        "questions.q1.criteria",
        id="choice-no-criteria",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": {}}}),
        ['"q1"', "criteria"],
        "questions.q1.criteria",
        id="choice-empty-criteria",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": ["a", 2]}}),
        ['"q1"', "object", "option names"],
        "questions.q1.criteria",
        id="choice-criteria-list-not-names",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": ["a", "b", "a"]}}),
        ['"q1"', '"a"', "twice"],
        "questions.q1.criteria",
        id="choice-criteria-list-repeated",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": ["a", ""]}}),
        ['"q1"', "non-empty"],
        "questions.q1.criteria",
        id="choice-criteria-list-empty-name",
    ),
    pytest.param(
        body({"q1": {"type": "score"}}), ['"q1"', "criteria"], "questions.q1.criteria", id="score-no-criteria"
    ),
    pytest.param(
        body({"q1": {"type": "score", "criteria": {"0": "low", "1": "high"}}}),
        ['"q1"', "list"],
        "questions.q1.criteria",
        id="score-criteria-dict",
    ),
    pytest.param(
        body({"q1": {"type": "noul", "criteria": ["yes", "no"]}}),
        ['"q1"', "noul"],
        "questions.q1.criteria",
        id="noul-criteria-list",
    ),
    pytest.param(body(choice(0)), ['"q1"', "non-empty criteria"], "questions.q1.criteria", id="choice-0-options"),
    pytest.param(body(score(0)), ['"q1"', "non-empty criteria"], "questions.q1.criteria", id="score-0-levels"),
    pytest.param(body(choice(257)), ['"q1"', "257", "256"], "questions.q1.criteria", id="choice-257-options"),
    pytest.param(body(score(257)), ['"q1"', "257", "256"], "questions.q1.criteria", id="score-257-levels"),
    pytest.param(
        body({f"q{i}": {"type": "noul"} for i in range(65)}),
        ["questions", "65", "64"],
        "questions",
        id="65-questions",
    ),
    pytest.param(body({"": {"type": "noul"}}), ["question id", "non-empty"], "questions.", id="empty-question-id"),
    pytest.param(
        body({LONG_ID: {"type": "noul"}}),
        ["question id", "xxxxx", "100 characters"],
        f"questions.{LONG_ID}",
        id="101-char-question-id",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": {LONG_ID: "a", "b": "b"}}}),
        ['"q1"', "option id", "100 characters"],
        "questions.q1.criteria",
        id="101-char-option-id",
    ),
    pytest.param(
        body({"q1": {"type": "choice", "criteria": {"": "a", "b": "b"}}}),
        ['"q1"', "option id", "non-empty"],
        "questions.q1.criteria",
        id="empty-option-id",
    ),
    pytest.param(body(images="abc"), ["images"], "images", id="images-not-a-list"),
    pytest.param(body(images=[123]), ["images[0]", "base64"], "images[0]", id="image-not-a-string"),
    pytest.param(body(videos=[123]), ["videos[0]"], "videos[0]", id="video-not-a-file-or-frames"),
    pytest.param(body(videos=[["a", 5]]), ["videos[0][1]"], "videos[0][1]", id="video-frame-not-a-string"),
    pytest.param(
        body(images=[{"data_base64": "a", "data": "b"}]), ["images[0]", "exactly one"], "images[0]", id="two-sources"
    ),
    pytest.param(body(images=[{"format": "png"}]), ["images[0]", "exactly one"], "images[0]", id="no-source"),
    pytest.param(
        body(images=[{"data_base64": "a", "colour": 1}]), ["images[0].colour"], "images[0].colour", id="unknown-key"
    ),
    pytest.param(body(images=[{"part": "p1"}]), ["images[0]", '"p1"'], "images[0]", id="missing-part"),
    pytest.param(
        body(images=[{"type": "video", "data": "a"}]), ["images[0]", '"video"'], "images[0].type", id="image-as-video"
    ),
    pytest.param(
        body(videos=[{"type": "image", "data": "a"}]), ["videos[0]", '"image"'], "videos[0].type", id="video-as-image"
    ),
    pytest.param(
        body(images=[{"type": "audio", "data": "a"}]), ["images[0].type"], "images[0].type", id="unknown-media-type"
    ),
    pytest.param(
        body(assets={"<a>": {"type": "audio", "data": "a"}}), ["assets.<a>.type"], "assets.<a>.type", id="asset-type"
    ),
    pytest.param(
        body(assets={"<logo>": {"format": "png"}}), ["assets.<logo>", "exactly one"], "assets.<logo>", id="asset-empty"
    ),
    pytest.param(
        body({"where": {"type": "box", "instructions": "the cat"}}),
        ['"where"', "box", "region"],
        "questions.where.type",
        id="box-question",
    ),
    pytest.param(body(images=["a"] * 9), ["too many images", "9", "8"], "images", id="nine-images"),
    pytest.param(
        body(images=["a"] * 5, assets={f"<a{i}>": "b" for i in range(4)}),
        ["too many images", "9"],
        "images",
        id="images-plus-assets",
    ),
    pytest.param(body(videos=["a", "b", "c"]), ["too many videos", "3", "2"], "videos", id="three-videos"),
    pytest.param(body(audio="UklGRg=="), ["audio", "not read"], "audio", id="audio-clip"),
    pytest.param(body(audios=[{"data": "UklGRg=="}]), ["audios", "not read"], "audios", id="audio-clips"),
]


def test_no_audio_is_not_refused():
    """What SDKs send when there is no clip (null, an empty list) carries no audio to leave unheard."""
    for empty in (None, [], ""):
        assert parse_request(body(audio=empty, audios=empty)).questions


@pytest.mark.parametrize(("request_body", "needles", "field"), BAD_REQUESTS)
def test_bad_requests_are_refused_naming_the_field(request_body, needles, field):
    with pytest.raises(RequestError) as info:
        parse_request(request_body)
    error = info.value
    for needle in needles:
        assert needle in error.message
    assert error.field == field
    assert str(error) == error.message
    assert "\n" not in error.message
    assert len(error.message) < 300


def png_base64() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 20, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.parametrize(
    ("media", "where", "needle"),
    [
        pytest.param({"images": ["not base64 !!"]}, "images[0]", "base64", id="bad-base64"),
        pytest.param({"images": ["data:image/png;base64,@@@@"]}, "images[0]", "base64", id="bad-data-url"),
        pytest.param({"images": [base64.b64encode(b"hello").decode()]}, "images[0]", "image", id="not-an-image"),
        pytest.param({"images": ["PNG", "B"]}, "images[0]", "base64", id="first-of-two"),
        pytest.param({"videos": [["!!", "!!"]]}, "videos[0][0]", "base64", id="bad-video-frame"),
        pytest.param({"videos": ["!!"]}, "videos[0]", "base64", id="bad-video-file"),
    ],
)
def test_bad_image_data_is_a_request_error(tokenizer, processor, media, where, needle):
    """parse_request keeps media as strings; decoding them (before the model runs) refuses bad data."""
    from clef_vllm.format.encoding import encode_request

    if "images" in media and len(media["images"]) == 2:
        media = {"images": [media["images"][0], png_base64()]}
    request = parse_request(body(**media))
    with pytest.raises(RequestError) as info:
        encode_request(request, tokenizer, processor=processor)
    assert where in info.value.message
    assert needle in info.value.message
    assert info.value.field == where
    assert "\n" not in info.value.message


# --- valid edge cases --------------------------------------------------------------------------------------


def test_64_questions_are_accepted_in_request_order():
    ids = [f"q{i}" for i in reversed(range(64))]
    request = parse_request(body({qid: {"type": "noul"} for qid in ids}))
    assert [q.id for q in request.questions] == ids


def test_256_options_are_accepted_and_sorted_by_string():
    request = parse_request(body({"c": {"type": "choice", "criteria": {str(i): i for i in range(256)}}}))
    (question,) = request.questions
    assert question.type is QuestionType.CHOICE
    assert [o.id for o in question.options] == sorted(str(i) for i in range(256))
    assert list(question.answer_order) == [str(i) for i in range(256)]
    assert all(o.description == int(o.id) for o in question.options)


def test_256_levels_are_accepted():
    request = parse_request(body(score(256, "s")))
    (question,) = request.questions
    assert question.type is QuestionType.SCORE
    assert [o.id for o in question.options] == [str(i) for i in range(256)]
    assert [o.description for o in question.options] == [f"level {i}" for i in range(256)]


def test_two_options_and_100_char_ids_are_accepted():
    qid, oid = "q" * 100, "o" * 100
    request = parse_request(body({qid: {"type": "choice", "criteria": {oid: "a", "b": None}}}))
    assert request.questions[0].id == qid
    assert [o.id for o in request.questions[0].options] == ["b", oid]


def test_one_option_choice_and_one_level_score_are_accepted_as_the_release_does():
    request = parse_request(body(choice(1, "c") | score(1, "s")))
    assert [len(q.options) for q in request.questions] == [1, 1]
    answers = build_response(request, [[1.0], [1.0]], 10)["answers"]
    assert answers["c"] == {"type": "choice", "choice": "o0", "confidence": 1.0, "probabilities": {"o0": 1.0}}
    assert answers["s"]["score"] == 0.0 and answers["s"]["probabilities"] == {"0": 1.0}


def test_model_is_optional_but_a_string_when_given():
    assert parse_request(without("model")).model is None
    assert parse_request(body(model="anything")).model == "anything"


@pytest.mark.parametrize("state", [None, "", 0, [], {}, "text", {"nested": {"deep": [1, None]}}])
def test_any_json_state_is_accepted(state):
    request = parse_request(body(state=state))
    assert request.state == state
    assert type(request.state) is type(state)


def test_noul_defaults_overrides_and_extra_keys():
    request = parse_request(
        body({"n": {"type": "noul", "criteria": {"extra": "ignored", "false": "No!"}}, "d": {"type": "noul"}})
    )
    overridden, default = request.questions
    assert [(o.id, o.description) for o in overridden.options] == [
        ("true", "The proposition is true or the answer is yes."),
        ("false", "No!"),
    ]
    assert [(o.id, o.description) for o in default.options] == [
        ("true", "The proposition is true or the answer is yes."),
        ("false", "The proposition is false or the answer is no."),
    ]


def test_extra_top_level_keys_and_media_are_kept():
    request = parse_request(body(id=5, images=["a"], videos=[["b", "c"], "d"], temperature=0))
    assert request.record_id == "5"
    assert request.images == (MediaData("images[0]", "a"),)
    assert request.videos == (
        (MediaData("videos[0][0]", "b"), MediaData("videos[0][1]", "c")),
        MediaData("videos[1]", "d"),
    )
    assert request.has_media


def test_media_object_forms_and_multipart_parts():
    images = [
        {"data": "A", "media_type": "image/png"},
        {"base64": "B", "content_type": "image/jpeg"},
        {"data_base64": "C", "format": "webp"},
        {"part": "photo", "format": "png"},
    ]
    request = parse_request(body(images=images), parts={"photo": b"raw bytes"})
    assert request.images == (
        MediaData("images[0]", "A", "image/png"),
        MediaData("images[1]", "B", "image/jpeg"),
        MediaData("images[2]", "C", "webp"),
        MediaData("images[3]", b"raw bytes", "png"),
    )


def test_media_objects_may_say_what_they_are():
    """SDKs send `type` in media and asset objects: `{"type": "image", "part": "asset-0"}`."""
    request = parse_request(
        body(
            images=[{"type": "image", "data_base64": "A", "format": "png"}],
            videos=[{"type": "video", "data": "V"}, [{"type": "image", "data": "F0"}, {"type": "image", "data": "F1"}]],
            assets={"<image:1>": {"type": "image", "part": "asset-0"}},
        ),
        parts={"asset-0": b"raw"},
    )
    assert request.images == (MediaData("images[0]", "A", "png"), MediaData("assets.<image:1>", b"raw"))
    assert request.videos == (
        MediaData("videos[0]", "V"),
        (MediaData("videos[1][0]", "F0"), MediaData("videos[1][1]", "F1")),
    )


def test_choice_criteria_as_a_list_of_names_read_like_null_descriptions(tokenizer):
    """A list of option names is options without descriptions: the same options, in the same model order, and
    the same token ids as an object whose descriptions are null (the release renders no description key)."""
    from clef_vllm.format.encoding import encode_request

    listed = parse_request(body({"q": {"type": "choice", "criteria": ["tech", "billing", "sales"]}}))
    nulls = parse_request(body({"q": {"type": "choice", "criteria": {"tech": None, "billing": None, "sales": None}}}))
    (question,) = listed.questions
    assert [(o.id, o.description) for o in question.options] == [("billing", None), ("sales", None), ("tech", None)]
    assert question.answer_order == ("tech", "billing", "sales")
    assert listed.questions == nulls.questions
    encoded = encode_request(listed, tokenizer)
    assert encoded.input_ids == encode_request(nulls, tokenizer).input_ids
    assert '{"option_id":"billing"}' in tokenizer.decode(encoded.input_ids)


def test_assets_become_images_in_order_of_first_reference():
    """State first, then each question's instructions and options in model order; unreferenced assets last."""
    questions = {
        "q1": {
            "type": "choice",
            "instructions": "Compare {{b}} with {{a}}",
            "criteria": {"y": "like {{c}}", "x": "no"},
        },
    }
    assets = {name: {"format": "png", "data_base64": name} for name in ("{{a}}", "{{unused}}", "{{c}}", "{{b}}")}
    request = parse_request(body(questions, state={"photo": "see {{b}}"}, images=["first"], assets=assets))
    assert [(m.where, m.data) for m in request.images] == [
        ("images[0]", "first"),
        ("assets.{{b}}", "{{b}}"),  # in the state
        ("assets.{{a}}", "{{a}}"),  # in q1's instructions, after {{b}}
        ("assets.{{c}}", "{{c}}"),  # in option y
        ("assets.{{unused}}", "{{unused}}"),
    ]


@pytest.mark.parametrize(
    ("limits", "media", "message"),
    [
        pytest.param(
            Limits(max_images=0),
            {"images": ["a"]},
            "images are switched off on this server (--limit-images 0)",
            id="images-off",
        ),
        pytest.param(
            Limits(max_videos=0),
            {"videos": ["a"]},
            "videos are switched off on this server (--limit-videos 0)",
            id="videos-off",
        ),
        pytest.param(
            Limits(max_images=1), {"images": ["a"], "assets": {"<x>": "b"}}, "too many images", id="over-limit"
        ),
    ],
)
def test_media_switched_off_or_limited(limits, media, message):
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_request(body(**media), limits)
    assert parse_request(body(), limits).images == ()


def test_custom_limits():
    limits = Limits(max_questions=2, max_choice_options=3, max_score_levels=3, max_id_length=5)
    parse_request(body({"a": {"type": "noul"}, "b": {"type": "noul"}}), limits)
    with pytest.raises(RequestError, match="too many questions: 3"):
        parse_request(body({"a": {"type": "noul"}, "b": {"type": "noul"}, "c": {"type": "noul"}}), limits)
    with pytest.raises(RequestError, match="too many options: 4"):
        parse_request(body(choice(4)), limits)
    with pytest.raises(RequestError, match="too many levels: 4"):
        parse_request(body(score(4)), limits)
    with pytest.raises(RequestError, match="longer than 5 characters"):
        parse_request(body({"sixsix": {"type": "noul"}}), limits)


# --- the answer --------------------------------------------------------------------------------------------


def respond(questions, probabilities, input_tokens=321):
    return build_response(parse_request(body(questions)), probabilities, input_tokens)


def test_response_shape_and_usage():
    response = respond({"b": {"type": "noul"}, "a": {"type": "noul"}}, [[0.5, 0.5], [0.25, 0.75]], input_tokens=77)
    assert response == {
        "model": "clef-test",
        "answers": {"b": {"type": "noul", "noul": 0.5}, "a": {"type": "noul", "noul": 0.25}},
        "usage": {"input_tokens": 77, "output_tokens": 0},
    }
    assert list(response["answers"]) == ["b", "a"]  # request order


@pytest.mark.parametrize(
    ("p_true", "noul"),
    [(0.123456, 0.1235), (0.99996, 1.0), (0.00004, 0.0), (1 / 3, 0.3333), (2 / 3, 0.6667), (0.5, 0.5)],
)
def test_noul_is_p_true_rounded(p_true, noul):
    response = respond({"q": {"type": "noul", "criteria": {"false": "swapped?"}}}, [[p_true, 1 - p_true]])
    assert response["answers"]["q"] == {"type": "noul", "noul": noul}


CHOICE = {"c": {"type": "choice", "criteria": {"b": "bee", "a": "ay", "10": "ten", "2": "two"}}}
# model order (sorted by string): "10", "2", "a", "b"


def test_choice_probabilities_in_request_criteria_order():
    answer = respond(CHOICE, [[0.1, 0.2, 0.3, 0.4]])["answers"]["c"]
    assert answer == {
        "type": "choice",
        "choice": "b",
        "confidence": 0.4,
        "probabilities": {"b": 0.4, "a": 0.3, "10": 0.1, "2": 0.2},
    }
    assert list(answer["probabilities"]) == ["b", "a", "10", "2"]


def test_choice_rounds_to_4_decimals():
    answer = respond(CHOICE, [[0.123456, 0.000044, 0.2500049, 0.6264951]])["answers"]["c"]
    assert answer["probabilities"] == {"b": 0.6265, "a": 0.25, "10": 0.1235, "2": 0.0}
    assert answer["choice"] == "b"
    assert answer["confidence"] == 0.6265


def test_choice_tie_goes_to_the_first_in_request_order():
    # "10" comes first in model order, but "a" comes first in the request's criteria order.
    answer = respond(CHOICE, [[0.4, 0.1, 0.4, 0.1]])["answers"]["c"]
    assert answer["choice"] == "a"
    assert answer["confidence"] == 0.4
    # all equal: the request's first option
    assert respond(CHOICE, [[0.25] * 4])["answers"]["c"]["choice"] == "b"


def test_choice_tie_is_decided_on_unrounded_probabilities():
    # "10" is really higher; rounding makes them look equal.
    answer = respond(CHOICE, [[0.40004, 0.1, 0.39996, 0.1]])["answers"]["c"]
    assert answer["choice"] == "10"
    assert answer["probabilities"]["10"] == answer["probabilities"]["a"] == 0.4


def test_score_expectation_confidence_and_legend():
    questions = {"s": {"type": "score", "criteria": ["low", "mid", "high"]}}
    answer = respond(questions, [[0.123456, 0.234567, 0.641977]])["answers"]["s"]
    # 0 * 0.123456 + 1 * 0.234567 + 2 * 0.641977 = 1.518521
    assert answer == {
        "type": "score",
        "score": 1.5185,
        "confidence": 0.642,
        "legend": {"0": "low", "1": "mid", "2": "high"},
        "probabilities": {"0": 0.1235, "1": 0.2346, "2": 0.642},
    }
    assert list(answer["legend"]) == ["0", "1", "2"]


def test_score_with_non_string_levels_and_ties():
    levels = [{"label": "none"}, 1, None, True]
    answer = respond({"s": {"type": "score", "criteria": levels}}, [[0.3, 0.3, 0.1, 0.3]])["answers"]["s"]
    # 0 * 0.3 + 1 * 0.3 + 2 * 0.1 + 3 * 0.3 = 1.4
    assert answer["score"] == 1.4
    assert answer["confidence"] == 0.3
    assert answer["legend"] == {"0": {"label": "none"}, "1": 1, "2": None, "3": True}


def test_score_with_12_levels_uses_level_numbers_not_string_order():
    probabilities = [0.0] * 12
    probabilities[10] = 1.0
    answer = respond(score(12, "s"), [probabilities])["answers"]["s"]
    assert answer["score"] == 10.0
    assert list(answer["probabilities"]) == [str(i) for i in range(12)]
    assert answer["probabilities"]["10"] == 1.0


def test_mixed_questions_in_one_response():
    questions = {
        "s": {"type": "score", "criteria": ["a", "b"]},
        "n": {"type": "noul"},
        "c": {"type": "choice", "criteria": {"y": "yes", "n": "no"}},  # model order n, y
    }
    response = respond(questions, [[0.25, 0.75], [0.9, 0.1], [0.7, 0.3]], input_tokens=5)
    assert response["answers"] == {
        "s": {
            "type": "score",
            "score": 0.75,
            "confidence": 0.75,
            "legend": {"0": "a", "1": "b"},
            "probabilities": {"0": 0.25, "1": 0.75},
        },
        "n": {"type": "noul", "noul": 0.9},
        "c": {"type": "choice", "choice": "n", "confidence": 0.7, "probabilities": {"y": 0.3, "n": 0.7}},
    }
    assert response["usage"] == {"input_tokens": 5, "output_tokens": 0}


def test_the_question_models_the_document_shows_are_the_ones_that_validate():
    """Each limit is checked where the model declares it, under the limits given as the validation context."""
    from pydantic import ValidationError

    from clef_vllm.format.wire_models import ChoiceQuestion, NoulQuestion, ScoreQuestion

    limits = Limits(max_choice_options=4, max_score_levels=5)
    cases = [
        (ChoiceQuestion, {"criteria": {f"o{i}": None for i in range(5)}}, "too many options: 5 (at most 4)"),
        (ChoiceQuestion, {"criteria": ["a", "b", "a"]}, 'option "a" is listed twice'),
        (ChoiceQuestion, {"criteria": ["x" * 101]}, "longer than 100 characters"),
        (ScoreQuestion, {"criteria": [f"level {i}" for i in range(6)]}, "too many levels: 6 (at most 5)"),
        (NoulQuestion, {"criteria": ["yes", "no"]}, "noul criteria must be an object"),
    ]
    for model, fields, message in cases:
        question = {"type": model.model_fields["type"].annotation.__args__[0], **fields}
        with pytest.raises(ValidationError, match=re.escape(message)):
            model.model_validate(question, context={"limits": limits})
    assert ChoiceQuestion.model_validate({"type": "choice", "criteria": ["a", "b"]}, context={"limits": limits})
