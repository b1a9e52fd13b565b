"""`clef-quant bench quantize`: every scheme quantized from one source in one run, with its cost and its damage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import calibration_records_option, max_model_len_option, max_seq_len_option, scheme_option
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import LLM_COMPRESSOR_QUIET, VLLM_QUIET, quiet_tools, stage_line
from clef_quant.cli.bench._common import command_line, require_release
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN
from clef_quant.quantize.recipes import AUTO_SCHEME

if TYPE_CHECKING:
    from clef_quant.bench.quality import QualityBench


@user_errors
def quantize(
    model: Annotated[Path, typer.Option(help="The bf16 release folder (e.g. `clef-quant make-tiny DIR`).")],
    work: Annotated[Path, typer.Option(help="Scratch folder for the quantized folders (kept for inspection).")],
    scheme: Annotated[
        list[str] | None,
        scheme_option("Scheme to run, repeatable; default every scheme in recipes/ (and auto with --scan)."),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="A DATA folder (build-data): adds KL, agreement and max |dp| via eval.")
    ] = None,
    scan: Annotated[
        Path | None, typer.Option(help="scan.json of this model: adds `auto` at the size of nvfp4-hybrid.")
    ] = None,
    calibration_records: Annotated[int, calibration_records_option("Calibration records for every scheme.")] = 16,
    max_seq_len: Annotated[int, max_seq_len_option()] = DEFAULT_MAX_SEQ_LEN,
    max_model_len: Annotated[int, max_model_len_option("Prompt length limit for evaluation.")] = 4096,
    out: Annotated[
        Path,
        typer.Option(help="Report path (markdown); its JSON goes beside it, same stem."),
    ] = Path("bench/results/quality-cpu.md"),
) -> None:
    """Quantize one model with every scheme in one run: time, calibration cost, size and, with --data, the head's
    KL, top-1 agreement and max |dp| against bf16 through the plugin.

    `clef-quant bench quantize-vs-plain` sets `clef-quant quantize` against plain llm-compressor instead.

    Example: clef-quant bench quantize --model artifacts/tiny --work artifacts/bench-q --data artifacts/data \\
        --scan artifacts/scan/scan.json
    """
    from clef_quant.bench.quality import default_schemes, render_markdown, result_json, run_quality_bench
    from clef_quant.bench.report_paths import write_report

    require_release(model, hint=f"clef-quant make-tiny {model}")
    schemes = list(scheme or default_schemes(scan is not None))
    if AUTO_SCHEME in schemes and scan is None:
        raise fail("auto needs --scan", hint=f"clef-quant scan {model} --out SCAN_DIR")
    quiet_tools(False, LLM_COMPRESSOR_QUIET, VLLM_QUIET)
    with stage_line("benchmarking") as progress:
        result = run_quality_bench(
            model,
            schemes,
            work=work,
            data=data,
            scan=scan,
            calibration_records=calibration_records,
            max_seq_len=max_seq_len,
            max_model_len=max_model_len,
            progress=progress,
        )
    write_report(out, render_markdown(result, command_line()), result_json(result))
    _print_table(model, result)
    typer.echo(f"wrote {out}")


def _print_table(model: Path, result: QualityBench) -> None:
    table = Table(title=f"schemes on {model}")
    for column in ("scheme", "KL", "agreement", "max |dp|", "MB", "quantize s", "calibration s"):
        table.add_column(column, justify="left" if column == "scheme" else "right")
    for row in result.rows:
        q = row.quality
        table.add_row(
            row.scheme,
            f"{q['kl']:.2e}" if q.get("kl") is not None else "—",
            f"{q['agreement']:.1%}" if q.get("agreement") is not None else "—",
            f"{q['max_dp']:.3f}" if q.get("max_dp") is not None else "—",
            f"{row.backbone_bytes / 1e6:.3f}",
            f"{row.seconds:.1f}",
            f"{row.calibration_seconds:.1f}",
        )
    results_console().print(table)
