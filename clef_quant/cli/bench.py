"""`clef-quant bench ...`: measure parts of the stack and write a markdown report under bench/results/."""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from clef_quant.bench.modes import MODE_NAMES
from clef_quant.bench.workload import SERVING_STATE_WORDS
from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import (
    BatchSizeRetiredOption,
    EnforceEagerOption,
    EngineArgOption,
    calibration_records_option,
    check_engines,
    device_option,
    dtype_option,
    eager_engine_kwargs,
    max_model_len_option,
    max_seq_len_option,
    name_choice,
    scheme_option,
    warn_batch_size_retired,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import LLM_COMPRESSOR_QUIET, VLLM_QUIET, quiet_tools, stage_line
from clef_quant.formatting import binary_size, utc_minute
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN
from clef_quant.quantize.recipes import AUTO_SCHEME
from clef_quant.quantize.registry import schemes as scheme_registry

app = typer.Typer(
    help="Measure parts of the stack; each command writes a markdown report.\n\n"
    "Example: clef-quant bench head --device cuda --dtype bfloat16",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def bench() -> None:
    """A callback keeps `bench` a group of commands while it holds only one."""


def _command_line() -> str:
    """The command as the user typed it, for the report."""
    return shlex.join(["clef-quant", *sys.argv[1:]])


def _require_release(folder: Path, hint: str | None = None) -> None:
    if not (folder / "config.json").is_file():
        raise fail(f"{folder} is not a release folder", hint=hint)


def _write_report(out: Path, markdown: str, json_text: str | None = None) -> None:
    """The markdown report at `out` and, when given, its JSON beside it (same stem)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    if json_text is not None:
        out.with_suffix(".json").write_text(json_text, encoding="utf-8")


def _report_name(device: str) -> str:
    """`cpu` or `cuda`: a report names the kind of device, not which GPU (and holds no `:`)."""
    return device.partition(":")[0]


@app.command("head")
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
    from clef_quant.bench.head import run_head_bench
    from clef_quant.bench.head_report import bench_command, render_markdown

    out = out or Path(f"bench/results/head-{_report_name(device)}.md")
    with stage_line("benchmarking the head") as progress:
        result = run_head_bench(device=device, dtype=dtype, repeats=repeats, warmup=warmup, progress=progress)
    _write_report(out, render_markdown(result, bench_command(device, dtype, repeats, warmup, out, ctx.command_path)))

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
    typer.echo(f"wrote {out}")


@app.command("serve")
@user_errors
def serve(
    model: Annotated[Path, typer.Option(help="Release folder (e.g. `clef-quant make-tiny DIR --size small`).")],
    records: Annotated[int, typer.Option(min=8, help="Requests scored by each side.")] = 128,
    clients: Annotated[
        int | None, typer.Option(min=1, help="Concurrent HTTP clients.", show_default="32; 4 with --long-inputs")
    ] = None,
    max_model_len: Annotated[int, max_model_len_option("Maximum prompt length in tokens of every side.")] = 4096,
    max_num_batched_tokens: Annotated[
        int, typer.Option(min=256, help="Tokens per engine step of the batched (--no-batch-invariant) runs.")
    ] = 8192,
    compress_above: Annotated[
        int, typer.Option(min=-1, help="Clients zstd-compress bodies larger than this many bytes (-1: never).")
    ] = 1024,
    long_inputs: Annotated[
        bool,
        typer.Option(
            "--long-inputs",
            help="Instead: the wait of small requests behind each long input (12 MB states with no split point, "
            "12 MB of instructions), written as the report's last section; --clients small clients.",
        ),
    ] = False,
    device: Annotated[
        str,
        device_option("Where the reference runs; the engines run where vLLM runs (eager only on a CPU)."),
    ] = "cpu",
    engine_arg: EngineArgOption = None,
    out: Annotated[Path, typer.Option(help="Report path.")] = Path("bench/results/serve-cpu.md"),
) -> None:
    """Server requests/s at N concurrent clients vs the offline engine's records/s, both with and without batch
    invariance, and the plugin's records/s vs the transformers reference, on the same requests in one run.

    Example: clef-quant make-tiny artifacts/small --size small && clef-quant bench serve --model artifacts/small

    Example: clef-quant make-tiny artifacts/tiny && clef-quant bench serve --model artifacts/tiny --long-inputs
    """
    import torch

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.long_inputs import join_section, split_section
    from clef_quant.bench.serve import render_markdown, result_json, run_serve_bench

    _require_release(model, hint=f"clef-quant make-tiny {model} --size small")
    report, section = split_section(out.read_text(encoding="utf-8") if out.is_file() else "")
    # A bad --engine-arg is refused before anything starts, as clef-systemone would refuse it and as vLLM would.
    check_engines([model], max_model_len=max_model_len, **eager_engine_kwargs(False, engine_arg, server=True))
    if long_inputs:
        _long_inputs(model, max_model_len, clients or 4, engine_arg or [], out, report)
        return
    clients = clients or 32
    with _server_exits(), stage_line("benchmarking") as progress:
        result = run_serve_bench(
            model,
            device=device,
            engine_arg=engine_arg or [],
            records=records,
            clients=clients,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            compress_above=None if compress_above < 0 else compress_above,
            progress=progress,
        )
    markdown = render_markdown(result, _command_line(), machine_name(torch.device(device)))
    _write_report(out, join_section(markdown, section), result_json(result))
    typer.echo(
        f"server/offline {result.server_over_offline:.3f}, plugin/reference {result.plugin_over_reference:.2f}; "
        f"wrote {out}"
    )


def _long_inputs(model: Path, max_model_len: int, clients: int, engine_arg: list[str], out: Path, report: str) -> None:
    import torch

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.long_inputs import join_section, render_section, run_long_inputs_bench

    with stage_line("benchmarking") as progress:
        result = run_long_inputs_bench(
            model, max_model_len=max_model_len, clients=clients, engine_arg=engine_arg, progress=progress
        )
    section = render_section(result, _command_line(), machine_name(torch.device("cpu")))
    _write_report(out, join_section(report, section) if report.strip() else section)
    worst = max(row.worst for row in result.rows)
    typer.echo(f"worst small-request wait behind a long input {worst:.2f} s; wrote {out}")


def _release_name(folder: Path) -> str:
    """A release's row: its scheme's labels for a quantized folder (see `plugin_side_name`), bf16 for a source."""
    from clef_quant.bench.throughput import plugin_side_name

    return plugin_side_name(folder) if (folder / "clef_quant.json").is_file() else "bf16"


@contextlib.contextmanager
def _server_exits() -> Iterator[None]:
    """A server that ended by itself ends the command with its reason, one line (exit 1: a failed run)."""
    from clef_quant.bench.processes import ServerExited

    try:
        yield
    except ServerExited as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


@app.command("modes")
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
        typer.Option(
            "--mode",
            metavar="MODE",
            parser=name_choice(MODE_NAMES, "unknown mode {value!r}"),
            help=f"A serving mode, repeatable: {', '.join(MODE_NAMES)}. Default: invariant and batched.",
        ),
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
    import torch
    import transformers
    import vllm

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.modes import MODES, ModesResult, run_modes
    from clef_quant.bench.modes_options import appended, release_and_modes
    from clef_quant.bench.modes_report import server_failures, write_report
    from clef_quant.bench.report_paths import check_report_out, json_beside
    from clef_quant.bench.workload import serving_requests
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request

    chosen = [MODES[name] for name in (mode or ["invariant", "batched"])]
    releases = []
    for given in release:
        folder, modes_of = release_and_modes(given, chosen)
        _require_release(folder)
        releases.append((_release_name(folder), folder, modes_of))
    names = [name for name, _, _ in releases]
    if len(set(names)) != len(names):
        raise fail(f"two releases have the same row name ({', '.join(names)}); give each scheme once")
    profiled = set()
    for given in profile or []:
        scheme, _, mode_name = given.rpartition(":")
        if not any(name == scheme and mode_name in [m.name for m in m_] for name, _, m_ in releases):
            raise fail(f"--profile {given}: name one of the releases ({', '.join(names)}) and one of its modes")
        profiled.add((scheme, mode_name))
    for flag, given_names in (("--serve", serve), ("--serve-native", serve_native)):
        for name in given_names or []:
            if name not in names:
                raise fail(f"{flag} {name}: not one of the releases ({', '.join(names)})")
    engine_kwargs = eager_engine_kwargs(enforce_eager, engine_arg, server=True)
    check_engines([folder for _, folder, _ in releases], max_model_len=max_model_len, **engine_kwargs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = out or Path(f"bench/results/modes-{device.type}.md")
    check_report_out(out)
    bodies = serving_requests(records, seed=0, state_words=state_words)
    encoder = Encoder(releases[0][1], max_length=max_model_len)
    tokens = sum(encoder.encode(parse_request(body)).num_tokens for body in bodies)
    result = ModesResult(
        machine=machine_name(device),
        versions=f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}",
        command=_command_line(),
        records=records,
        tokens=tokens,
        questions=3,
        max_model_len=max_model_len,
        date=utc_minute(),
    )
    if append:
        result = appended(json_beside(out), result)
    quiet_tools(False, VLLM_QUIET)
    # Stopped early (Ctrl-C, or SIGTERM, which user_errors turns into the same), it writes what it measured.
    with _server_exits(), stage_line("benchmarking") as progress, _report_written(lambda: write_report(result, out)):
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
            engine_kwargs=engine_kwargs,
            server_flags=[
                *(["--enforce-eager"] if enforce_eager else []),
                *(flag for item in engine_arg or [] for flag in ("--engine-arg", item)),
            ],
            native_flags=_native_server_flags(enforce_eager, device.type == "cuda"),
            progress=progress,
        )
    for line in server_failures(result):  # the report says so too; a run that only failed should not look done
        typer.secho(f"warning: {line}", fg=typer.colors.YELLOW, err=True)


def _native_server_flags(enforce_eager: bool, gpu: bool) -> list[str]:
    """`vllm serve` flags for the native server: eager as ours when asked, and the GDN prefill backend our engines
    get on a GPU (vLLM's default there needs FlashInfer)."""
    from clef_vllm.engine.settings import gpu_defaults

    flags = ["--enforce-eager"] if enforce_eager else []
    for key, value in (gpu_defaults({}) if gpu else {}).items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


@contextlib.contextmanager
def _report_written(write: Callable[[], list[Path]]) -> Iterator[None]:
    """Write the report when the block ends, also when it ends early (what was measured until then)."""
    try:
        yield
    finally:
        typer.echo(f"wrote {' and '.join(map(str, write()))}")


@app.command("throughput")
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
    from clef_quant.bench.throughput import load_requests, plugin_side_name, run_throughput
    from clef_quant.bench.workload import image_requests
    from clef_quant.throughput_report import write_report
    from clef_vllm.format.request import parse_request

    given = [folder for folder in (fp8, nvfp4, *(quantized or [])) if folder is not None]
    for folder in (reference, *given):
        _require_release(folder)
    folders = [("bf16", reference), *((plugin_side_name(folder), folder) for folder in given)]
    if not data.exists():
        raise fail(f"{data} does not exist", hint="clef-quant build-data --out DATA --source fixtures")

    warn_batch_size_retired(batch_size)
    engine_kwargs = eager_engine_kwargs(enforce_eager, engine_arg)
    check_engines([folder for _, folder in folders], max_model_len=max_model_len, **engine_kwargs)
    quiet_tools(False, VLLM_QUIET)
    requests = load_requests(data, records)
    with stage_line("benchmarking") as progress:
        result = run_throughput(
            reference,
            [(f"plugin {name}", folder) for name, folder in folders],
            requests,
            source=str(data),
            max_model_len=max_model_len,
            device=device,
            engine_kwargs=engine_kwargs,
            progress=progress,
            image_requests=[parse_request(body) for body in image_requests(image_records, seed=0)],
        )
    out = out or Path(f"bench/results/throughput-{_report_name(device)}.md")
    written = write_report(result, _command_line(), out)

    table = Table(title=f"throughput, {result.records} records, {result.machine}")
    for column in ("side", "records/s", "tokens/s", "vs reference"):
        table.add_column(column, justify="left" if column == "side" else "right")
    for row in result.rows:
        ratio = row.records_per_s / result.rows[0].records_per_s
        table.add_row(row.side, f"{row.records_per_s:.2f}", f"{row.tokens_per_s:.0f}", f"{ratio:.2f}x")
    results_console().print(table)
    typer.echo(f"wrote {' and '.join(map(str, written))}")


@app.command("quantize")
@user_errors
def quantize(
    model: Annotated[Path, typer.Option(help="The bf16 release folder (e.g. `clef-quant make-tiny DIR`).")],
    work: Annotated[
        Path,
        typer.Option(
            help="Scratch folder for the quantized folders (kept for inspection; with --against-plain removed "
            "after measuring)."
        ),
    ],
    scheme: Annotated[
        list[str] | None,
        scheme_option(
            "Scheme to run, repeatable; default every scheme in recipes/ (and auto with --scan), with --against-plain "
            f"{' and '.join(scheme_registry().bench_default())}."
        ),
    ] = None,
    against_plain: Annotated[
        bool,
        typer.Option(
            "--against-plain",
            help="Compare with plain llm-compressor instead: wall time and peak host and GPU memory per scheme, "
            "each side in its own process; schemes that stream also against plain model_free_ptq and "
            "--no-streaming.",
        ),
    ] = False,
    data: Annotated[
        Path | None, typer.Option(help="A DATA folder (build-data): adds KL, agreement and max |dp| via eval.")
    ] = None,
    scan: Annotated[
        Path | None, typer.Option(help="scan.json of this model: adds `auto` at the size of nvfp4-hybrid.")
    ] = None,
    calibration_records: Annotated[int, calibration_records_option("Calibration records for every scheme.")] = 16,
    max_seq_len: Annotated[int, max_seq_len_option()] = DEFAULT_MAX_SEQ_LEN,
    max_model_len: Annotated[
        int | None, max_model_len_option("Prompt length limit for evaluation.", show_default="4096")
    ] = None,
    device: Annotated[
        str | None,
        device_option("With --against-plain: where both sides quantize, cpu, cuda or cuda:N.", show_default="cpu"),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Report path (markdown); its JSON goes beside it, same stem. With --against-plain the JSON path; "
            "its markdown goes beside it.",
            show_default="bench/results/quality-cpu.md; with --against-plain bench/results/quantize-<device>.json",
        ),
    ] = None,
) -> None:
    """Quantize one model with every scheme in one run: time, calibration cost, size and, with --data, the head's
    KL, top-1 agreement and max |dp| against bf16 through the plugin.

    With --against-plain: `clef-quant quantize` against plain llm-compressor (same recipe, same calibration ids).
    Wall time and peak host and GPU memory per scheme, each side in its own process.

    Example: clef-quant bench quantize --model artifacts/tiny --work artifacts/bench-q --data artifacts/data \\
        --scan artifacts/scan/scan.json

    Example: clef-quant bench quantize --against-plain --model artifacts/tiny --work artifacts/bench-q \\
        --scheme fp8-dynamic
    """
    quality_only = {"--data": data, "--scan": scan, "--max-model-len": max_model_len}
    mixed = [
        name for name, value in (quality_only if against_plain else {"--device": device}).items() if value is not None
    ]
    if mixed:
        raise fail(f"{', '.join(mixed)} cannot be used {'with' if against_plain else 'without'} --against-plain")
    if against_plain and AUTO_SCHEME in (scheme or []):
        raise fail("auto is not compared against plain llm-compressor")  # plain has no scan to plan from
    _require_release(model, hint=f"clef-quant make-tiny {model}")
    if against_plain:
        _against_plain(model, work, scheme, calibration_records, max_seq_len, device or "cpu", out)
        return
    import json
    from dataclasses import asdict

    from clef_quant.bench.quality import render_markdown, run_quality_bench

    schemes = list(scheme or [*scheme_registry().names, *([AUTO_SCHEME] if scan is not None else [])])
    if AUTO_SCHEME in schemes and scan is None:
        raise fail("auto needs --scan", hint=f"clef-quant scan {model} --out SCAN_DIR")
    out = out or Path("bench/results/quality-cpu.md")
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
            max_model_len=max_model_len or 4096,
            progress=progress,
        )
    _write_report(
        out, render_markdown(result, _command_line()), json.dumps(asdict(result), indent=2, default=str) + "\n"
    )
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
    typer.echo(f"wrote {out}")


def _against_plain(
    model: Path,
    work: Path,
    schemes: list[str] | None,
    records: int,
    max_seq_len: int,
    device: str,
    out: Path | None,
) -> None:
    import json

    from clef_quant.bench.quantize_bench import SideFailed, compare, render_markdown

    out = out or Path(f"bench/results/quantize-{_report_name(device)}.json")
    with stage_line("benchmarking") as progress:
        try:
            results = compare(
                model,
                schemes or list(scheme_registry().bench_default()),
                work=work,
                records=records,
                max_seq_len=max_seq_len,
                device=device,
                progress=progress,
            )
        except SideFailed as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from None
    markdown, json_path = out.with_suffix(".md"), out.with_suffix(".json")
    _write_report(markdown, render_markdown(results, _command_line()), json.dumps(results, indent=2) + "\n")

    for name, both in results["schemes"].items():
        clef, plain = both["clef"], both["plain"]
        typer.echo(
            f"{name}: clef {clef['process_wall_seconds']:.1f} s, plain {plain['process_wall_seconds']:.1f} s "
            f"({both['wall_ratio']:.2f}x); peak host clef {binary_size(clef['peak_host_bytes'])}, "
            f"plain {binary_size(plain['peak_host_bytes'])}"
        )
        if "model-free" in both:
            free, loaded = both["model-free"], both["clef-oneshot"]
            typer.echo(
                f"  plain model_free_ptq {free['process_wall_seconds']:.1f} s ({both['model_free_ratio']:.2f}x), "
                f"clef --no-streaming {loaded['process_wall_seconds']:.1f} s; peak host "
                f"{binary_size(free['peak_host_bytes'])} and {binary_size(loaded['peak_host_bytes'])}"
            )
    typer.echo(f"wrote {json_path} and {markdown}")


@app.command("workloads")
@user_errors
def workloads(
    model: Annotated[Path, typer.Option("--model", "-m", help="Release folder whose tokenizer counts the tokens.")],
    out: Annotated[
        Path, typer.Option("--out", help="JSONL file: one line per workload with its body and token counts.")
    ],
    seed: Annotated[int, typer.Option(help="Seed of the generated texts and image.", min=0)] = 0,
) -> None:
    """Write five requests shaped like Flide's published 27B workloads (decision-index, race, multirc with 49
    questions, quality with 6-8k state tokens, gqa with one image), each with its token count.

    Each line: {"workload", "input_tokens", "state_tokens", "flide_ms", "sglang_ms", "body"}; `body` is a SystemOne
    request for `clef-systemone`, `vllm serve` (POST /v1/systemone) or `ClefEngine.score`.

    Example: clef-quant bench workloads --model artifacts/tiny --out artifacts/flide-workloads.jsonl
    """
    import json

    from clef_quant.bench.flide_workloads import flide_workloads
    from clef_quant.bench.report_paths import check_report_out

    _require_release(model, hint=f"clef-quant make-tiny {model} --size clef-tiny")
    check_report_out(out, with_json=False)
    found = flide_workloads(model, seed=seed)
    lines = [
        json.dumps(
            {
                "workload": w.name,
                "input_tokens": w.input_tokens,
                "state_tokens": w.state_tokens,
                "flide_ms": w.flide_ms,
                "sglang_ms": w.sglang_ms,
                "body": w.body,
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        for w in found
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = Table("workload", "input tokens", "state tokens", "Flide ms", "SGLang ms")
    for w in found:
        table.add_row(w.name, str(w.input_tokens), str(w.state_tokens), f"{w.flide_ms:.1f}", f"{w.sglang_ms:.1f}")
    results_console().print(table)
    typer.echo(f"wrote {out}")


@app.command("latency")
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
    repeats: Annotated[int, typer.Option(min=1, help="Timed requests of each workload, after one untimed.")] = 20,
    max_model_len: Annotated[
        int, max_model_len_option("The engines' maximum length: at least the longest workload's tokens (quality's).")
    ] = 12288,
    enforce_eager: EnforceEagerOption = False,
    engine_arg: EngineArgOption = None,
) -> None:
    """Time the five Flide-shaped workloads of `bench workloads` one request at a time on each release: input and
    state tokens, p50 and p95 ms, beside the medians Flide and SGLang publish for the 27B on one H200.

    Each release runs in its own engine in the default mode (invariant kernels; on a GPU torch.compile and CUDA
    graphs unless --enforce-eager). Every workload runs once untimed, then --repeats times one after another, each
    request timed from its body to its answers. Stopped early (Ctrl-C, SIGTERM), it writes what it measured.

    Example: clef-quant bench latency --release artifacts/tiny --repeats 2 --enforce-eager \\
        --out artifacts/flide-latency.md

    Example: clef-quant bench latency --release /dev/shm/clef --release /dev/shm/clef-FP8_DYNAMIC \\
        --out bench/results/flide-latency-h200.md
    """
    import torch

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.flide_workloads import flide_workloads
    from clef_quant.bench.latency import LatencyResult, ReleaseLatency, run_latency
    from clef_quant.bench.latency_report import write_report
    from clef_quant.bench.report_paths import check_report_out
    from clef_quant.families import family_of_folder
    from clef_quant.release_folder.versions import SCORING_TOOLS, tool_versions

    seen: set[Path] = set()
    for folder in release:
        _require_release(folder, hint=f"clef-quant make-tiny {folder}")
        if folder.resolve() in seen:
            raise fail(f"--release {folder} is given twice")
        seen.add(folder.resolve())
    engine_kwargs = eager_engine_kwargs(enforce_eager, engine_arg)
    check_report_out(out)
    check_engines(release, max_model_len=max_model_len, **engine_kwargs)
    runs = []
    with stage_line("building the workloads"):
        for folder in release:
            workloads = flide_workloads(folder)
            longest = max(workloads, key=lambda w: w.input_tokens)
            if longest.input_tokens > max_model_len:
                raise fail(
                    f"--max-model-len {max_model_len} is below the {longest.name} workload's {longest.input_tokens} "
                    f"tokens on {folder}; its state would be cut"
                )
            family = family_of_folder(folder)
            model = family.name if family is not None else "unknown"
            runs.append((ReleaseLatency(release=str(folder), model=model, scheme=_release_name(folder)), workloads))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = LatencyResult(
        machine=machine_name(device),
        date=utc_minute(),
        versions=tool_versions(SCORING_TOOLS, source_trees=True),
        command=_command_line(),
        repeats=repeats,
        max_model_len=max_model_len,
        engine={key: repr(value) for key, value in engine_kwargs.items()},
    )
    quiet_tools(False, VLLM_QUIET)
    # Stopped early (Ctrl-C, or SIGTERM, which user_errors turns into the same), it writes what it measured.
    with stage_line("benchmarking") as progress, _report_written(lambda: write_report(result, out)):
        run_latency(runs, result, lambda: write_report(result, out), engine_kwargs=engine_kwargs, progress=progress)
        table = Table(title=f"one request at a time, {result.machine}")
        for column in ("release", "workload", "input tokens", "p50 ms", "p95 ms", "Flide ms", "p50 / Flide"):
            table.add_column(column, justify="left" if column in ("release", "workload") else "right")
        for run, _ in runs:
            for w in run.workloads:
                table.add_row(
                    run.release,
                    w.workload,
                    str(w.input_tokens),
                    f"{w.p50_ms:.1f}",
                    f"{w.p95_ms:.1f}",
                    f"{w.flide_ms:.1f}",
                    f"{w.p50_over_flide:.2f}",
                )
        results_console().print(table)
    failed = [run for run, _ in runs if run.error]
    for run in failed:
        typer.echo(f"{run.release}: {run.error}", err=True)
    if failed:
        raise typer.Exit(1)
