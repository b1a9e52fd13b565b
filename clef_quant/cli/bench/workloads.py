"""`clef-quant bench workloads`: the five Flide-shaped requests written as JSONL, with their token counts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import user_errors
from clef_quant.cli._output import results_console
from clef_quant.cli.bench._common import require_release


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
    from clef_quant.bench.flide_workloads import flide_workloads, write_jsonl
    from clef_quant.bench.report_paths import check_report_out

    require_release(model, hint=f"clef-quant make-tiny {model} --size clef-tiny")
    check_report_out(out, with_json=False)
    found = flide_workloads(model, seed=seed)
    write_jsonl(found, out)
    table = Table("workload", "input tokens", "state tokens", "Flide ms", "SGLang ms")
    for w in found:
        table.add_row(w.name, str(w.input_tokens), str(w.state_tokens), f"{w.flide_ms:.1f}", f"{w.sglang_ms:.1f}")
    results_console().print(table)
    typer.echo(f"wrote {out}")
