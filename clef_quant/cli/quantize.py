"""`clef-quant quantize` and `clef-quant inspect`: make a quantized release folder, and check one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clef_quant.cli._errors import fail, read_json_file, user_errors
from clef_quant.cli._options import (
    RevisionOption,
    calibration_records_option,
    device_option,
    max_seq_len_option,
    scheme_option,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import quantization_bars
from clef_quant.formatting import binary_size
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN
from clef_quant.quantize.registry import schemes

STREAMING_DEFAULT = schemes().streaming_default()


@user_errors
def quantize(
    source: Annotated[str, typer.Argument(help="Release folder, or a Hub id (ORG/NAME) when the Hub is reachable.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (written as OUT.partial, then renamed).")],
    scheme: Annotated[
        str | None,
        scheme_option(
            "The recipe in recipes/. auto: a per-layer mix of NVFP4, FP8 and bf16 chosen from --scan under "
            "--max-kl or --max-size-gb."
        ),
    ] = None,
    recipe_file: Annotated[
        Path | None, typer.Option("--recipe", help="An llm-compressor recipe YAML to use instead of the scheme's.")
    ] = None,
    calibration_file: Annotated[
        Path | None, typer.Option("--calibration", help="JSONL of SystemOne requests to calibrate on (NVFP4 family).")
    ] = None,
    calibration_records: Annotated[
        int | None,
        calibration_records_option("Records to draw (default 512; from --calibration, else the shipped default file)."),
    ] = None,
    max_seq_len: Annotated[int, max_seq_len_option()] = DEFAULT_MAX_SEQ_LEN,
    device: Annotated[str, device_option("Where to calibrate: cpu, cuda or cuda:N.")] = "cpu",
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    include: Annotated[
        list[str] | None,
        typer.Option(
            "--include",
            metavar="PATTERN",
            help="Carry a source file the release allowlist leaves out (fnmatch on its folder-relative path; "
            "FILE:auto_map keeps that key). Repeatable; what may run code is listed in the manifest.",
        ),
    ] = None,
    streaming: Annotated[
        bool | None,
        typer.Option(
            "--streaming/--no-streaming",
            help="Quantize shard by shard without loading the model (data-free recipes only). Default: on for "
            f"{', '.join(STREAMING_DEFAULT[:-1])} and {STREAMING_DEFAULT[-1]}, whose output is bit-identical to "
            "the loaded model's.",
            show_default=False,
        ),
    ] = None,
    revision: RevisionOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llm-compressor's own logs.")] = False,
    scan_file: Annotated[
        Path | None, typer.Option("--scan", help="--scheme auto: the scan.json of `clef-quant scan` on this source.")
    ] = None,
    max_kl: Annotated[
        float | None, typer.Option(help="--scheme auto: most predicted KL (sum of the chosen units' scan KLs).")
    ] = None,
    max_size_gb: Annotated[
        float | None, typer.Option(help="--scheme auto: largest backbone size in GB (10^9 bytes); least KL within.")
    ] = None,
) -> None:
    """Quantize a Clef release: compressed backbone, head and tokenizer unchanged, manifest with hashes.

    Only what a Clef release is made of is carried: configs, tokenizer and processor files, chat template,
    generation config, licence and notice files, the source card (as source_card.md), the head (byte-identical at
    the root, where vLLM >= 0.33 and SGLang look) and joint_schema_model.py. Any other file, and any auto_map
    key, is left out and named in one warning.

    Examples:
      clef-quant quantize artifacts/tiny --scheme nvfp4 --calibration-records 16 --out artifacts/tiny-NVFP4
      clef-quant quantize Cloudflare/clef-flash --scheme nvfp4 --calibration calib.jsonl --device cuda -o flash-NVFP4
      clef-quant quantize artifacts/tiny --scheme auto --scan artifacts/scan/scan.json --max-kl 0.01 -o tiny-AUTO
      clef-quant quantize artifacts/tiny --scheme fp8-dynamic --no-streaming -o tiny-FP8  # load the model
    """
    # `--scheme` was checked by its parser; the library checks the rest of the choice where it is entered.
    from clef_quant.quantize.run import QuantizeConfig
    from clef_quant.quantize.run import quantize as run_quantize

    config = QuantizeConfig(
        source=source,
        out=out,
        scheme=scheme,
        recipe_file=recipe_file,
        calibration_file=calibration_file,
        calibration_records=calibration_records,
        max_seq_len=max_seq_len,
        device=device,
        overwrite=overwrite,
        revision=revision,
        include=tuple(include or ()),
        streaming=streaming,
        scan_file=scan_file,
        max_kl=max_kl,
        max_size_gb=max_size_gb,
    )
    with quantization_bars(verbose) as progress:
        result = run_quantize(config, progress)
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    _print_summary(results_console(), result)


@user_errors
def inspect_checkpoint(
    folder: Annotated[Path, typer.Argument(help="A quantized release folder (any compressed-tensors checkpoint).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of tables.")] = False,
    engines: Annotated[
        bool,
        typer.Option("--engines", help="Also say which engines will detect the folder as a Clef model, and how."),
    ] = False,
    request_file: Annotated[
        Path | None,
        typer.Option(
            "--request",
            help="A SystemOne request JSON: also say which of its questions each engine would refuse "
            "(implies --engines).",
        ),
    ] = None,
) -> None:
    """List every Linear module with its scheme, totals by kind, and the checks; exit 1 on any violation.

    Checks: keep-list bf16 (lm_head, vision tower, DeltaNet in_proj_a/b, embeddings), fused groups share one
    scheme and global scale (in_proj_qkv+in_proj_z, q/k/v, gate/up), config matches stored tensors, manifest
    (clef_quant.json) present, valid and matching every file's sha256, no symlink, no code or auto_map unless
    the manifest includes it on purpose, head files at the root (an older release's clef_head/ passes with a note).
    Load safety, for engines that load a broken release without a word: every scale finite and positive, no FP4/FP8
    row or block all zero where the bf16 source (named by the manifest, when on this machine) is not, every target
    and ignore entry matching a module, and the tensor names config.json's architecture loads. An
    unfinished output (DIR.partial) fails with one line. A bf16 source release is inspected as a source and says
    so. --engines adds one row per engine (clef-vllm, vllm serve, vLLM >= 0.33, SGLang, llama.cpp, NeMo): whether
    it detects a Clef model here, what it misses, whether it reads the weights as stored (its loading rules, read
    from its code: loads, drops or misreads which layers, or refuses), and its limits; --request FILE adds what of
    that request it would refuse. Neither changes the exit status.

    Example: clef-quant inspect artifacts/tiny-NVFP4 --engines --request examples/request.json
    """
    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    from clef_quant import engines_compat
    from clef_quant.quantize import engines_loading
    from clef_quant.quantize.inspect import inspect_checkpoint as run_inspect

    request = None
    if request_file is not None:  # a bad request fails before the folder is read
        request = engines_compat.read_request(read_json_file(str(request_file)))
    show_engines = engines or request is not None
    report = run_inspect(folder)
    detections = engines_compat.detect_all(folder) if show_engines and report.kind != "unfinished" else None
    loads = {check.engine: check for check in engines_loading.check_folder(folder)} if detections else {}
    if as_json:
        data = _report_json(report)
        if detections is not None:
            data["engines"] = _engines_json(detections, loads, request)
        typer.echo(json.dumps(data, indent=2))
    elif report.kind == "unfinished":
        for violation in report.violations:  # nothing else was read
            typer.secho(f"error: {violation.subject}: {violation.message}", fg=typer.colors.RED, err=True)
    else:
        console = results_console()
        _print_report(console, report)
        if detections is not None:
            _print_engines(console, detections, loads, request, request_file)
    if not report.ok:
        raise typer.Exit(1)


# -- rendering ------------------------------------------------------------------------------------------------


def _print_summary(console: Console, result: Any) -> None:
    from clef_quant.quantize.schemes import module_kind

    table = Table(title=f"quantized: {result.out}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    ratio = result.out_bytes / result.source_bytes if result.source_bytes else 0
    table.add_row("scheme", result.scheme)
    table.add_row("path", "streaming, shard by shard" if result.path == "streaming" else "model loaded (oneshot)")
    table.add_row(
        "backbone size", f"{binary_size(result.source_bytes)} -> {binary_size(result.out_bytes)} ({ratio:.0%} of bf16)"
    )
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items() if k != "total")
    table.add_row("time", f"{result.timings['total']:.1f} s ({stages})")
    memory = f"host {binary_size(result.peak_host_bytes)}"
    if result.peak_gpu_bytes is not None:
        memory += f", GPU {binary_size(result.peak_gpu_bytes)}"
    table.add_row("peak memory", memory)
    cal = result.calibration
    if cal.source is None:
        table.add_row("calibration", "none (this scheme needs no data)")
    else:
        skipped = ", ".join(f"{n} {why}" for why, n in cal.skipped.items())
        table.add_row(
            "calibration",
            f"{cal.records} records, {cal.tokens} tokens (max {cal.max_seq_len}) from {cal.source}"
            + (f"; skipped {skipped}" if skipped else "")
            + (f"; {cal.truncated} cut to fit" if cal.truncated else ""),
        )
    kinds: dict[str, int] = {}
    for name in result.kept_bf16:
        kinds[module_kind(name)] = kinds.get(module_kind(name), 0) + 1
    table.add_row("stayed bf16", ", ".join(f"{kind} x{n}" for kind, n in kinds.items()) or "nothing")
    table.add_row("quantized", f"{len(result.plan.quantized)} Linear modules")
    for note in result.notes:
        table.add_row("note", note)
    console.print(table)
    console.print(f"next: clef-quant inspect {result.out}")


def _family_json(family: Any) -> dict[str, Any] | None:
    if family is None:
        return None
    return {
        "name": family.name,
        "release": family.release,
        "architecture": family.architecture,
        "engine_architecture": family.engine_architecture,
        "served_by": family.served_by,
    }


def family_line(family: Any) -> str:
    """Which Clef model a folder is, in one line."""
    if family is None:
        return "model: not a Clef model this toolkit knows"
    return (
        f"model: {family.name} (like {family.release}: {family.architecture}), served by "
        f"{family.served_by} as {family.engine_architecture}"
    )


def _print_report(console: Console, report: Any) -> None:
    console.print(family_line(report.family))
    if report.kind == "source":
        console.print(f"{report.folder}: a bf16 source release (not quantized), inspected as a source")
    modules = Table(title=f"Linear modules of {report.folder}", title_justify="left")
    # Names are what violations cite: never cut them (the kind is in the totals below).
    modules.add_column("module", no_wrap=True, overflow="fold")
    for column in ("shape", "scheme", "stored"):
        modules.add_column(column)
    for m in report.modules:
        style = "dim" if m.scheme == "bf16" else None
        modules.add_row(m.name, "x".join(map(str, m.shape)), m.scheme, m.stored, style=style)
    console.print(modules)

    totals = Table(title="totals by kind", title_justify="left")
    totals.add_column("kind")
    totals.add_column("modules", justify="right")
    totals.add_column("schemes")
    totals.add_column("params", justify="right")
    params: dict[str, int] = {}
    for m in report.modules:
        params[m.kind] = params.get(m.kind, 0) + m.params
    for kind, counts in report.totals_by_kind().items():
        schemes = ", ".join(f"{label} x{n}" for label, n in counts.items())
        totals.add_row(kind, str(sum(counts.values())), schemes, f"{params[kind]:,}")
    console.print(totals)

    checks = Table(title="checks", title_justify="left")
    for column in ("check", "status", "detail"):
        checks.add_column(column)
    colors = {"pass": "green", "fail": "red", "skipped": "yellow"}
    for check in report.checks:
        checks.add_row(check.name, f"[{colors[check.status]}]{check.status}[/]", check.detail)
    console.print(checks)
    for note in report.notes:
        console.print(f"note: {note}")
    for violation in report.violations:
        console.print(f"[red]violation[/] ({violation.check}) {violation.subject}: {violation.message}", soft_wrap=True)
    if report.violations:
        console.print(f"[red]{len(report.violations)} violation(s)[/]")
    else:
        console.print("[green]all checks passed[/]")


def _report_json(report: Any) -> dict[str, Any]:
    return {
        "folder": str(report.folder),
        "kind": report.kind,
        "model": _family_json(report.family),
        "ok": report.ok,
        "modules": [
            {"name": m.name, "kind": m.kind, "shape": list(m.shape), "scheme": m.scheme, "stored": m.stored}
            for m in report.modules
        ],
        "totals_by_kind": report.totals_by_kind(),
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in report.checks],
        "violations": [{"check": v.check, "subject": v.subject, "message": v.message} for v in report.violations],
        "notes": report.notes,
    }


def _limits_text(engine: Any) -> str:
    if not engine.serves:
        return "reads the folder, answers no requests"
    parts = [f"{engine.max_questions} questions"] if engine.max_questions is not None else []
    return ", ".join([*parts, f"choice {engine.choice} options", f"score {engine.score} levels"])


def _print_engines(
    console: Console, detections: list[Any], loads: dict[str, Any], request: Any, request_file: Path | None
) -> None:
    from clef_quant.engines_compat import over_limits
    from clef_quant.quantize.engines_loading import Verdict

    table = Table(title="engines: which detect a Clef model in this folder", title_justify="left")
    for column in ("engine", "detects", "weights", "run", "limits"):
        table.add_column(column, overflow="fold")
    if request is not None:
        table.add_column(f"refuses of {request_file}", overflow="fold")
    for detection in detections:
        engine = detection.engine
        detects = "[green]yes[/]" if detection.detected else "[red]no[/], needs " + "; ".join(detection.missing)
        check = loads[engine.name]
        color = {None: "dim", Verdict.LOADS: "green"}.get(check.verdict, "red")
        row = [engine.name, detects, f"[{color}]{escape(check.summary(limit=1))}[/]", engine.how, _limits_text(engine)]
        if request is not None:
            refused = over_limits(request, engine)
            row.append("[red]" + "; ".join(refused) + "[/]" if refused else ("nothing" if engine.serves else "-"))
        table.add_row(*row)
    console.print(table)


def _engines_json(detections: list[Any], loads: dict[str, Any], request: Any) -> list[dict[str, Any]]:
    from clef_quant.engines_compat import over_limits

    rows = []
    for detection in detections:
        engine = detection.engine
        row: dict[str, Any] = {
            "engine": engine.name,
            "detects": detection.detected,
            "missing": list(detection.missing),
            "weights": loads[engine.name].as_json(),
            "run": engine.how,
            "limits": _limits_text(engine),
        }
        if request is not None:
            row["refuses"] = over_limits(request, engine)
        rows.append(row)
    return rows
