"""The prompt encoding against clef-format.md's "Encoding" section, token for token.

Every expectation here is written out by hand from the spec: the literal prompt pieces and the literal
rendered JSON texts. Each piece is tokenized on its own with the checkpoint's tokenizer, the ids are
concatenated and the spans counted by hand; nothing from `clef_vllm.format.encoding` except the function under
test builds the expectation.
"""

from __future__ import annotations

import base64
import io
import itertools
from dataclasses import dataclass, field

import pytest

from clef_vllm.errors import RequestError, SchemaTooLongError
from clef_vllm.format.encoding import encode_request
from clef_vllm.format.request import parse_request
from clef_vllm.format.text import render

# The spec's literal pieces.
PREFIX = (
    "<|im_start|>system\n"
    "Read the complete state and schema. Decide every field jointly. "
    "Each answer must be exactly one of that field's allowed options."
    "<|im_end|>\n<|im_start|>user\nSTATE:\n"
)
SCHEMA_FIELDS = "\n\nSCHEMA FIELDS:\n"
ALLOWED_OPTIONS = "\nALLOWED OPTIONS:\n"
END_FIELD = "END FIELD\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
IMAGE_MEDIA_TEXT = "<|vision_start|><|image_pad|><|vision_end|>\n"

NOUL_TRUE = '{"description":"The proposition is true or the answer is yes.","option_id":"true"}'
NOUL_FALSE = '{"description":"The proposition is false or the answer is no.","option_id":"false"}'


@dataclass
class Field:
    """One question block as the model should see it: its rendered instruction and option texts."""

    qid: str
    type: str
    instruction: str
    options: list[str]
    option_ids: list[str] = field(default_factory=list)


@dataclass
class Expected:
    input_ids: list[int]
    question_spans: list[tuple[int, int]]
    option_spans: list[list[tuple[int, int]]]
    state_ids: list[int]  # the whole state, before any cut


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def expect(tokenizer, state_text: str, fields: list[Field], *, media_ids=(), keep_state: int | None = None):
    """Build the expected encoding from the spec's pieces, tokenizing each piece on its own."""
    ids: list[int] = []

    def add(text: str) -> tuple[int, int]:
        start = len(ids)
        ids.extend(ids_of(tokenizer, text))
        return start, len(ids)

    add(PREFIX)
    ids.extend(media_ids)
    state_ids = ids_of(tokenizer, state_text)
    ids.extend(state_ids if keep_state is None else state_ids[:keep_state])
    add(SCHEMA_FIELDS)
    question_spans, option_spans = [], []
    for number, fld in enumerate(fields, start=1):
        add(f"\nFIELD {number}\nID: {fld.qid}\nTYPE: {fld.type}\nINSTRUCTION: ")
        question_spans.append(add(fld.instruction))
        add(ALLOWED_OPTIONS)
        spans = []
        for option_number, option in enumerate(fld.options, start=1):
            add(f"OPTION {option_number}: ")
            spans.append(add(option))
            add("\n")
        option_spans.append(spans)
        add(END_FIELD)
    add(SUFFIX)
    return Expected(ids, question_spans, option_spans, state_ids)


def fixed_length(tokenizer, fields: list[Field], media_ids=()) -> int:
    """prefix + media + schema + suffix, counted from the pieces."""
    return len(expect(tokenizer, "", fields, media_ids=media_ids).input_ids)


def check(encoding, expected: Expected, tokenizer, fields: list[Field]) -> None:
    """Compare everything the encoder reports with the hand-built expectation, and the spans' decoded text."""
    assert encoding.input_ids == expected.input_ids
    assert encoding.num_tokens == len(expected.input_ids)
    assert encoding.question_ids == [f.qid for f in fields]
    assert encoding.question_types == [{"noul": 0, "choice": 1, "score": 2}[f.type] for f in fields]
    assert [tuple(s) for s in encoding.question_spans] == expected.question_spans
    assert [[tuple(s) for s in spans] for spans in encoding.option_spans] == expected.option_spans
    for fld, ids in zip(fields, encoding.option_ids, strict=True):
        if fld.option_ids:
            assert ids == fld.option_ids
    for fld, (start, end) in zip(fields, encoding.question_spans, strict=True):
        assert tokenizer.decode(encoding.input_ids[start:end]) == fld.instruction
    for fld, spans in zip(fields, encoding.option_spans, strict=True):
        texts = [tokenizer.decode(encoding.input_ids[start:end]) for start, end in spans]
        assert texts == fld.options


