"""The schema a request hands to the pooler, as vLLM's in-tree Clef-Omni pooler already reads it.

`PoolingParams(task="token_classify", extra_kwargs={"joint_schema": {...}})` with `question_types`,
`question_spans`, `option_spans` (all options of all questions, flat) and `option_counts`. Spans count from
the end of the prompt (`-len(prompt) <= start < end <= 0`) so they stay valid when media placeholders
expand before the state. Keeping this contract lets one pooler serve our offline API, our server and
`vllm serve`'s own `/v1/systemone`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clef_vllm.format.encoding import Encoding
from clef_vllm.format.schema import RecordSchema, is_question_type

if TYPE_CHECKING:
    from vllm import PoolingParams

SCHEMA_KEY = "joint_schema"
# The profiler range the pooler runs in, so a profile can tell its kernels from the backbone's.
POOLER_RANGE = "clef_pooler"


def pooling_schema(encoding: Encoding) -> dict[str, list[Any]]:
    """The `extra_kwargs["joint_schema"]` value for an encoded request."""
    end = encoding.num_tokens
    return {
        "question_types": list(encoding.question_types),
        "question_spans": [[s - end, e - end] for s, e in encoding.question_spans],
        "option_spans": [[s - end, e - end] for spans in encoding.option_spans for s, e in spans],
        "option_counts": [len(spans) for spans in encoding.option_spans],
    }


def pooling_params(encoding: Encoding) -> PoolingParams:
    """What every front end sends with an encoded request: the schema, and raw logits back.

    Logits rather than the pooler's own per-question softmax, so that every front end turns them into
    probabilities with the same code (`clef_vllm.format.answers.split_logits`).
    """
    from vllm import PoolingParams  # here, not at the top: importing vLLM takes seconds

    return PoolingParams(
        task="token_classify", use_activation=False, extra_kwargs={SCHEMA_KEY: pooling_schema(encoding)}
    )


def check_token_ids(ran: Sequence[int], encoding: Encoding) -> None:
    """Refuse an output whose prompt is not the encoding's ids: the spans would point at other tokens.

    With media, vLLM's own processor expands the placeholders, so this is where a different expansion shows.
    """
    if list(ran) != encoding.input_ids:
        raise RuntimeError("the engine ran other token ids than the encoding; spans would be wrong")


def parse_pooling_schema(extra_kwargs: dict[str, Any] | None, prompt_len: int) -> RecordSchema | None:
    """The record's schema in absolute positions, or None when it is missing or does not fit the prompt.

    Never raises: the pooler runs inside the engine core, where an exception kills the engine, and the
    engine itself sends schema-less dummy requests while profiling.
    """
    raw = (extra_kwargs or {}).get(SCHEMA_KEY)
    if not isinstance(raw, dict):
        return None
    try:
        types = tuple(int(t) for t in raw["question_types"])
        counts = [int(c) for c in raw["option_counts"]]
        questions = tuple((int(s) + prompt_len, int(e) + prompt_len) for s, e in raw["question_spans"])
        options = [(int(s) + prompt_len, int(e) + prompt_len) for s, e in raw["option_spans"]]
    except (KeyError, TypeError, ValueError):
        return None
    if (
        not types
        or len(counts) != len(types)
        or len(questions) != len(types)
        or len(options) != sum(counts)
        or not all(is_question_type(t) for t in types)
        or any(c < 1 for c in counts)
        or any(not 0 <= s < e <= prompt_len for s, e in (*questions, *options))
    ):
        return None
    grouped, start = [], 0
    for count in counts:
        grouped.append(tuple(options[start : start + count]))
        start += count
    return RecordSchema(question_types=types, question_spans=questions, option_spans=tuple(grouped))
