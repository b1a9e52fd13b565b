"""`clef-quant bench quantize-vs-plain`: `clef-quant quantize` against plain llm-compressor, each side in its own
process (what `bench quantize --against-plain` was)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import calibration_records_option, device_option, max_seq_len_option, scheme_option
from clef_quant.cli._stderr import stage_line
from clef_quant.cli.bench._common import command_line, require_release
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN
from clef_quant.quantize.recipes import AUTO_SCHEME
from clef_quant.quantize.registry import schemes as scheme_registry


@user_errors
def quantize_vs_plain(
    model: Annotated[Path, typer.Option(help="The bf16 release folder (e.g. `clef-quant make-tiny DIR`).")],
    work: Annotated[
        Path, typer.Option(help="Scratch folder for each side's quantized folder, removed after measuring.")
    ],
    scheme: Annotated[
        list[str] | None,
        scheme_option(f"Scheme to compare, repeatable; default {' and '.join(scheme_registry().bench_default())}."),
    ] = None,
    calibration_records: Annotated[int, calibration_records_option("Calibration records for every scheme.")] = 16,
    max_seq_len: Annotated[int, max_seq_len_option()] = DEFAULT_MAX_SEQ_LEN,
    device: Annotated[str, device_option("Where both sides quantize: cpu, cuda or cuda:N.")] = "cpu",
    out: Annotated[
        Path | None,
        typer.Option(
            help="Report path: the JSON results; their markdown goes beside it, same stem.",
            show_default="bench/results/quantize-<device>.json",
        ),
    ] = None,
) -> None:
    """`clef-quant quantize` against plain llm-compressor (same recipe, same calibration ids): wall time and peak
    host and GPU memory per scheme, each side in its own process; schemes that stream also against plain
    model_free_ptq and `clef-quant quantize --no-streaming`.

    Example: clef-quant bench quantize-vs-plain --model artifacts/tiny --work artifacts/bench-q --scheme fp8-dynamic
    """
    from clef_quant.bench.quantize_bench import SideFailed, compare, summary_lines, write_report
    from clef_quant.bench.report_paths import default_report

    if AUTO_SCHEME in (scheme or []):
        raise fail("auto is not compared against plain llm-compressor")  # plain has no scan to plan from
    require_release(model, hint=f"clef-quant make-tiny {model}")
    with stage_line("benchmarking") as progress:
        try:
            results = compare(
                model,
                scheme or list(scheme_registry().bench_default()),
                work=work,
                records=calibration_records,
                max_seq_len=max_seq_len,
                device=device,
                progress=progress,
            )
        except SideFailed as exc:  # a side's own error, its stderr's last lines: a failed run (exit 1), not bad input
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from None
    json_path, markdown = write_report(results, command_line(), out or default_report("quantize", device, ".json"))
    for line in summary_lines(results):
        typer.echo(line)
    typer.echo(f"wrote {json_path} and {markdown}")
