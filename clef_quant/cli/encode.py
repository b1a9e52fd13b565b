"""`clef-quant encode`: show exactly what the model reads for a request."""

from __future__ import annotations

import json
from typing import Any

import typer

from clef_quant.cli._errors import read_json_file, user_errors
from clef_quant.cli._options import MaxModelLenOption, ModelOption, RequestArgument, RevisionOption
from clef_quant.release import resolve_release
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.format.request import parse_request
from clef_vllm.format.schema import QuestionType


@user_errors
def encode(
    request_file: RequestArgument,
    model: ModelOption,
    revision: RevisionOption = None,
    max_model_len: MaxModelLenOption = DEFAULT_MAX_LENGTH,
) -> None:
    """Print a request's encoding as JSON: token count, input ids, question and option spans with their text.

    Example: clef-quant encode --model artifacts/tiny examples/request.json
    """
    from clef_vllm.format.encoder import Encoder

    request = parse_request(read_json_file(request_file))
    encoder = Encoder(resolve_release(model, revision), max_length=max_model_len)
    encoding = encoder.encode(request)
    typer.echo(json.dumps(describe(encoding, encoder.tokenizer.decode), ensure_ascii=False, indent=2))


def describe(encoding: Encoding, decode: Any) -> dict[str, Any]:
    """The encoding as plain JSON, with each span's decoded text so a reader can check it by eye."""

    def span(bounds: tuple[int, int]) -> dict[str, Any]:
        start, end = bounds
        return {"start": start, "end": end, "text": decode(encoding.input_ids[start:end])}

    return {
        "num_tokens": encoding.num_tokens,
        "max_length": encoding.max_length,
        "state": {
            "tokens": encoding.state_tokens,
            "truncated": encoding.truncated,
            "tokens_dropped": encoding.state_tokens_dropped,
        },
        "questions": [
            {
                "id": qid,
                "type": QuestionType(qtype).name.lower(),
                "type_id": qtype,
                "span": span(qspan),
                "options": [{"id": oid, "span": span(ospan)} for oid, ospan in zip(oids, ospans, strict=True)],
            }
            for qid, qtype, qspan, oids, ospans in zip(
                encoding.question_ids,
                encoding.question_types,
                encoding.question_spans,
                encoding.option_ids,
                encoding.option_spans,
                strict=True,
            )
        ],
        "input_ids": encoding.input_ids,
    }