def body(state, questions, **extra):
    return {"model": "clef-test", "state": state, "questions": questions, **extra}


def noul_field(qid: str, instruction: str | None = None) -> Field:
    return Field(qid, "noul", qid if instruction is None else instruction, [NOUL_TRUE, NOUL_FALSE], ["true", "false"])


def encode(tokenizer, request_body, **kwargs):
    return encode_request(parse_request(request_body), tokenizer, **kwargs)


# --- render ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("as is, {not json}", "as is, {not json}"),
        ("", ""),
        ("Grüße 東京 🚀", "Grüße 東京 🚀"),
        (None, "null"),
        (True, "true"),
        (0, "0"),
        (-2.5, "-2.5"),
        ([1, "b", None], '[1,"b",null]'),
        ({"b": 1, "a": {"d": [], "c": "ü"}}, '{"a":{"c":"ü","d":[]},"b":1}'),
    ],
)
def test_render_strings_stay_everything_else_is_compact_sorted_json(value, text):
    assert render(value) == text


# --- the whole prompt --------------------------------------------------------------------------------------


def test_whole_prompt_reads_as_the_spec_writes_it(tokenizer):
    request = body(
        {"b": 1, "a": "x"},
        {"q": {"type": "choice", "instructions": "Pick.", "criteria": {"y": "Yes.", "n": None}}},
    )
    whole = (
        "<|im_start|>system\n"
        "Read the complete state and schema. Decide every field jointly. "
        "Each answer must be exactly one of that field's allowed options.<|im_end|>\n"
        "<|im_start|>user\nSTATE:\n"
        '{"a":"x","b":1}'
        "\n\nSCHEMA FIELDS:\n"
        "\nFIELD 1\nID: q\nTYPE: choice\nINSTRUCTION: Pick.\nALLOWED OPTIONS:\n"
        'OPTION 1: {"option_id":"n"}\n'
        'OPTION 2: {"description":"Yes.","option_id":"y"}\n'
        "END FIELD\n"
        "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
    )
    encoding = encode(tokenizer, request)
    assert tokenizer.decode(encoding.input_ids) == whole
    fields = [
        Field(
            "q",
            "choice",
            "Pick.",
            ['{"option_id":"n"}', '{"description":"Yes.","option_id":"y"}'],
            ["n", "y"],
        )
    ]
    check(encoding, expect(tokenizer, '{"a":"x","b":1}', fields), tokenizer, fields)


# --- state -------------------------------------------------------------------------------------------------


def test_string_state_is_kept_as_is_and_noul_defaults(tokenizer):
    state = 'Ticket #42: "refund please"  {not: json}\n  trailing spaces  '
    encoding = encode(tokenizer, body(state, {"q": {"type": "noul"}}))
    fields = [noul_field("q")]
    check(encoding, expect(tokenizer, state, fields), tokenizer, fields)
    assert encoding.state_tokens == len(ids_of(tokenizer, state))
    assert encoding.state_tokens_dropped == 0
    assert not encoding.truncated
    assert encoding.max_length == 16384


def test_unicode_state_string_and_unicode_inside_json_are_not_escaped(tokenizer):
    state = "Grüße aus Köln — 東京 🚀 naïve café"
    fields = [noul_field("q")]
    encoding = encode(tokenizer, body(state, {"q": {"type": "noul"}}))
    check(encoding, expect(tokenizer, state, fields), tokenizer, fields)

    json_state = {"ville": "Zoë", "city": "東京", "emoji": "🚀"}
    encoding = encode(tokenizer, body(json_state, {"q": {"type": "noul"}}))
    rendered = '{"city":"東京","emoji":"🚀","ville":"Zoë"}'
    check(encoding, expect(tokenizer, rendered, fields), tokenizer, fields)
    assert tokenizer.decode(encoding.input_ids).count("東京") == 1  # ensure_ascii=False: no \\u escapes
    assert "\\u" not in tokenizer.decode(encoding.input_ids)


