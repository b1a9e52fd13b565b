"""`clef-quant make-tiny`: write a random-weight Clef release folder (tests, benchmarks, demos)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clef_quant.cli._errors import fail, user_errors

_SIZE_CHOICES = ("tiny", "small", "flash")


@user_errors
def make_tiny(
    out_dir: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to create (refused if it exists).")],
    size: Annotated[
        str,
        typer.Option(
            help="tiny (a few MB, tests), small (tens of millions of parameters, CPU benchmarks) "
            "or flash (clef-flash shapes, 9.4 B parameters, 19 GB; build with --device cuda)."
        ),
    ] = "tiny",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed on the same device gives identical files.")] = 0,
    device: Annotated[str, typer.Option(help="Where the weights are drawn: cpu or cuda.")] = "cpu",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace DIR if it already holds a checkpoint.")
    ] = False,
) -> None:
    """Write a random-weight release: Qwen3.5 backbone, tokenizer, processor and joint schema head.

    It loads exactly like a real release (transformers, AutoProcessor, vLLM); only the numbers are random.

    Examples:
      clef-quant make-tiny artifacts/tiny
      clef-quant make-tiny artifacts/small --size small --seed 1
      clef-quant make-tiny /scratch/flash --size flash --device cuda
    """
    if size not in _SIZE_CHOICES:
        raise fail(f"--size must be one of {', '.join(_SIZE_CHOICES)}, not {size}")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise fail(f"--device must be cpu or cuda, not {device}")
    if seed < 0:
        raise fail(f"--seed must be >= 0, not {seed}")
    if out_dir.exists() and not overwrite:
        raise fail(f"{out_dir} already exists", hint=f"clef-quant make-tiny {out_dir} --overwrite")

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from clef_quant.tiny import make_tiny as build
    from clef_quant.tiny import parameter_count
    from clef_quant.tiny.build import folder_bytes

    labels = {"tokenizer": "tokenizer + processor", "weights": f"backbone ({device})", "head": "joint schema head"}
    tasks: dict[str, TaskID] = {}
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.fields[amount]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(labels.get(stage, stage), total=total, amount="")
            # Only the weights count bytes; the other stages are one step each.
            amount = f"{_bytes(done)} / {_bytes(total)}" if stage == "weights" else ""
            bar.update(tasks[stage], completed=done, total=total, amount=amount)

        folder = build(out_dir, size=size, seed=seed, device=device, overwrite=overwrite, progress=progress)

    params = parameter_count(size)
    typer.echo(
        f"wrote {folder}: {size}, {_count(params)} parameters, {_bytes(folder_bytes(folder))} on disk "
        f"(seed {seed}, {device})"
    )


def _count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
