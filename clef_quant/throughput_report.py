"""The `bench throughput` report: the numbers (`ThroughputResult`), written twice from the same functions.

`write_report` writes the markdown report and, beside it with the same stem, a JSON file with every number of it.
Readers (the model card) take the JSON and render their tables with `results_table` and `report_facts`, the
functions the markdown is made of, so a card and the report it shows cannot disagree. The format lives under both
`bench` (its writer) and `publish` (its reader), so that neither tool package depends on the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from clef_quant.documents import read_document, validated
from clef_quant.formatting import facts_table, markdown_table
from clef_vllm.errors import ClefError

REPORT_FORMAT = "clef-quant-bench-throughput/1"
REPORT_TITLE = "Throughput: transformers reference vs the vLLM plugin (bf16, FP8, NVFP4)"


class ThroughputRow(BaseModel):
    # The rates a report's JSON carries beside each row are derived, so reading recomputes them (`ignore`).
    model_config = ConfigDict(frozen=True, extra="ignore")

    side: str
    runner: str  # "transformers" or "vLLM plugin"
    folder: str
    records: int
    tokens: int
    seconds: float
    load_seconds: float  # model load (reference) or engine start (plugin), not in `seconds`
    # The folder's model fingerprint (release_folder.fingerprints): a card shows a report only for the files it
    # measured. None in reports written before it was recorded.
    sha256: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class ThroughputResult(BaseModel):
    """Every number of a report; its JSON is this, with the format and the command that made it in front."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    machine: str
    date: str
    load: str
    versions: dict[str, str | None]
    source: str
    records: int
    tokens: int
    batch_size: int | None = None  # reports before the reference scored one record at a time: its batches
    max_model_len: int
    device: str
    engine: dict[str, Any]
    rows: tuple[ThroughputRow, ...]


def report_facts(result: ThroughputResult, command: str) -> dict[str, str]:
    """The report's key/value header, in the order it is shown."""
    versions = ", ".join(f"{name} {version}" for name, version in result.versions.items() if version)
    return {
        "machine": result.machine,
        "device": result.device,
        "date": result.date,
        "versions": versions,
        "command": f"`{command}`",
        "records": f"{result.records} requests from `{result.source}`, {result.tokens} prompt tokens in all "
        f"(max model len {result.max_model_len})",
        "reference": "transformers, bf16, one record per forward pass"
        if result.batch_size is None
        else f"transformers, bf16, batches of {result.batch_size} records sorted by length (right-padded)",
        "plugin": f"one `ClefEngine.logits` call over all records; engine options {json.dumps(result.engine)}",
        "image rows": "generated requests (`clef_quant.bench.workload.image_requests`), one PNG of 48-160 px a side "
        "each; the reference runs records with media one at a time",
        "timing": "untimed warm-up records on each side, then every record once; model time only (encoding is done "
        "before), perf_counter",
        "load": result.load,
    }


def results_table(result: ThroughputResult) -> str:
    """One row per side: records/s and tokens/s, and records/s relative to the first row (the reference)."""
    reference = result.rows[0]
    header = ["side", "runs through", "folder", "records/s", "tokens/s", "vs reference", "seconds", "load / start s"]
    rows = [
        [
            row.side, row.runner, f"`{row.folder}`", f"{row.records_per_s:.2f}", f"{row.tokens_per_s:.0f}",
            f"{row.records_per_s / reference.records_per_s:.2f}x", f"{row.seconds:.2f}", f"{row.load_seconds:.1f}",
        ]
        for row in result.rows
    ]  # fmt: skip
    return markdown_table(header, rows, "lllrrrrr")


def render_markdown(result: ThroughputResult, command: str) -> str:
    lines = [*facts_table(REPORT_TITLE, report_facts(result, command)), "", results_table(result)]
    return "\n".join(lines) + "\n"


def render_json(result: ThroughputResult, command: str) -> str:
    """Every number of the report; rows also carry their derived rates, for readers that do not recompute them."""
    data = {"format": REPORT_FORMAT, "command": command, **result.model_dump(mode="json")}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def json_path(markdown_path: Path) -> Path:
    """Where the JSON of the report at `markdown_path` lives: beside it, same stem."""
    return Path(markdown_path).with_suffix(".json")


def write_report(result: ThroughputResult, command: str, out: Path) -> tuple[Path, Path]:
    """Write the markdown report at `out` and its JSON beside it; returns both paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(result, command), encoding="utf-8")
    data_path = json_path(out)
    data_path.write_text(render_json(result, command), encoding="utf-8")
    return out, data_path


def read_report(path: Path) -> tuple[ThroughputResult, str]:
    """(numbers, command) from a report's JSON."""
    data, _ = read_document(Path(path), what="throughput report", error=ClefError)
    if not isinstance(data, dict) or data.get("format") != REPORT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ClefError(f"{path} has format {found!r}; a throughput report's JSON has {REPORT_FORMAT}")
    numbers = {key: value for key, value in data.items() if key not in ("format", "command")}
    result = validated(ThroughputResult, numbers, error=ClefError, prefix=f"{path} is not a throughput report")
    if not result.rows:
        raise ClefError(f"{path} has no rows")
    return result, str(data.get("command") or "")
