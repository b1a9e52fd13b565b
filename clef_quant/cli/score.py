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
from clef_quant.cli._stderr import TRANSFORMERS_QUIET, held_tool_output, quiet_tools
from clef_quant.release import resolve_release
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.release_config import QuantizationConfig
from clef_vllm.format.request import parse_request

SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@user_errors
def score(
    request_file: RequestArgument,
    model: ModelOption,
    revision: RevisionOption = None,
    dtype: Annotated[str, dtype_option("Weights and activations (releases run bfloat16).")] = "bfloat16",
    device: DeviceOption = "cpu",
    max_model_len: MaxModelLenOption = DEFAULT_MAX_LENGTH,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show transformers' and compressed-tensors' own output.")
    ] = False,
) -> None:
    """Print the SystemOne response body for a request, scored by transformers + the joint schema head.

    A quantized release is scored with its weights dequantized in transformers (stderr says so).

    Example: clef-quant score --model artifacts/tiny examples/request.json
    """
    quiet_tools(verbose, TRANSFORMERS_QUIET)  # before transformers is imported: its log level is read then
    from clef_quant.reference import DTYPES, ReferenceScorer

    request = parse_request(read_json_file(request_file))
    folder = resolve_release(model, revision)
    scorer = ReferenceScorer(folder, dtype=DTYPES[dtype], device=device, max_length=max_model_len)
    scorer.encode(request)  # a request the model cannot read is refused before the model loads
    # transformers' and compressed-tensors' bars and warnings are held back; the note is said once loading worked
    with held_tool_output(verbose):
        scorer.model  # noqa: B018 - loads (dequantizes) now: a release transformers cannot run ends here, alone
    if scorer.quantization is not None:
        typer.echo(dequantized_note(model, scorer.quantization, SHORT_DTYPES[dtype]), err=True)
    with held_tool_output(verbose):
        (record,) = scorer.score([request])
    typer.echo(json.dumps(record.response, ensure_ascii=False, indent=2))


def dequantized_note(release: str, quantization: QuantizationConfig, dtype: str) -> str:
    """The one line that says a quantized release is scored dequantized, naming what it stores."""
    from clef_quant.quantize.schemes import scheme_label

    labels: list[str] = []
    quantizes_activations = False
    for group in quantization.groups:
        label = scheme_label(*group.written_args())
        labels += [label] if label not in labels else []
        quantizes_activations |= not group.weight_only
    stored = " + ".join(labels) or "quantized"
    line = f"note: {release} stores {stored} weights; scoring dequantizes them to {dtype} in transformers"
    if quantizes_activations:
        line += " (activations quantized and dequantized as the scheme says, by compressed-tensors)"
    return line
