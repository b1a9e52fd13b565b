"""The `bench throughput` report: markdown for readers and JSON beside it with the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_quant.throughput_report import (
    ThroughputResult,
    ThroughputRow,
    read_report,
    render_json,
    results_table,
    write_report,
)
from clef_vllm.errors import ClefError

COMMAND = "clef-quant bench throughput --reference tiny --data data"


def row(side: str, runner: str, folder: str, seconds: float, load_seconds: float) -> ThroughputRow:
    return ThroughputRow(
        side=side, runner=runner, folder=folder, records=8, tokens=4000, seconds=seconds, load_seconds=load_seconds
    )


def result() -> ThroughputResult:
    rows = (
        row("bf16 reference", "transformers", "tiny", 4.0, 1.5),
        row("plugin NVFP4", "vLLM plugin", "tiny-NVFP4", 0.25, 3.25),
    )
    return ThroughputResult(
        machine="test machine", date="2026-01-01 00:00 UTC", load="0.5 0.4 0.3",
        versions={"vllm": "0.32.0", "missing": None}, source="data", records=8, tokens=4000, batch_size=8,
        max_model_len=4096, device="cpu", engine={"enforce_eager": "True"}, rows=rows,
    )  # fmt: skip


def test_report_writes_markdown_and_json_beside_it(tmp_path: Path) -> None:
    markdown, data = write_report(result(), COMMAND, tmp_path / "bench" / "throughput-cpu.md")
    assert data == tmp_path / "bench" / "throughput-cpu.json"
    text = markdown.read_text()
    assert text.startswith("# Throughput") and f"| command | `{COMMAND}` |" in text
    # the markdown's table is the one readers of the JSON render
    assert results_table(result()) in text
    assert "| plugin NVFP4 | vLLM plugin | `tiny-NVFP4` | 32.00 | 16000 | 16.00x | 0.25 | 3.2 |" in text
    numbers = json.loads(data.read_text())
    assert numbers["rows"][1]["records_per_s"] == 32.0 and numbers["rows"][1]["tokens_per_s"] == 16000.0


def test_report_json_reads_back_to_the_same_numbers(tmp_path: Path) -> None:
    _, data = write_report(result(), COMMAND, tmp_path / "throughput.md")
    assert read_report(data) == (result(), COMMAND)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "something/1"}', "has format 'something/1'"),
        (
            '{"format": "clef-quant-bench-throughput/1", "rows": []}',
            "is not a throughput report: machine: Field required",
        ),
        (json.dumps({**json.loads(render_json(result(), COMMAND)), "rows": []}), "has no rows"),
    ],
)
def test_report_json_that_is_not_a_report_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "throughput.json"
    path.write_text(content)
    with pytest.raises(ClefError, match=message):
        read_report(path)


def test_a_report_json_of_an_earlier_version_still_reads(tmp_path: Path) -> None:
    """Reports written before rows recorded the folder's model fingerprint: the rows read with none."""
    data = json.loads(render_json(result(), COMMAND))
    for entry in data["rows"]:
        del entry["sha256"]
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps(data))
    read, command = read_report(path)
    assert read == result() and command == COMMAND and all(r.sha256 is None for r in read.rows)
