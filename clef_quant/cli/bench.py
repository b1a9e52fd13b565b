"""`clef-quant bench ...`: measure parts of the stack and write a markdown report under bench/results/."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clef_quant.cli._errors import fail, user_errors

app = typer.Typer(
    help="Measure parts of the stack; each command writes a markdown report.\n\n"
    "Example: clef-quant bench head --device cuda --dtype bfloat16",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def bench() -> None:
    """A callback keeps `bench` a group of commands while it holds only one."""


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class Dtype(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


@app.command("head")
@user_errors
def head(
    device: Annotated[Device, typer.Option(help="Where to run the head.")] = Device.cpu,
    dtype: Annotated[Dtype, typer.Option(help="Head and input dtype (releases run bfloat16).")] = Dtype.float32,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per shape; the median is reported.")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs of the vectorized head first.")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Report path.", show_default="bench/results/head-<device>.md")
    ] = None,
) -> None:
    """Time the batched joint schema head against the release's loop form at clef-flash head sizes.

    Three shapes on a 3,000-token record: 1 x 77 options, 3 mixed questions, 49 x 2 options.
    The loop form takes minutes on a CPU.

    Example: clef-quant bench head --device cpu --repeats 3
    """
    import torch

    from clef_quant.bench.head import bench_command, render_markdown, run_head_bench

    if device is Device.cuda and not torch.cuda.is_available():
        raise fail("CUDA is not available on this machine", hint="run with --device cpu")
    out = out or Path(f"bench/results/head-{device.value}.md")
    console = Console(stderr=True)
    with console.status("benchmarking the head") as status:
        result = run_head_bench(
            device=device.value,
            dtype=dtype.value,
            repeats=repeats,
            warmup=warmup,
            on_step=lambda message: status.update(message),
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    command = bench_command(device.value, dtype.value, repeats, warmup, out)
    out.write_text(render_markdown(result, command), encoding="utf-8")

    table = Table(title=f"joint schema head, {result.machine}, {result.dtype}")
    table.add_column("shape")
    for column in ("questions", "options", "vectorized ms", "loop ms", "loop / vectorized", "max |diff|"):
        table.add_column(column, justify="right")
    for row in result.rows:
        table.add_row(
            row.shape,
            str(row.questions),
            str(row.options),
            f"{row.vectorized_ms:.2f}",
            f"{row.loop_ms:.2f}",
            f"{row.speedup:.1f}x",
            f"{row.max_abs_diff:.2e}",
        )
    Console().print(table)
    typer.echo(f"wrote {out}")
