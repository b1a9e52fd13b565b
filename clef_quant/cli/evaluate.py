"""`clef-quant build-data` and `clef-quant eval`: evaluation data from the task files, and bf16 vs candidates."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import (
    BATCH_INVARIANT_HELP,
    BatchSizeRetiredOption,
    CalibrationCountRenamedOption,
    EnforceEagerOption,
    EngineArgOption,
    device_option,
    engine_settings,
    max_model_len_option,
    read_calibration_count,
    warn_batch_size_retired,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import TRANSFORMERS_QUIET, VLLM_QUIET, RichProgress, quiet_tools, stage_line
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH

if TYPE_CHECKING:
    from clef_quant.evaluation.results import ResultsFile


def _quiet(verbose: bool) -> None:
    """vLLM and datasets log every step at INFO; the bars say the same in less space."""
    if verbose:
        return
    quiet_tools(verbose, VLLM_QUIET, TRANSFORMERS_QUIET)
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()


@user_errors
def build_data(
    out: Annotated[Path, typer.Option("--out", "-o", help="DATA folder to write (via DATA.partial).")],
    per_task: Annotated[
        int, typer.Option(min=1, help="Evaluation records per task (fewer if the split is smaller).")
    ] = 200,
    calibration_count: Annotated[
        int,
        typer.Option(
            "--calibration-count",
            min=0,
            help="Calibration records to write, in all, spread over the tasks (0: none). Not quantize's "
            "--calibration, which names a file.",
        ),
    ] = 512,
    calibration_renamed: CalibrationCountRenamedOption = None,
    seed: Annotated[int, typer.Option(help="Sampling seed; the same seed and data give the same records.")] = 0,
    source: Annotated[
        str,
        typer.Option(
            help="'hub' (datasets.load_dataset with the real ids), 'fixtures' (the synthetic rows shipped with "
            "clef-quant, offline) or a folder laid out as the Hub's Parquet export."
        ),
    ] = "hub",
    task: Annotated[
        list[str] | None, typer.Option("--task", help="Only this task (repeatable); default every file in eval/tasks/.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="A release folder: report prompt lengths in tokens instead of characters.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace DATA if it exists.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the datasets library's own logs.")] = False,
) -> None:
    """Sample evaluation records (held-out splits, with gold) and calibration records (training splits) of the tasks.

    Writes DATA/eval/<task>.jsonl, DATA/calibration.jsonl (for `clef-quant quantize --calibration`) and
    DATA/summary.json.

    Examples:
      clef-quant build-data --out data/eval --source fixtures --per-task 8 --calibration-count 32
      clef-quant build-data --out data/flash --tokenizer flash   # flash: the bf16 release folder
    """
    _quiet(verbose)
    from clef_quant.evaluation.build import BuildConfig
    from clef_quant.evaluation.build import build_data as run_build
    from clef_quant.evaluation.tasks import load_tasks

    tasks = load_tasks(names=task)
    if tokenizer is not None and not (tokenizer / "config.json").is_file():
        raise fail(f"--tokenizer {tokenizer} is not a release folder")
    config = BuildConfig(
        out=out,
        per_task=per_task,
        calibration_count=read_calibration_count(calibration_count, calibration_renamed),
        seed=seed,
        source=source,
        tokenizer=tokenizer,
        overwrite=overwrite,
    )
    with stage_line("loading tasks") as progress:
        result = run_build(config, tasks, progress)

    table = Table(title=f"wrote {result.out}", title_justify="left")
    for column in ("task", "dataset", "eval split", "eval records", "calibration split", "calibration records"):
        table.add_column(column, justify="right" if "records" in column else "left")
    for name, entry in result.summary.tasks.items():
        table.add_row(
            name,
            entry.dataset.id or "",
            entry.eval.split or "",
            str(entry.eval.records),
            entry.calibration.split or "",
            str(entry.calibration.records),
        )
    results_console().print(table)


def _warn_rejected(sides: Any) -> None:
    """One line per side whose stored probabilities did not all verify: they were scored again, not trusted."""
    from clef_quant.evaluation.store import describe_rejected

    for side in sides:
        if side.rejected:
            typer.secho(
                f"warning: {side.name}: stored probabilities that did not verify were scored again "
                f"({describe_rejected(side.rejected)})",
                fg=typer.colors.YELLOW,
                err=True,
            )


@user_errors
def evaluate(
    reference: Annotated[
        str, typer.Option(help="The bf16 release folder (or Hub id); runs through transformers AND the plugin.")
    ],
    candidate: Annotated[list[str], typer.Option(help="A quantized release folder to compare (repeatable).")],
    data: Annotated[Path, typer.Option(help="A DATA folder from clef-quant build-data.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="RESULTS folder: results.json/.csv/.md and probs/.")],
    max_model_len: Annotated[
        int, max_model_len_option("Maximum prompt length in tokens, for both sides; the state is cut to fit.")
    ] = DEFAULT_MAX_LENGTH,
    batch_size: BatchSizeRetiredOption = None,
    device: Annotated[str, device_option("Where the reference runs: cpu, cuda or cuda:N.")] = "cpu",
    enforce_eager: EnforceEagerOption = False,
    batch_invariant: Annotated[bool, typer.Option(help=BATCH_INVARIANT_HELP)] = True,
    engine_arg: EngineArgOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show vLLM's and transformers' own logs.")] = False,
) -> None:
    """Compare candidates with the bf16 reference on DATA; the bf16 folder through the plugin is the noise floor.

    Every DATA line is validated before any model loads. Probabilities are kept under RESULTS/probs/, so a rerun
    with the same folders, data and settings reuses them and scores nothing again. Each stored line's hashes catch
    torn and accidentally edited lines (scored again and reported), not someone who can write RESULTS: they are
    plain sha256, so a line rewritten with recomputed hashes is reused. Use a fresh --out to score everything.

    Examples:
      clef-quant eval --reference artifacts/tiny --candidate artifacts/tiny-FP8_DYNAMIC \\
          --candidate artifacts/tiny-NVFP4 --data data/eval --out results/tiny --max-model-len 4096 --enforce-eager
      clef-quant eval --reference flash --candidate flash-NVFP4 --data data/flash --out results/flash --device cuda
    """
    _quiet(verbose)
    from clef_vllm.engine.settings import run_cpu_cores_in_process

    run_cpu_cores_in_process()  # on a CPU: no core process to spawn per side, the same bits as a server
    from clef_quant.evaluation.config import EvalConfig
    from clef_quant.evaluation.data import read_eval_data
    from clef_quant.evaluation.engines import FreshEngines
    from clef_quant.evaluation.report import write_results
    from clef_quant.evaluation.runner import run_eval

    settings = engine_settings(
        reference,
        max_model_len=max_model_len,
        batch_invariant=batch_invariant,
        enforce_eager=enforce_eager,
        engine_arg=engine_arg,
    )
    config = EvalConfig(
        reference=reference,
        candidates=candidate,
        data=data,
        out=out,
        max_model_len=max_model_len,
        device=device,
    )
    warn_batch_size_retired(batch_size)
    records = read_eval_data(data)  # every line checked before a bar is drawn or a model loads
    engines = FreshEngines(settings)
    with RichProgress() as progress:
        run = run_eval(config, engines=engines, progress=progress, data=records)
    paths = write_results(run.results, out)
    _print_summary(results_console(), run.results)
    typer.echo(f"records scored {run.scored}, reused {run.reused}")
    _warn_rejected(run.sides)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


def _print_summary(console: Console, results: ResultsFile) -> None:
    from clef_quant.evaluation.metrics import METRICS, format_value
    from clef_quant.evaluation.results import ALL

    table = Table(title="All tasks", title_justify="left")
    table.add_column("side")
    for metric in METRICS:
        table.add_column(metric.title, justify="right")
    for side in results.sides:
        cells = []
        for metric in METRICS:
            shown = side.role != "reference" or not metric.compares
            cells.append(format_value(metric, results.value(side, ALL, metric.name)) if shown else "—")
        table.add_row(side.name, *cells)
    console.print(table)
