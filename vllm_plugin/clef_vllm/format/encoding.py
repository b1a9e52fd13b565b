"""The Clef release's prompt encoding: input ids plus the question and option spans the head reads.

The prompt is a fixed sequence of pieces: prefix, media placeholders, state, one block per question, suffix.
Every piece is tokenized on its own without special tokens and the ids are concatenated, so a span is exactly
the ids of its piece. The state is the only part that may be cut: when prefix, media, schema and suffix leave
fewer than `len(state)` tokens of `max_length`, the end of the state is dropped; when they alone exceed
`max_length`, the request is refused. The state is tokenized only as far as it can be kept (`state_cut`), with
the same ids as a whole-state tokenization.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from clef_vllm.errors import SchemaTooLongError
from clef_vllm.format import state_cut
from clef_vllm.format.limits import Limits
from clef_vllm.format.media import DEFAULT_MEDIA_LIMITS, MediaLimits
from clef_vllm.format.media_encoding import MediaEncoding, encode_media
from clef_vllm.format.request import ClefRequest, check_schema_chars, parse_request
from clef_vllm.format.schema import RecordSchema
from clef_vllm.format.state_cut import cut_state, token_ids
from clef_vllm.format.text import option_text, render

DEFAULT_MAX_LENGTH = 16384

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. "
    "Each answer must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"

Span = tuple[int, int]


class Tokenizer(Protocol):
    def __call__(self, text: list[str], *, add_special_tokens: bool) -> Any: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Encoding:
    """A request as the model reads it. Spans are half-open positions in `input_ids`."""

    input_ids: list[int]
    question_ids: list[str]
    question_types: list[int]
    question_spans: list[Span]
    option_ids: list[list[str]]  # model order
    option_spans: list[list[Span]]
    state_tokens: int  # state tokens kept
    state_tokens_dropped: int  # cut from the end of the state to fit max_length
    max_length: int
    # processor outputs (pixel values, grids, mm_token_type_ids over the whole sequence)
    media_inputs: dict[str, Any] = field(default_factory=dict)
    # what vLLM's own processor expands: the ids with one pad token per image/video, the decoded media, and the
    # processor settings the expansion here used
    prompt_ids: list[int] | None = None
    multi_modal_data: dict[str, list[Any]] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    # False when the state ran more than max_length tokens past the cut: the count is then estimated from its
    # characters, because counting exactly would mean tokenizing text the model never reads.
    state_tokens_dropped_exact: bool = True

    @property
    def truncated(self) -> bool:
        return self.state_tokens_dropped > 0

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def schema(self) -> RecordSchema:
        """What the head needs to read this record's hidden states."""
        return RecordSchema(
            question_types=tuple(self.question_types),
            question_spans=tuple(self.question_spans),
            option_spans=tuple(tuple(spans) for spans in self.option_spans),
        )


