"""What a scan shows a person: `scan.csv`, the `scan.md` table and the `scan.png` heatmap, from one frame."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from clef_quant.formatting import markdown_table
from clef_quant.quantize.scan_file import GROUPS, SCAN_CSV, SCAN_MD, SCAN_PNG, ScanFile


def scan_frame(scan_file: ScanFile) -> Any:
    import pandas as pd

    rows = [u.model_dump(exclude={"modules", "record_kl"}) | {"modules": len(u.modules)} for u in scan_file.units]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    order = {g: i for i, g in enumerate(GROUPS)}
    frame = frame.assign(_g=frame["group"].map(order)).sort_values(["scheme", "layer", "_g"]).drop(columns="_g")
    frame["flip_rate"] = frame["flips"] / frame["questions"]
    return frame.reset_index(drop=True)


def write_reports(scan_file: ScanFile, out: Path) -> list[Path]:
    frame = scan_frame(scan_file)
    csv_path, md_path, png_path = out / SCAN_CSV, out / SCAN_MD, out / SCAN_PNG
    frame.to_csv(csv_path, index=False)
    md_path.write_text(render_markdown(scan_file, frame), encoding="utf-8")
    plot_heatmap(frame, png_path, title=f"KL(bf16 || one unit quantized), {scan_file.source}")
    return [csv_path, md_path, png_path]


def render_markdown(scan_file: ScanFile, frame: Any) -> str:
    lines = [
        f"# Sensitivity scan of {scan_file.source}",
        "",
        f"{scan_file.settings.heldout} held-out records, {scan_file.settings.calibration_records} calibration "
        f"records, device {scan_file.device}. KL: mean KL(bf16 || unit quantized) over every question, with "
        f"{_interval_words(scan_file)}; flips: questions whose top-1 option changed.",
        "",
        markdown_table(
            ["layer", "group", "scheme", "KL mean", "KL 95% interval", "KL max", "flips", "MB saved", "seconds"],
            [
                [
                    row.layer, row.group, row.scheme, f"{row.kl_mean:.3e}", interval_cell(row), f"{row.kl_max:.3e}",
                    f"{row.flips}/{row.questions}", f"{row.bytes_saved / 1e6:.3f}", f"{row.seconds:.1f}",
                ]
                for row in frame.itertuples()
            ],
            "rllrrrrrr",
        ),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _interval_words(scan_file: ScanFile) -> str:
    found = scan_file.intervals
    if not found:
        return "no interval (a scan written before intervals)"
    return (
        f"its 95% interval over the held-out records (bootstrap: {found.get('resamples')} resamples of the records, "
        f"seed {found.get('seed')}); two units whose intervals overlap may rank either way on other records"
    )


def interval_cell(row: Any) -> str:
    """`[low, high]` of a unit's KL, or a dash for a scan written before intervals."""
    low, high = getattr(row, "kl_low", None), getattr(row, "kl_high", None)
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "—"
    return f"[{low:.2e}, {high:.2e}]"


def plot_heatmap(frame: Any, path: Path, *, title: str) -> None:
    """One panel per scheme: decoder layers down, groups across, colour = log10 of the mean KL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    schemes = list(dict.fromkeys(frame["scheme"])) if not frame.empty else []
    groups = list(GROUPS)
    layers = sorted(set(frame["layer"])) if not frame.empty else []
    fig, axes = plt.subplots(1, max(1, len(schemes)), figsize=(3.2 * max(1, len(schemes)) + 1, 0.35 * len(layers) + 2))
    axes = np.atleast_1d(axes)
    floor = 1e-8
    values = frame["kl_mean"].clip(lower=floor) if not frame.empty else []
    vmin = math.log10(min(values)) if len(values) else -8
    vmax = math.log10(max(values)) if len(values) else 0
    image = None
    for ax, scheme in zip(axes, schemes, strict=False):
        grid = np.full((len(layers), len(groups)), np.nan)
        for row in frame[frame["scheme"] == scheme].itertuples():
            grid[layers.index(row.layer), groups.index(row.group)] = math.log10(max(row.kl_mean, floor))
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=vmin, vmax=max(vmax, vmin + 1e-6))
        ax.set_xticks(range(len(groups)), groups)
        ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
        ax.set_title(scheme)
        ax.set_ylabel("decoder layer")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="log10 mean KL")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
