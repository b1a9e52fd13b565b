"""`clef-quant bench head`: the joint schema head's forms timed at clef-flash head sizes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import user_errors
from clef_quant.cli._options import device_option, dtype_option
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import stage_line

if TYPE_CHECKING:
    from clef_quant.bench.head_report import HeadBenchResult


@user_errors
def head(
    ctx: typer.Context,
    device: Annotated[str, device_option("Where to run the head: cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[str, dtype_option("Head and input dtype (releases run bfloat16).")] = "float32",
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per shape; the median is reported.")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs of the vectorized and fast forms first.")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Report path.", show_default="bench/results/head-<device>.md")
    ] = None,
) -> None:
    """Time the batched joint schema head and its fast path (CUDA graphs on a GPU) against the release's loop
    form at clef-flash head sizes.

    Three shapes on a 3,000-token record: 1 x 77 options, 3 mixed questions, 49 x 2 options.
    On a GPU the report adds the fast path's kernel time (profiler) and a step of 8 records, one call each.
    The loop form takes minutes on a CPU.

    Example: clef-quant bench head --device cpu --repeats 3

    Also `python -m clef_quant bench head`, for machines without the clef-quant script.
    """
    # Imported when the command runs: `--help` works on machines that have only what the head needs.
    from clef_quant.bench.head import run_head_bench
    from clef_quant.bench.head_report import bench_command, render_markdown
    from clef_quant.bench.report_paths import default_report, write_report

    out = out or default_report("head", device)
    with stage_line("benchmarking the head") as progress:
        result = run_head_bench(device=device, dtype=dtype, repeats=repeats, warmup=warmup, progress=progress)
    write_report(out, render_markdown(result, bench_command(device, dtype, repeats, warmup, out, ctx.command_path)))
    _print_table(result)
    typer.echo(f"wrote {out}")


def _print_table(result: HeadBenchResult) -> None:
    table = Table(title=f"joint schema head, {result.machine}, {result.dtype}")
    table.add_column("shape")
    columns = ("questions", "options", "vectorized ms", "fast ms", "GPU kernel ms", "loop ms", "loop / fast")
    for column in (*columns, "max |fast - vectorized|", "max |fast - loop|"):
        table.add_column(column, justify="right")
    for row in result.rows:
        table.add_row(
            row.shape,
            str(row.questions),
            str(row.options),
            f"{row.vectorized_ms:.2f}",
            f"{row.fast_ms:.2f}",
            "n/a" if row.kernel_ms is None else f"{row.kernel_ms:.2f}",
            f"{row.loop_ms:.2f}",
            f"{row.fast_speedup:.1f}x",
            f"{row.fast_diff:.2e}",
            f"{row.fast_loop_diff:.2e}",
        )
    results_console().print(table)
    if result.step is not None:
        typer.echo(
            f"{result.step.records} records, one call each: vectorized {result.step.vectorized_ms:.2f} ms, "
            f"fast {result.step.fast_ms:.2f} ms"
        )
