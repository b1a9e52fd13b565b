"""The release folders a benchmark is given: checked before anything runs, and named as its report's rows."""

from __future__ import annotations

from pathlib import Path

from clef_quant.bench.errors import BenchError


def check_release(folder: Path) -> None:
    """Refuse a folder that is no release before any engine starts on it (only config.json is looked for: the
    engine's own check says what else is missing)."""
    if not (folder / "config.json").is_file():
        raise BenchError(f"{folder} is not a release folder")


def row_name(folder: Path) -> str:
    """A release's row: its scheme's labels for a quantized folder (see `plugin_side_name`), bf16 for a source."""
    from clef_quant.bench.throughput import plugin_side_name

    return plugin_side_name(folder) if (folder / "clef_quant.json").is_file() else "bf16"
