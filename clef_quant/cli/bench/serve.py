"""`clef-quant bench serve`: the server against the offline engine and the plugin against the reference, or, with
--long-inputs, the wait of small requests behind long ones."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import (
    EngineArgOption,
    check_engines,
    device_option,
    engine_settings,
    max_model_len_option,
)
from clef_quant.cli._stderr import stage_line
from clef_quant.cli.bench._common import command_line, require_release, server_exits

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings


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
    prompt_chunk: Annotated[
        int | None,
        typer.Option(
            min=16,
            help="With --long-inputs: long prompts in pieces of N tokens, in turns (clef-systemone's --prompt-chunk, "
            "with --language-model-only).",
        ),
    ] = None,
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
    from clef_quant.bench.long_inputs import join_section, read_report
    from clef_quant.bench.report_paths import write_report
    from clef_quant.bench.serve import render_markdown, result_json, run_serve_bench

    if prompt_chunk is not None and not long_inputs:
        raise fail("--prompt-chunk applies to --long-inputs (the other runs set their own step sizes)")
    require_release(model, hint=f"clef-quant make-tiny {model} --size small")
    # Read before the run: a report that cannot be read ends the command before minutes of measuring.
    report, section = read_report(out)
    # A bad --engine-arg is refused before anything starts, as clef-systemone would refuse it and as vLLM would.
    settings = engine_settings(
        model,
        max_model_len=max_model_len,
        engine_arg=engine_arg,
        server=True,
        prompt_chunk=prompt_chunk,  # with --language-model-only: the long inputs are text, and pieces are for text
    )
    check_engines([model], settings)
    if long_inputs:
        _long_inputs(settings, clients or 4, out, report)
        return
    with server_exits(), stage_line("benchmarking") as progress:
        result = run_serve_bench(
            settings,
            device=device,
            records=records,
            clients=clients or 32,
            max_num_batched_tokens=max_num_batched_tokens,
            compress_above=None if compress_above < 0 else compress_above,
            progress=progress,
        )
    markdown = render_markdown(result, command_line(), machine_name(torch.device(device)))
    write_report(out, join_section(markdown, section), result_json(result))
    typer.echo(
        f"server/offline {result.server_over_offline:.3f}, plugin/reference {result.plugin_over_reference:.2f}; "
        f"wrote {out}"
    )


def _long_inputs(settings: EngineSettings, clients: int, out: Path, report: str) -> None:
    import torch

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.long_inputs import render_section, run_long_inputs_bench, with_section
    from clef_quant.bench.report_paths import write_report

    with stage_line("benchmarking") as progress:
        result = run_long_inputs_bench(settings, clients=clients, progress=progress)
    write_report(out, with_section(report, render_section(result, command_line(), machine_name(torch.device("cpu")))))
    worst = max(row.worst for row in result.rows)
    typer.echo(f"worst small-request wait behind a long input {worst:.2f} s; wrote {out}")
