"""The `bench throughput` report: markdown for readers and JSON beside it with the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_quant.throughput_report import (
    ThroughputResult,
    ThroughputRow,
    read_report,
    results_table,
    write_report,
)
from clef_vllm.errors import ClefError

COMMAND = "clef-quant bench throughput --reference tiny --data data"


def result() -> ThroughputResult:
    rows = (
        ThroughputRow("bf16 reference", "transformers", "tiny", 8, 4000, 4.0, 1.5),
        ThroughputRow("plugin NVFP4", "vLLM plugin", "tiny-NVFP4", 8, 4000, 0.25, 3.25),
    )
    return ThroughputResult(
        "test machine", "2026-01-01 00:00 UTC", "0.5 0.4 0.3", {"vllm": "0.32.0", "missing": None}, "data", 8,
        4000, 8, 4096, "cpu", {"enforce_eager": "True"}, rows,
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
        ('{"format": "clef-quant-bench-throughput/1", "rows": []}', "lacks a field"),
    ],
)
def test_report_json_that_is_not_a_report_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "throughput.json"
    path.write_text(content)
    with pytest.raises(ClefError, match=message):
        read_report(path)
