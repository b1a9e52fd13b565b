"""`clef-quant bench modes`: each release in each serving mode side by side in one run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clef_quant.bench.modes import MODE_NAMES
from clef_quant.bench.workload import SERVING_STATE_WORDS
from clef_quant.cli._errors import user_errors
from clef_quant.cli._options import (
    EnforceEagerOption,
    EngineArgOption,
    check_engines,
    engine_settings,
    max_model_len_option,
)
from clef_quant.cli._stderr import VLLM_QUIET, quiet_tools, stage_line
from clef_quant.cli.bench._common import command_line, mode_option, report_written, server_exits


@user_errors
def modes(
    release: Annotated[
        list[str],
        typer.Option(
            "--release",
            metavar="FOLDER[@MODE,...]",
            help="A release folder (bf16 or quantized), repeatable; all are scored on the same requests. "
            "FOLDER@MODE,MODE runs that release in those modes only.",
        ),
    ],
    mode: Annotated[
        list[str] | None,
        mode_option(f"A serving mode, repeatable: {', '.join(MODE_NAMES)}. Default: invariant and batched."),
    ] = None,
    records: Annotated[int, typer.Option(min=8, help="Requests in the workload.")] = 64,
    state_words: Annotated[
        int, typer.Option(min=1, help="Words in each request's state (325: about 1,500 tokens).")
    ] = SERVING_STATE_WORDS,
    max_model_len: Annotated[int, max_model_len_option("The engines' maximum length.")] = 4096,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs of the whole workload per engine.")] = 3,
    probes: Annotated[int, typer.Option(min=1, help="Requests also scored alone, for the invariance check.")] = 16,
    latency_requests: Annotated[int, typer.Option(min=1, help="Single requests timed one after another.")] = 20,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RELEASE:MODE",
            help="Profile single requests and one call over the whole workload of a release (its row name, e.g. "
            "FP8_DYNAMIC) in one mode: on a GPU kernel time by part of the model and the GPU's idle time; "
            "repeatable, to set two modes side by side.",
        ),
    ] = None,
    serve: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RELEASE",
            help="Also serve this release (row name) with clef-systemone in the default mode at 1, 8 and 64 "
            "clients; repeatable.",
        ),
    ] = None,
    serve_native: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RELEASE",
            help="Also serve this release (row name) with vLLM's own Clef class, `vllm serve` without our plugin "
            "and with vLLM's defaults (vLLM 0.33 and later), at the same client counts; repeatable.",
        ),
    ] = None,
    enforce_eager: EnforceEagerOption = False,
    engine_arg: EngineArgOption = None,
    append: Annotated[
        bool,
        typer.Option(
            "--append",
            help="Add these runs to the report already at --out (same workload and machine), e.g. a second batch of "
            "releases measured right after the first.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Report path (markdown, not .json; JSON beside it).", show_default="bench/results/modes-<device>.md"
        ),
    ] = None,
) -> None:
    """Each release in each serving mode, side by side in one run: records/s and tokens/s, whether a request
    alone gets the bits it gets inside a full batch, single-request latency, and optionally clef-systemone at 1,
    8 and 64 clients and a profile of where a request's time goes. Meant for GPUs; runs on a CPU too.

    Example: clef-quant bench modes --release flash --release flash-FP8_DYNAMIC --mode invariant --mode batched \
        --serve FP8_DYNAMIC --profile FP8_DYNAMIC:invariant --profile FP8_DYNAMIC:batched \
        --out bench/results/serve-h200.md
    """
    from clef_quant.bench.environment import engine_device
    from clef_quant.bench.modes import run_modes
    from clef_quant.bench.modes_options import appended, check_served, profiled_pairs, read_releases, starting_result
    from clef_quant.bench.modes_report import server_failures, write_report
    from clef_quant.bench.modes_servers import native_server_flags
    from clef_quant.bench.report_paths import check_report_out, default_report, json_beside

    releases = read_releases(release, mode)
    profiled = profiled_pairs(profile or [], releases)
    check_served("--serve", serve or [], releases)
    check_served("--serve-native", serve_native or [], releases)
    device = engine_device()
    out = out or default_report("modes", device.type)
    check_report_out(out)
    quiet_tools(False, VLLM_QUIET)  # before vLLM is first imported: it reads its log level then
    settings = engine_settings(
        releases[0][1], max_model_len=max_model_len, enforce_eager=enforce_eager, engine_arg=engine_arg, server=True
    )
    bodies, result = starting_result(
        releases[0][1],
        records=records,
        state_words=state_words,
        max_model_len=max_model_len,
        command=command_line(),
        device=device,
    )
    if append:
        result = appended(json_beside(out), result)
    # Last of the checks: vLLM's warnings about a configuration it accepts are printed here.
    check_engines([folder for _, folder, _ in releases], settings)
    # Stopped early (Ctrl-C, or SIGTERM, which user_errors turns into the same), it writes what it measured.
    with server_exits(), stage_line("benchmarking") as progress, report_written(lambda: write_report(result, out)):
        run_modes(
            releases,
            bodies,
            result,
            json_beside(out),
            repeats=repeats,
            probes=min(probes, records),
            latency_requests=min(latency_requests, records),
            profile=profiled,
            server_releases=serve,
            native_releases=serve_native,
            settings=settings,
            native_flags=native_server_flags(enforce_eager, device.type == "cuda"),
            progress=progress,
        )
    for line in server_failures(result):  # the report says so too; a run that only failed should not look done
        typer.secho(f"warning: {line}", fg=typer.colors.YELLOW, err=True)