class _Pieces:
    """Ordered prompt pieces, some of them marked as spans to report."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.span_keys: dict[int, tuple[int, int]] = {}  # piece index -> (question, option or -1)

    def add(self, text: str, span_of: tuple[int, int] | None = None) -> None:
        if span_of is not None:
            self.span_keys[len(self.texts)] = span_of
        self.texts.append(text)


def _schema_pieces(request: ClefRequest) -> _Pieces:
    pieces = _Pieces()
    pieces.add(SCHEMA_HEADER)
    for qi, question in enumerate(request.questions):
        pieces.add(f"\nFIELD {qi + 1}\nID: {question.id}\nTYPE: {question.type_name}\nINSTRUCTION: ")
        instructions = question.instructions
        pieces.add(question.id if instructions is None or instructions == "" else render(instructions), (qi, -1))
        pieces.add("\nALLOWED OPTIONS:\n")
        for oj, option in enumerate(question.options):
            pieces.add(f"OPTION {oj + 1}: ")
            pieces.add(option_text(option.id, option.description), (qi, oj))
            pieces.add("\n")
        pieces.add("END FIELD\n")
    pieces.add(SUFFIX)
    return pieces


def _token_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each text, in calls of at most `state_cut.MAX_CALL_CHARS` characters (a shared tokenizer is
    held for one call at a time)."""
    result: list[list[int]] = []
    batch: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if batch:
            result.extend(list(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"])
            batch.clear()
            size = 0

    for text in texts:
        if len(text) > state_cut.MAX_CALL_CHARS:
            flush()
            result.append(token_ids(tokenizer, text))
            continue
        if size + len(text) > state_cut.MAX_CALL_CHARS:
            flush()
        batch.append(text)
        size += len(text)
    flush()
    return result


def encode_request(
    request: ClefRequest,
    tokenizer: Tokenizer,
    *,
    processor: Any | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    media_limits: MediaLimits = DEFAULT_MEDIA_LIMITS,
) -> Encoding:
    """Encode a validated request exactly as the Clef release does.

    `processor` (the checkpoint's `AutoProcessor`) is needed only for requests with images or videos; it
    expands the media placeholders to one pad token per visual token and returns the pixel inputs.
    """
    check_schema_chars(request, max_length)
    schema = _schema_pieces(request)
    (prefix_ids,) = _token_ids(tokenizer, [PREFIX])
    schema_ids = _token_ids(tokenizer, schema.texts)
    media_ids: list[int] = []
    media = MediaEncoding()
    if request.has_media:
        media = encode_media(request, processor, lambda text: _token_ids(tokenizer, [text])[0], media_limits)
        media_ids = media.ids

    fixed = len(prefix_ids) + len(media_ids) + sum(len(ids) for ids in schema_ids)
    if fixed > max_length:
        raise SchemaTooLongError(fixed, max_length)
    state = cut_state(tokenizer, render(request.state), max_length - fixed, count_beyond=max_length)

    input_ids = prefix_ids + media_ids + state.ids
    question_spans: list[Span] = [(0, 0)] * len(request.questions)
    option_spans: list[list[Span]] = [[(0, 0)] * len(q.options) for q in request.questions]
    for index, ids in enumerate(schema_ids):
        key = schema.span_keys.get(index)
        if key is not None:
            span = (len(input_ids), len(input_ids) + len(ids))
            qi, oj = key
            if oj < 0:
                question_spans[qi] = span
            else:
                option_spans[qi][oj] = span
        input_ids.extend(ids)

    prompt_ids = None
    if request.has_media:
        media.place_token_types(len(prefix_ids), len(input_ids))
        prompt_ids = prefix_ids + media.unexpanded_ids + input_ids[len(prefix_ids) + len(media_ids) :]
    return Encoding(
        input_ids=input_ids,
        question_ids=[q.id for q in request.questions],
        question_types=[int(q.type) for q in request.questions],
        question_spans=question_spans,
        option_ids=[[o.id for o in q.options] for q in request.questions],
        option_spans=option_spans,
        state_tokens=len(state.ids),
        state_tokens_dropped=state.dropped,
        max_length=max_length,
        media_inputs=media.inputs,
        prompt_ids=prompt_ids,
        multi_modal_data=media.multi_modal_data,
        mm_processor_kwargs=media.mm_processor_kwargs,
        state_tokens_dropped_exact=state.dropped_exact,
    )


def prepare_request(
    body: Any,
    limits: Limits,
    tokenizer: Tokenizer,
    processor: Any | None,
    max_length: int,
    parts: Mapping[str, bytes] | None = None,
    processor_lock: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[ClefRequest, Encoding]:
    """A request body (or a request already parsed) checked against `limits` and encoded, as every server does.

    `parts` are a multipart request's file parts; `processor_lock` is held while a request with media is encoded,
    for callers whose threads share one processor.
    """
    request = body if isinstance(body, ClefRequest) else parse_request(body, limits, parts)
    lock = processor_lock if processor_lock is not None and request.has_media else contextlib.nullcontext()
    with lock:
        encoding = encode_request(
            request, tokenizer, processor=processor, max_length=max_length, media_limits=limits.media
        )
    return request, encoding
