"""`clef-quant scan`: per-layer sensitivity of a release to each candidate scheme."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from clef_quant.cli._errors import user_errors
from clef_quant.cli._options import (
    RevisionOption,
    calibration_records_option,
    device_option,
    max_seq_len_option,
    scan_scheme_option,
)
from clef_quant.cli._output import results_console
from clef_quant.cli._stderr import quantization_bars
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN
from clef_quant.quantize.registry import schemes
from clef_quant.quantize.scan_file import DEFAULT_CALIBRATION_RECORDS, DEFAULT_HELDOUT

SHOWN = 12  # rows of the most sensitive units printed at the end


@user_errors
def scan(
    source: Annotated[str, typer.Argument(help="The bf16 release folder (or a Hub id when the Hub is reachable).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for scan.json, scan.csv, scan.md and scan.png.")],
    scheme: Annotated[
        list[str] | None,
        scan_scheme_option(
            f"Candidate scheme, repeatable; default {' and '.join(schemes().default_scan())} (what auto needs). AWQ "
            "rescales norms and the hybrid is already a mix, so their units cannot be switched on alone."
        ),
    ] = None,
    calibration_file: Annotated[
        Path | None,
        typer.Option("--calibration", help="JSONL of SystemOne requests (default: the shipped calibration file)."),
    ] = None,
    calibration_records: Annotated[
        int, calibration_records_option("Records to calibrate on.")
    ] = DEFAULT_CALIBRATION_RECORDS,
    heldout: Annotated[
        int, typer.Option(help="The file's last N text requests: scored, never calibrated on.")
    ] = DEFAULT_HELDOUT,
    max_seq_len: Annotated[
        int,
        max_seq_len_option("Length in tokens of calibration and held-out records (not an engine's --max-model-len)."),
    ] = DEFAULT_MAX_SEQ_LEN,
    device: Annotated[str, device_option("cpu, or cuda / cuda:N (one GPU) for clef-flash.")] = "cpu",
    overwrite: Annotated[bool, typer.Option(help="Start over instead of resuming OUT/scan.json.")] = False,
    revision: RevisionOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llm-compressor's own logs.")] = False,
) -> None:
    """Quantize one decoder-layer Linear group at a time (DeltaNet projections, attention, MLP) and measure the
    head's KL from bf16 and top-1 flips on held-out requests, and the bytes saved.

    Resumes: an interrupted scan continues from OUT/scan.json. The result feeds `quantize --scheme auto`.

    Examples:
      clef-quant scan artifacts/tiny --out artifacts/scan --calibration-records 8 --heldout 8
      clef-quant scan clef-flash --out scan-flash --device cuda --calibration data/calibration.jsonl
    """
    from clef_quant.quantize.scan import ScanConfig
    from clef_quant.quantize.scan import scan as run_scan
    from clef_quant.quantize.scan_report import interval_cell, scan_frame

    config = ScanConfig(
        source=source,
        out=out,
        schemes=tuple(scheme or schemes().default_scan()),
        calibration_file=calibration_file,
        calibration_records=calibration_records,
        heldout=heldout,
        max_seq_len=max_seq_len,
        device=device,
        overwrite=overwrite,
        revision=revision,
    )
    with quantization_bars(verbose) as progress:
        outcome = run_scan(config, progress)
    frame = scan_frame(outcome.scan)
    table = Table(title=f"most sensitive units of {len(frame)} (mean KL over held-out questions)", title_justify="left")
    for column in ("layer", "group", "scheme", "KL mean", "KL 95%", "flips", "MB saved"):
        table.add_column(column, justify="left" if column in ("group", "scheme") else "right")
    for row in frame.sort_values("kl_mean", ascending=False).head(SHOWN).itertuples():
        table.add_row(
            str(row.layer),
            row.group,
            row.scheme,
            f"{row.kl_mean:.2e}",
            interval_cell(row),
            f"{row.flips}/{row.questions}",
            f"{row.bytes_saved / 1e6:.3f}",
        )
    results_console().print(table)
    if outcome.resumed:
        typer.echo(f"resumed: {outcome.resumed} unit(s) from an earlier run")
    typer.echo("wrote " + ", ".join(str(p) for p in outcome.files))
    typer.echo(f"next: clef-quant quantize {source} --scheme auto --scan {out / 'scan.json'} --max-kl X --out DIR")
