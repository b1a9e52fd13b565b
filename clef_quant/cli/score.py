"""`clef-quant score`: answer a request with the transformers reference (the release's own path)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from clef_quant.cli._errors import read_json_file, user_errors
from clef_quant.cli._options import (
    DeviceOption,
    MaxModelLenOption,
    ModelOption,
    RequestArgument,
    RevisionOption,
    dtype_option,
)
from clef_quant.release import resolve_release
from clef_vllm.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.request import parse_request


@user_errors
def score(
    request_file: RequestArgument,
    model: ModelOption,
    revision: RevisionOption = None,
    dtype: Annotated[str, dtype_option("Weights and activations (releases run bfloat16).")] = "bfloat16",
    device: DeviceOption = "cpu",
    max_model_len: MaxModelLenOption = DEFAULT_MAX_LENGTH,
) -> None:
    """Print the SystemOne response body for a request, scored by transformers + the joint schema head.

    Example: clef-quant score --model artifacts/tiny examples/request.json
    """
    from clef_quant.reference import DTYPES, ReferenceScorer

    request = parse_request(read_json_file(request_file))
    folder = resolve_release(model, revision)
    scorer = ReferenceScorer(folder, dtype=DTYPES[dtype], device=device, max_length=max_model_len)
    (record,) = scorer.score([request])
    typer.echo(json.dumps(record.response, ensure_ascii=False, indent=2))
