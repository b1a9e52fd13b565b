"""The pooling contract every front end sends: spans from the prompt's end, raw logits, checked token ids."""

from __future__ import annotations

import pytest

from clef_vllm.engine.pooling_contract import (
    SCHEMA_KEY,
    check_token_ids,
    parse_pooling_schema,
    pooling_params,
    pooling_schema,
)
from clef_vllm.format.encoding import Encoding
from clef_vllm.format.schema import QuestionType


def make_encoding() -> Encoding:
    return Encoding(
        input_ids=list(range(100, 120)),
        question_ids=["colour", "ok"],
        question_types=[int(QuestionType.CHOICE), int(QuestionType.NOUL)],
        question_spans=[(3, 5), (11, 12)],
        option_ids=[["blue", "red"], ["true", "false"]],
        option_spans=[[(6, 8), (8, 10)], [(13, 15), (15, 17)]],
        state_tokens=2,
        state_tokens_dropped=0,
        max_length=64,
    )


def test_schema_counts_from_the_end_and_reads_back_as_the_encoding_schema() -> None:
    encoding = make_encoding()
    wire = pooling_schema(encoding)
    assert wire["question_spans"] == [[-17, -15], [-9, -8]]
    assert wire["option_counts"] == [2, 2]
    assert parse_pooling_schema({SCHEMA_KEY: wire}, encoding.num_tokens) == encoding.schema()
    # Media placeholders expand before the state: the same spans still land on the same tokens.
    shifted = parse_pooling_schema({SCHEMA_KEY: wire}, encoding.num_tokens + 30)
    assert shifted is not None and shifted.question_spans == ((33, 35), (41, 42))


@pytest.mark.parametrize(
    "change",
    [
        {"question_types": [1, 3]},
        {"option_counts": [2]},
        {"question_spans": [[-17, -15], [-9, 1]]},
        {"option_spans": []},
    ],
)
def test_a_bad_schema_is_none_not_an_exception(change: dict) -> None:
    encoding = make_encoding()
    assert parse_pooling_schema({SCHEMA_KEY: {**pooling_schema(encoding), **change}}, encoding.num_tokens) is None


def test_params_ask_for_logits_with_the_schema() -> None:
    pytest.importorskip("vllm")
    encoding = make_encoding()
    params = pooling_params(encoding)
    assert params.task == "token_classify"
    assert params.use_activation is False  # front ends apply the per-question softmax themselves
    assert params.extra_kwargs == {SCHEMA_KEY: pooling_schema(encoding)}


def test_other_token_ids_are_refused() -> None:
    encoding = make_encoding()
    check_token_ids(tuple(encoding.input_ids), encoding)
    with pytest.raises(RuntimeError, match="other token ids"):
        check_token_ids([*encoding.input_ids[:-1], 0], encoding)