def test_nested_json_state_with_unsorted_keys_is_rendered_sorted_and_compact(tokenizer):
    state = {"zeta": 1, "alpha": {"y": [3, {"k": True, "b": None}], "x": 1.5}, "mid": "s p a c e", "B": []}
    rendered = '{"B":[],"alpha":{"x":1.5,"y":[3,{"b":null,"k":true}]},"mid":"s p a c e","zeta":1}'
    fields = [noul_field("q")]
    encoding = encode(tokenizer, body(state, {"q": {"type": "noul"}}))
    check(encoding, expect(tokenizer, rendered, fields), tokenizer, fields)


@pytest.mark.parametrize(
    ("state", "rendered"),
    [
        (None, "null"),
        (42, "42"),
        (False, "false"),
        ([2, "a", {"b": 1, "a": 0}], '[2,"a",{"a":0,"b":1}]'),
        ("", ""),
    ],
)
def test_non_object_states(tokenizer, state, rendered):
    fields = [noul_field("q")]
    encoding = encode(tokenizer, body(state, {"q": {"type": "noul"}}))
    check(encoding, expect(tokenizer, rendered, fields), tokenizer, fields)
    assert encoding.state_tokens == len(ids_of(tokenizer, rendered))


# --- instructions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "instruction"),
    [
        ({"type": "noul"}, "my_question"),  # missing -> question id
        ({"type": "noul", "instructions": ""}, "my_question"),  # "" -> question id
        ({"type": "noul", "instructions": "Is the user angry?"}, "Is the user angry?"),
        ({"type": "noul", "instructions": " padded "}, " padded "),
        (
            {"type": "noul", "instructions": {"goal": "spam?", "Axis": [1, 2]}},
            '{"Axis":[1,2],"goal":"spam?"}',
        ),
        ({"type": "noul", "instructions": ["b", {"z": 0, "a": None}]}, '["b",{"a":null,"z":0}]'),
        ({"type": "noul", "instructions": 7}, "7"),
        ({"type": "noul", "instructions": 0}, "0"),  # falsy, but not missing and not ""
        ({"type": "noul", "instructions": 0.25}, "0.25"),
        ({"type": "noul", "instructions": False}, "false"),
        ({"type": "noul", "instructions": "für 東京"}, "für 東京"),
    ],
)
def test_instructions(tokenizer, question, instruction):
    fields = [noul_field("my_question", instruction)]
    encoding = encode(tokenizer, body("s", {"my_question": question}))
    check(encoding, expect(tokenizer, "s", fields), tokenizer, fields)


# --- options -----------------------------------------------------------------------------------------------


def test_choice_options_sorted_by_plain_string_order(tokenizer):
    criteria = {"b": "bee", "2": "two", "a": "ay", "10": "ten", "Z": "zed"}
    fields = [
        Field(
            "pick",
            "choice",
            "pick",
            [
                '{"description":"ten","option_id":"10"}',
                '{"description":"two","option_id":"2"}',
                '{"description":"zed","option_id":"Z"}',
                '{"description":"ay","option_id":"a"}',
                '{"description":"bee","option_id":"b"}',
            ],
            ["10", "2", "Z", "a", "b"],
        )
    ]
    encoding = encode(tokenizer, body({}, {"pick": {"type": "choice", "criteria": criteria}}))
    check(encoding, expect(tokenizer, "{}", fields), tokenizer, fields)


def test_choice_with_256_options(tokenizer):
    criteria = {str(i): f"option number {i}" for i in range(256)}  # numeric order in the request
    model_order = sorted(criteria)  # plain string order: "0", "1", "10", "100", "101", ...
    assert model_order[:5] == ["0", "1", "10", "100", "101"]
    fields = [
        Field(
            "big",
            "choice",
            "Choose.",
            ['{"description":"option number ' + i + '","option_id":"' + i + '"}' for i in model_order],
            model_order,
        )
    ]
    request = {"big": {"type": "choice", "instructions": "Choose.", "criteria": criteria}}
    encoding = encode(tokenizer, body("st", request))
    check(encoding, expect(tokenizer, "st", fields), tokenizer, fields)
    assert len(encoding.option_spans[0]) == 256


