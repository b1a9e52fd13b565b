"""`clef-quant bench throughput`: the transformers reference and the plugin on the same records."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import (
    BatchSizeRetiredOption,
    EnforceEagerOption,
    EngineArgOption,
    check_engines,
    device_option,
    engine_settings,
    max_model_len_option,
    warn_batch_size_retired,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import VLLM_QUIET, quiet_tools, stage_line
from clef_quant.cli.bench._common import command_line, require_release

if TYPE_CHECKING:
    from clef_quant.throughput_report import ThroughputResult


@user_errors
def throughput(
    reference: Annotated[Path, typer.Option(help="The bf16 release folder: the reference and the bf16 plugin side.")],
    data: Annotated[
        Path, typer.Option(help="A DATA folder (clef-quant build-data; tasks taken in turn) or a JSONL of requests.")
    ],
    quantized: Annotated[
        list[Path] | None,
        typer.Option(
            "--quantized",
            metavar="FOLDER",
            help="A quantized release folder to run through the plugin, repeatable; its row is named by the "
            "scheme its manifest records.",
        ),
    ] = None,
    # The two flags of earlier versions, still read (scripts/demo.sh and older commands in reports use them).
    fp8: Annotated[Path | None, typer.Option(hidden=True)] = None,
    nvfp4: Annotated[Path | None, typer.Option(hidden=True)] = None,
    records: Annotated[int, typer.Option(min=1, help="Requests scored by every side.")] = 64,
    batch_size: BatchSizeRetiredOption = None,
    image_records: Annotated[
        int, typer.Option(min=0, help="Generated records with one image each, timed as their own row (0: none).")
    ] = 16,
    max_model_len: Annotated[int, max_model_len_option("Maximum prompt length for both sides.")] = 4096,
    device: Annotated[
        str, device_option("Where the reference runs: cpu, cuda or cuda:N (the plugin runs where vLLM runs).")
    ] = "cpu",
    enforce_eager: EnforceEagerOption = False,
    engine_arg: EngineArgOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Report path (markdown); its JSON goes beside it, same stem.",
            show_default="bench/results/throughput-<device>.md",
        ),
    ] = None,
) -> None:
    """Records/s and tokens/s of the transformers reference and of the plugin (bf16 and each quantized folder) on
    the same records.

    Example: clef-quant bench throughput --reference artifacts/tiny --quantized artifacts/tiny-FP8_DYNAMIC \\
        --quantized artifacts/tiny-NVFP4 --data data/eval --records 28 --enforce-eager
    """
    from clef_quant.bench.report_paths import default_report
    from clef_quant.bench.throughput import image_workload, load_requests, plugin_sides, run_throughput
    from clef_quant.throughput_report import write_report

    given = [folder for folder in (fp8, nvfp4, *(quantized or [])) if folder is not None]
    for folder in (reference, *given):
        require_release(folder)
    sides = plugin_sides(reference, given)
    if not data.exists():
        raise fail(f"{data} does not exist", hint="clef-quant build-data --out DATA --source fixtures")

    warn_batch_size_retired(batch_size)
    quiet_tools(False, VLLM_QUIET)  # before vLLM is first imported: it reads its log level then
    settings = engine_settings(
        reference, max_model_len=max_model_len, enforce_eager=enforce_eager, engine_arg=engine_arg
    )
    requests = load_requests(data, records)
    # Last of the checks: vLLM's warnings about a configuration it accepts are printed here.
    check_engines([folder for _, folder in sides], settings)
    with stage_line("benchmarking") as progress:
        result = run_throughput(
            reference,
            sides,
            requests,
            settings,
            source=str(data),
            device=device,
            progress=progress,
            image_requests=image_workload(image_records),
        )
    written = write_report(result, command_line(), out or default_report("throughput", device))
    _print_table(result)
    typer.echo(f"wrote {' and '.join(map(str, written))}")


def _print_table(result: ThroughputResult) -> None:
    table = Table(title=f"throughput, {result.records} records, {result.machine}")
    for column in ("side", "records/s", "tokens/s", "vs reference"):
        table.add_column(column, justify="left" if column == "side" else "right")
    for row in result.rows:
        ratio = row.records_per_s / result.rows[0].records_per_s
        table.add_row(row.side, f"{row.records_per_s:.2f}", f"{row.tokens_per_s:.0f}", f"{ratio:.2f}x")
    results_console().print(table)
