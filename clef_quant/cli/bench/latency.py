"""`clef-quant bench latency`: the Flide-shaped workloads one request at a time on each release."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import (
    EnforceEagerOption,
    EngineArgOption,
    check_engines,
    engine_settings,
    max_model_len_option,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import VLLM_QUIET, quiet_tools, stage_line
from clef_quant.cli.bench._common import command_line, mode_option, report_written, require_release

if TYPE_CHECKING:
    from clef_quant.bench.latency import LatencyResult


@user_errors
def latency(
    release: Annotated[
        list[Path],
        typer.Option(
            "--release",
            metavar="FOLDER",
            help="A release folder (clef-flash, clef or Clef-Omni; bf16 or quantized), repeatable; each gets its own "
            "engine, one after another.",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Report path (markdown, not .json); its JSON goes beside it, same stem; both rewritten after every "
            "workload."
        ),
    ],
    mode: Annotated[
        list[str] | None,
        mode_option(
            "A serving mode (those of `bench modes`), repeatable: each release runs in each, one engine after "
            "another, so that modes read side by side. Default: invariant."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed requests of each workload, after one untimed.")] = 20,
    max_model_len: Annotated[
        int, max_model_len_option("The engines' maximum length: at least the longest workload's tokens (quality's).")
    ] = 12288,
    enforce_eager: EnforceEagerOption = False,
    engine_arg: EngineArgOption = None,
    profile: Annotated[
        bool,
        typer.Option(
            help="Also run each workload a few more times under vLLM's torch profiler: the engine's time per request "
            "by part of the model (GEMM, Gated DeltaNet, attention, ...) and the GPU's idle time, in the report; the "
            "traces go to a folder beside --out (<stem>-traces)."
        ),
    ] = False,
) -> None:
    """Time the five Flide-shaped workloads of `bench workloads` one request at a time on each release: input and
    state tokens, p50 and p95 ms, beside the medians Flide and SGLang publish for the 27B on one H200.

    Each release runs in its own engine in the default mode (invariant kernels; on a GPU torch.compile and CUDA
    graphs unless --enforce-eager), or once in each --mode. Every workload runs once untimed, then --repeats times
    one after another, each request timed from its body to its answers. With --profile, each workload then runs
    under the profiler. Stopped early (Ctrl-C, SIGTERM), it writes what it measured.

    Example: clef-quant bench latency --release artifacts/tiny --repeats 2 --enforce-eager \\
        --out artifacts/flide-latency.md

    Example: clef-quant bench latency --release /dev/shm/clef --release /dev/shm/clef-FP8_DYNAMIC --profile \\
        --out bench/results/flide-latency-h200.md

    Example: clef-quant bench latency --release /dev/shm/clef-FP8_DYNAMIC --mode invariant \\
        --mode invariant-gdn-eager --out bench/results/flide-latency-gdn.md
    """
    from clef_quant.bench.latency import latency_runs, run_latency, starting_result
    from clef_quant.bench.latency_report import write_report
    from clef_quant.bench.report_paths import check_report_out

    seen: set[Path] = set()
    for folder in release:
        require_release(folder, hint=f"clef-quant make-tiny {folder}")
        if folder.resolve() in seen:
            raise fail(f"--release {folder} is given twice")
        seen.add(folder.resolve())
    check_report_out(out)
    quiet_tools(False, VLLM_QUIET)  # before vLLM is first imported: it reads its log level then
    settings = engine_settings(
        release[0], max_model_len=max_model_len, enforce_eager=enforce_eager, engine_arg=engine_arg
    )
    with stage_line("building the workloads"):
        runs = latency_runs(release, max_model_len, tuple(dict.fromkeys(mode or ["invariant"])))
    # Last of the checks: vLLM's warnings about a configuration it accepts are printed here.
    check_engines(release, settings)
    result = starting_result(command_line(), repeats=repeats, settings=settings)
    # Stopped early (Ctrl-C, or SIGTERM, which user_errors turns into the same), it writes what it measured.
    with stage_line("benchmarking") as progress, report_written(lambda: write_report(result, out)):
        traces = out.with_name(f"{out.stem}-traces") if profile else None
        run_latency(runs, result, lambda: write_report(result, out), settings, profile_root=traces, progress=progress)
        _print_table(result)
    failed = [run for run in result.releases if run.error]
    for run in failed:
        typer.echo(f"{run.release}: {run.error}", err=True)
    if failed:
        raise typer.Exit(1)


def _print_table(result: LatencyResult) -> None:
    table = Table(title=f"one request at a time, {result.machine}")
    for column in ("release", "mode", "workload", "input tokens", "p50 ms", "p95 ms", "Flide ms", "p50 / Flide"):
        table.add_column(column, justify="left" if column in ("release", "mode", "workload") else "right")
    for run in result.releases:
        for w in run.workloads:
            table.add_row(
                run.release,
                run.mode,
                w.workload,
                str(w.input_tokens),
                f"{w.p50_ms:.1f}",
                f"{w.p95_ms:.1f}",
                f"{w.flide_ms:.1f}",
                f"{w.p50_over_flide:.2f}",
            )
    results_console().print(table)