def test_choice_null_and_json_descriptions(tokenizer):
    criteria = {"y": "why", "x": None, "w": {"q": 1, "p": [True]}, "v": 3}
    fields = [
        Field(
            "c",
            "choice",
            "c",
            [
                '{"description":3,"option_id":"v"}',
                '{"description":{"p":[true],"q":1},"option_id":"w"}',
                '{"option_id":"x"}',  # null description: no description key
                '{"description":"why","option_id":"y"}',
            ],
            ["v", "w", "x", "y"],
        )
    ]
    encoding = encode(tokenizer, body("s", {"c": {"type": "choice", "criteria": criteria}}))
    check(encoding, expect(tokenizer, "s", fields), tokenizer, fields)


def test_noul_criteria_override_defaults_and_extra_keys_are_ignored(tokenizer):
    questions = {
        "both": {
            "type": "noul",
            "criteria": {"false": "Nope.", "extra": "not an option", "true": "Yes, indeed."},
        },
        "only_false": {"type": "noul", "criteria": {"false": "Definitely not."}},
        "empty": {"type": "noul", "criteria": {}},
    }
    fields = [
        Field(
            "both",
            "noul",
            "both",
            [
                '{"description":"Yes, indeed.","option_id":"true"}',
                '{"description":"Nope.","option_id":"false"}',
            ],
            ["true", "false"],
        ),
        Field(
            "only_false",
            "noul",
            "only_false",
            [NOUL_TRUE, '{"description":"Definitely not.","option_id":"false"}'],
            ["true", "false"],
        ),
        noul_field("empty"),
    ]
    encoding = encode(tokenizer, body("s", questions))
    check(encoding, expect(tokenizer, "s", fields), tokenizer, fields)


def test_score_levels_are_numbered_and_values_become_descriptions(tokenizer):
    levels = ["none", {"b": "x", "a": 1}, 2.5, ["list", None], True, None]
    fields = [
        Field(
            "sev",
            "score",
            "How bad?",
            [
                '{"description":"none","option_id":"0"}',
                '{"description":{"a":1,"b":"x"},"option_id":"1"}',
                '{"description":2.5,"option_id":"2"}',
                '{"description":["list",null],"option_id":"3"}',
                '{"description":true,"option_id":"4"}',
                '{"option_id":"5"}',
            ],
            ["0", "1", "2", "3", "4", "5"],
        )
    ]
    request = {"sev": {"type": "score", "instructions": "How bad?", "criteria": levels}}
    encoding = encode(tokenizer, body("s", request))
    check(encoding, expect(tokenizer, "s", fields), tokenizer, fields)


def test_score_with_12_levels_keeps_list_order_not_string_order(tokenizer):
    levels = [f"level {i}" for i in range(12)]
    ids = [str(i) for i in range(12)]  # "10" and "11" stay after "9"
    fields = [Field("s", "score", "s", ['{"description":"level ' + i + '","option_id":"' + i + '"}' for i in ids], ids)]
    encoding = encode(tokenizer, body("x", {"s": {"type": "score", "criteria": levels}}))
    check(encoding, expect(tokenizer, "x", fields), tokenizer, fields)


# --- several questions -------------------------------------------------------------------------------------


