"""results.json read back: files of earlier runs, which lack fields added since, and files that are not results."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.results import ALL, RESULTS_FORMAT, ResultsFile, read_results

SHA = "d" * 64


def early_results() -> dict[str, Any]:
    """results.json as the first runs wrote it: no side runner, settings, counts or store path, no task titles."""
    side = {"key": "candidate-1", "name": "tiny-FP8", "role": "candidate", "folder": "tiny-FP8"}
    return {
        "format": RESULTS_FORMAT,
        "created": "2026-11-01 10:00 UTC",
        "tools": {"clef-quant": "0.1.0"},
        "config": {"reference": "tiny", "candidates": ["tiny-FP8"], "max_model_len": 4096},
        "data": {"folder": "data", "summary": {"source": "fixtures"}},
        "tasks": [{"name": "mmlu", "records": 4, "questions": 6}],
        "sides": [
            {"key": "reference", "name": "bf16", "role": "reference", "folder": "tiny"},
            {**side, "model_hash": {"sha256": SHA, "from": "manifest", "scheme": "fp8-dynamic"}},
        ],
        "values": {"candidate-1": {"mmlu": {"accuracy": 0.5, "kl": None}, ALL: {"accuracy": 0.5}}},
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_results_of_an_early_run_still_read(tmp_path: Path) -> None:
    results = read_results(write(tmp_path, early_results()))
    reference, candidate = results.sides
    assert results.reference == reference and results.candidates == [candidate]
    hashed = candidate.model_hash
    assert (hashed.sha256, hashed.from_, hashed.scheme) == (SHA, "manifest", "fp8-dynamic")
    assert (reference.runner, reference.settings, reference.records_scored) == ("", {}, 0)
    assert reference.model_hash.sha256 == "" and results.reference.producer() == {"model": "", "settings": {}}
    assert [(t.name, t.label, t.records, t.questions) for t in results.task_rows] == [
        ("mmlu", "mmlu", 4, 6),
        (ALL, ALL, 4, 6),
    ]
    assert results.value(candidate, "mmlu", "accuracy") == 0.5 and math.isnan(results.value(candidate, "mmlu", "kl"))
    summary = results.data.summary  # an early summary: what it lacks reads as None, never as a guess
    assert (summary.source, summary.seed, summary.counts.eval_records, summary.tasks) == ("fixtures", None, None, {})
    assert summary.title("mmlu") == "mmlu" and results.config.batch_size is None
    path = tmp_path / "results.json"
    assert results.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()  # of the bytes read, as the card cites


def test_results_are_written_back_as_read(tmp_path: Path) -> None:
    """Re-dumping a file keeps its keys (the alias `from` included) and adds none of the defaults it lacked."""
    data = early_results()
    data["sides"][1]["added by a later version"] = True
    assert ResultsFile.model_validate(data).to_json() == data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "clef-quant-eval-results/0"}, "has format 'clef-quant-eval-results/0'"),
        ({"sides": None}, "not results of clef-quant eval: sides: "),
        ({"tasks": [{"name": "mmlu"}]}, "not results of clef-quant eval: tasks.0.records: Field required"),
        ({"sides": [{"key": "x", "name": "x", "role": "judge", "folder": "x"}]}, r"sides\.0\.role: "),
    ],
)
def test_a_file_that_is_not_results_is_one_line(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = write(tmp_path, {**early_results(), **change})
    with pytest.raises(DataError, match=message) as caught:
        read_results(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
