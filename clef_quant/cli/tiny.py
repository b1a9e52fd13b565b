"""`clef-quant make-tiny`: write a random-weight Clef release folder (tests, benchmarks, demos)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import SizeOption, device_option
from clef_quant.formatting import count, decimal_size


@user_errors
def make_tiny(
    out_dir: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to create (refused if it exists).")],
    size: SizeOption = "tiny",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed on the same device gives identical files.")] = 0,
    device: Annotated[str, device_option("Where the weights are drawn: cpu, cuda or cuda:N.")] = "cpu",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace DIR if it already holds a checkpoint.")
    ] = False,
) -> None:
    """Write a random-weight release: backbone (Qwen3.5, or the Qwen3-Omni thinker for omni sizes), tokenizer,
    processor and joint schema head.

    It loads exactly like a real release (transformers, AutoProcessor, vLLM); only the numbers are random.

    Examples:
      clef-quant make-tiny artifacts/tiny
      clef-quant make-tiny artifacts/small --size small --seed 1
      clef-quant make-tiny /scratch/flash --size flash --device cuda
      clef-quant make-tiny /dev/shm/clef --size clef --device cuda
      clef-quant make-tiny artifacts/omni-tiny --size omni-tiny
    """
    if seed < 0:
        raise fail(f"--seed must be >= 0, not {seed}")
    if out_dir.exists() and not overwrite:
        raise fail(f"{out_dir} already exists", hint=f"clef-quant make-tiny {out_dir} --overwrite")

    from clef_quant.cli._stderr import RichProgress
    from clef_quant.tiny import make_tiny as build
    from clef_quant.tiny import parameter_count
    from clef_quant.tiny.build import folder_bytes

    with RichProgress(transient=True) as progress:
        folder = build(out_dir, size=size, seed=seed, device=device, overwrite=overwrite, progress=progress)

    typer.echo(
        f"wrote {folder}: {size}, {count(parameter_count(size))} parameters, "
        f"{decimal_size(folder_bytes(folder))} on disk (seed {seed}, {device})"
    )