def test_multiple_questions_numbered_in_request_order(tokenizer):
    questions = {
        "zeta": {"type": "score", "instructions": "Rate.", "criteria": ["low", "high"]},
        "alpha": {"type": "noul", "instructions": {"ask": "spam?"}},
        "frage-ü": {"type": "choice", "criteria": {"no": "No.", "maybe": None, "yes": "Yes."}},
    }
    state = {"messages": [{"role": "user", "text": "hi"}], "id": 9}
    fields = [
        Field(
            "zeta",
            "score",
            "Rate.",
            ['{"description":"low","option_id":"0"}', '{"description":"high","option_id":"1"}'],
            ["0", "1"],
        ),
        noul_field("alpha", '{"ask":"spam?"}'),
        Field(
            "frage-ü",
            "choice",
            "frage-ü",
            [
                '{"option_id":"maybe"}',
                '{"description":"No.","option_id":"no"}',
                '{"description":"Yes.","option_id":"yes"}',
            ],
            ["maybe", "no", "yes"],
        ),
    ]
    rendered = '{"id":9,"messages":[{"role":"user","text":"hi"}]}'
    encoding = encode(tokenizer, body(state, questions))
    check(encoding, expect(tokenizer, rendered, fields), tokenizer, fields)
    assert encoding.question_types == [2, 0, 1]
    text = tokenizer.decode(encoding.input_ids)
    assert "\nFIELD 1\nID: zeta\nTYPE: score\n" in text
    assert "\nFIELD 2\nID: alpha\nTYPE: noul\n" in text
    assert "\nFIELD 3\nID: frage-ü\nTYPE: choice\n" in text
    # spans strictly increase through the record
    flat = [s for q, opts in zip(encoding.question_spans, encoding.option_spans, strict=True) for s in (q, *opts)]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(flat))


# --- length ------------------------------------------------------------------------------------------------

LONG_STATE = " ".join(f"word{i} ünïcode {i * 7}" for i in range(60))
TWO_FIELDS_REQUEST = {
    "a": {"type": "noul", "instructions": "First?"},
    "b": {"type": "choice", "criteria": {"y": "yes", "n": "no"}},
}


def two_fields() -> list[Field]:
    return [
        noul_field("a", "First?"),
        Field(
            "b",
            "choice",
            "b",
            ['{"description":"no","option_id":"n"}', '{"description":"yes","option_id":"y"}'],
            ["n", "y"],
        ),
    ]


@pytest.mark.parametrize("slack", [+1, 0, -1, -5])
def test_truncation_around_the_state_length(tokenizer, slack):
    """max_length = fixed + len(state) + slack: the state loses its end so the total never exceeds it."""
    fields = two_fields()
    fixed = fixed_length(tokenizer, fields)
    state_len = len(ids_of(tokenizer, LONG_STATE))
    max_length = fixed + state_len + slack
    keep = min(state_len, state_len + slack)

    encoding = encode(tokenizer, body(LONG_STATE, TWO_FIELDS_REQUEST), max_length=max_length)
    check(encoding, expect(tokenizer, LONG_STATE, fields, keep_state=keep), tokenizer, fields)
    assert encoding.num_tokens == fixed + keep
    assert encoding.num_tokens == (max_length if slack <= 0 else max_length - 1)
    assert encoding.state_tokens == keep
    assert encoding.state_tokens_dropped == state_len - keep
    assert encoding.truncated == (slack < 0)
    assert encoding.max_length == max_length


def test_state_cut_entirely_when_schema_fills_max_length(tokenizer):
    fields = two_fields()
    fixed = fixed_length(tokenizer, fields)
    encoding = encode(tokenizer, body(LONG_STATE, TWO_FIELDS_REQUEST), max_length=fixed)
    check(encoding, expect(tokenizer, LONG_STATE, fields, keep_state=0), tokenizer, fields)
    assert encoding.num_tokens == fixed
    assert encoding.state_tokens == 0
    assert encoding.state_tokens_dropped == len(ids_of(tokenizer, LONG_STATE))


@pytest.mark.parametrize("over", [1, 2, 100])
def test_schema_too_long_is_refused_with_the_exact_message(tokenizer, over):
    fields = two_fields()
    fixed = fixed_length(tokenizer, fields)
    with pytest.raises(SchemaTooLongError) as info:
        encode(tokenizer, body("short", TWO_FIELDS_REQUEST), max_length=fixed - over)
    assert str(info.value) == f"schema requires {fixed} tokens before state; maximum is {fixed - over}"
    assert info.value.message == str(info.value)
    assert isinstance(info.value, RequestError)


def test_schema_too_long_even_with_empty_state(tokenizer):
    criteria = {f"opt{i}": "a fairly long description " * 4 for i in range(40)}
    request = body("", {"q": {"type": "choice", "criteria": criteria}})
    with pytest.raises(SchemaTooLongError, match=r"^schema requires \d+ tokens before state; maximum is 50$"):
        encode(tokenizer, request, max_length=50)


