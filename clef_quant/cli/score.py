"""`clef-quant score`: answer a request with the transformers reference (the release's own path)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from clef_quant.cli._errors import fail, read_json_file, user_errors
from clef_quant.cli._options import MaxLengthOption, ModelOption, RequestArgument, RevisionOption
from clef_quant.release import resolve_release
from clef_vllm.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.request import parse_request


@user_errors
def score(
    request_file: RequestArgument,
    model: ModelOption,
    revision: RevisionOption = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 (as the release runs) or float32.")] = "bfloat16",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    max_length: MaxLengthOption = DEFAULT_MAX_LENGTH,
) -> None:
    """Print the SystemOne response body for a request, scored by transformers + the joint schema head.

    Example: clef-quant score --model artifacts/tiny examples/request.json
    """
    from clef_quant.reference import DTYPES, ReferenceScorer

    if dtype not in ("bfloat16", "float32"):
        raise fail(f"--dtype must be bfloat16 or float32, not {dtype}")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise fail(f"--device must be cpu or cuda, not {device}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda was given, but no CUDA device is available", "use --device cpu")
    request = parse_request(read_json_file(request_file))
    folder = resolve_release(model, revision)
    scorer = ReferenceScorer(folder, dtype=DTYPES[dtype], device=device, max_length=max_length)
    (record,) = scorer.score([request])
    typer.echo(json.dumps(record.response, ensure_ascii=False, indent=2))