def test_default_max_length_is_16384(tokenizer):
    state = " ".join(f"{i}:{i * 37 % 1000}" for i in range(12000))
    fields = [noul_field("q")]
    state_len = len(ids_of(tokenizer, state))
    fixed = fixed_length(tokenizer, fields)
    assert state_len + fixed > 16384, "the test state must be longer than the default maximum"
    encoding = encode(tokenizer, body(state, {"q": {"type": "noul"}}))
    check(encoding, expect(tokenizer, state, fields, keep_state=16384 - fixed), tokenizer, fields)
    assert encoding.num_tokens == 16384
    assert encoding.state_tokens_dropped == state_len - (16384 - fixed)


# --- record id ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "record_id"), [({}, "unknown"), ({"id": "rec-7"}, "rec-7"), ({"id": 123}, "123")])
def test_record_id(extra, record_id):
    assert parse_request(body("s", {"q": {"type": "noul"}}, **extra)).record_id == record_id


# --- media -------------------------------------------------------------------------------------------------


def png_base64(size=(48, 32), color=(200, 30, 90)) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_image_record_goes_through_the_processor(tokenizer, processor):
    from PIL import Image

    data = png_base64()
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    media_ids = list(processor(text=[IMAGE_MEDIA_TEXT], images=[image])["input_ids"][0])
    pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert media_ids.count(pad_id) >= 1

    fields = [noul_field("q", "Is there a picture?")]
    request = body("see image", {"q": {"type": "noul", "instructions": "Is there a picture?"}}, images=[data])
    encoding = encode(tokenizer, request, processor=processor)
    expected = expect(tokenizer, "see image", fields, media_ids=media_ids)
    check(encoding, expected, tokenizer, fields)
    prefix_len = len(ids_of(tokenizer, PREFIX))
    assert encoding.input_ids[prefix_len : prefix_len + len(media_ids)] == media_ids
    assert "pixel_values" in encoding.media_inputs
    grid = encoding.media_inputs["image_grid_thw"]
    merge = processor.image_processor.merge_size
    assert media_ids.count(pad_id) == int(grid[0].prod()) // (merge * merge)

    # the same image as a data: URL encodes identically
    url_request = body("see image", request["questions"], images=[f"data:image/png;base64,{data}"])
    assert encode(tokenizer, url_request, processor=processor).input_ids == encoding.input_ids


def test_two_images_use_one_placeholder_each_then_one_newline(tokenizer, processor):
    from PIL import Image

    first, second = png_base64((32, 32)), png_base64((64, 32), (0, 0, 255))
    images = [Image.open(io.BytesIO(base64.b64decode(d))).convert("RGB") for d in (first, second)]
    media_text = "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>\n"
    media_ids = list(processor(text=[media_text], images=images)["input_ids"][0])
    fields = [noul_field("q")]
    encoding = encode(tokenizer, body("s", {"q": {"type": "noul"}}, images=[first, second]), processor=processor)
    check(encoding, expect(tokenizer, "s", fields, media_ids=media_ids), tokenizer, fields)


def test_media_counts_towards_the_fixed_length(tokenizer, processor):
    from PIL import Image

    data = png_base64()
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    media_ids = list(processor(text=[IMAGE_MEDIA_TEXT], images=[image])["input_ids"][0])
    fields = two_fields()
    fixed = fixed_length(tokenizer, fields, media_ids=media_ids)
    request = body(LONG_STATE, TWO_FIELDS_REQUEST, images=[data])

    encoding = encode(tokenizer, request, processor=processor, max_length=fixed + 3)
    check(encoding, expect(tokenizer, LONG_STATE, fields, media_ids=media_ids, keep_state=3), tokenizer, fields)
    assert encoding.num_tokens == fixed + 3
    with pytest.raises(SchemaTooLongError, match=f"^schema requires {fixed} tokens before state; maximum is"):
        encode(tokenizer, request, processor=processor, max_length=fixed - 1)


def test_image_without_processor_is_a_request_error(tokenizer):
    request = body("s", {"q": {"type": "noul"}}, images=[png_base64()])
    with pytest.raises(RequestError):
        encode(tokenizer, request)
