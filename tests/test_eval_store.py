"""The eval probability store trusts nothing it cannot verify: edited, NaN, wrong-shape and torn lines are scored
again and reported, and a torn tail is repaired without losing the record appended after it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.evaluation import load_results
from clef_quant.evaluation.metrics import METRICS
from clef_quant.evaluation.store import (
    ProbabilityStore,
    StoredRecord,
    content_digest,
    producer_digest,
    read_store,
)

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
QUESTION_METRICS = {m.name for m in METRICS if m.level == "question"}
PRODUCER = {"model": "a" * 64, "settings": {"runner": "transformers", "max_length": 4096}}


def record(key: str, probs: list[list[float]] | None = None) -> StoredRecord:
    return StoredRecord(key, f"id-{key}", "boolq", 10, 0.01, probs or [[0.25, 0.75], [0.1, 0.2, 0.7]])


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(path: Path, items: list[dict[str, Any]], producer: dict[str, Any] | None = PRODUCER) -> None:
    """Write lines with their hashes recomputed (what a careful forger or a buggy tool would do)."""
    for item in items:
        if producer is not None:
            item["made_by"] = producer_digest(item["key"], producer)
            item["sha256"] = content_digest(item)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    path = tmp_path / "probs" / "side.jsonl"
    ProbabilityStore(path, PRODUCER).add([record("k1"), record("k2"), record("k3")])
    return path


def test_stored_records_verify_and_come_back(stored: Path) -> None:
    store = ProbabilityStore(stored, PRODUCER)
    assert store.rejected == []
    assert store.get("k2", [2, 3]) == record("k2")
    assert all({"made_by", "sha256"} <= set(item) for item in entries(stored))


def test_an_edited_probability_is_rejected(stored: Path) -> None:
    items = entries(stored)
    items[1]["probs"][0] = [0.75, 0.25]  # still a distribution; only the hash tells
    rewrite(stored, items, producer=None)
    store = ProbabilityStore(stored, PRODUCER)
    assert [str(r) for r in store.rejected] == ["id-k2 (edited: content hash differs)"]
    assert store.get("k2", [2, 3]) is None and store.get("k1", [2, 3]) is not None


def test_lines_of_another_model_or_setting_are_rejected(stored: Path) -> None:
    store = ProbabilityStore(stored, {**PRODUCER, "settings": {"runner": "plugin"}})
    assert len(store.rejected) == 3 and store.records == {}
    assert {r.reason for r in store.rejected} == {"made by another model, record or settings"}


@pytest.mark.parametrize(
    ("probs", "reason"),
    [
        ([[math.nan, 1.0], [0.1, 0.2, 0.7]], "NaN or infinite probability"),
        ([[0.9, 0.9], [0.1, 0.2, 0.7]], "not a probability distribution"),
        ([["0.5", 0.5], [0.1, 0.2, 0.7]], "not a list of distributions"),
    ],
)
def test_non_distributions_are_rejected_even_with_good_hashes(stored: Path, probs: Any, reason: str) -> None:
    items = entries(stored)
    items[0]["probs"] = probs
    rewrite(stored, items)
    store = ProbabilityStore(stored, PRODUCER)
    assert [str(r) for r in store.rejected] == [f"id-k1 ({reason})"]


def test_a_wrong_shape_is_rejected_when_asked_for_the_record(stored: Path) -> None:
    items = entries(stored)
    items[2]["probs"] = [[0.5, 0.5], [0.5, 0.5]]  # the record's second question has three options
    rewrite(stored, items)
    store = ProbabilityStore(stored, PRODUCER)
    assert store.get("k3", [2, 3]) is None
    assert [str(r) for r in store.rejected] == ["id-k3 (wrong shape: [2, 2] options, expected [2, 3])"]


def test_a_torn_tail_is_repaired_and_the_next_record_survives(stored: Path) -> None:
    text = stored.read_text()
    stored.write_text(text[: len(text) - 40])  # killed mid-line
    store = ProbabilityStore(stored, PRODUCER)
    assert [str(r) for r in store.rejected] == ["id-k3 (torn or not JSON)"]
    assert stored.read_text().endswith("\n") and len(stored.read_text().splitlines()) == 2
    store.add([record("k3"), record("k4")])
    again = ProbabilityStore(stored, PRODUCER)
    assert again.rejected == [] and sorted(again.records) == ["k1", "k2", "k3", "k4"]


def test_read_store_verifies_and_never_writes(stored: Path) -> None:
    """Readers of a finished run (load_results, the card) see what the runner would trust, and change nothing."""
    items = entries(stored)
    items[0]["probs"][0] = [0.75, 0.25]  # edited, hashes left as they were
    rewrite(stored, items, producer=None)
    text = stored.read_text()
    stored.write_text(text[: len(text) - 40])  # and the last line torn
    before = stored.read_bytes()
    read = read_store(stored, PRODUCER)
    assert [record.key for _, record in read.lines] == ["k2"]
    assert [str(r) for r in read.rejected] == ["id-k1 (edited: content hash differs)", "id-k3 (torn or not JSON)"]
    assert not read.ends_cleanly and stored.read_bytes() == before


def test_a_line_rewritten_with_its_hashes_recomputed_is_reused(stored: Path) -> None:
    """The stated limit (docs/evaluate.md, `eval --help`): the hashes are plain sha256, so whoever can write the store
    can forge a line that verifies. They catch torn files and edits that leave the hashes alone, nothing more."""
    items = entries(stored)
    items[1]["probs"][0] = [0.99, 0.01]
    rewrite(stored, items)
    store = ProbabilityStore(stored, PRODUCER)
    assert store.rejected == []
    assert store.get("k2", [2, 3]).probabilities[0] == [0.99, 0.01]


def test_eval_help_says_what_the_hashes_protect_against() -> None:
    result = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "catch torn and accidentally edited lines (scored again and reported), not someone who can write" in text
    assert "a line rewritten with recomputed hashes is reused" in text


# -- through the CLI ------------------------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.slow
def test_eval_rescores_and_reports_what_does_not_verify(tiny_dir: Path, tmp_path: Path) -> None:
    data, results = tmp_path / "data", tmp_path / "results"
    built = cli(
        "build-data", "--out", str(data), "--source", str(FIXTURES), "--per-task", "2", "--calibration-count", "2"
    )
    assert built.exit_code == 0, built.output
    # The candidate: the bf16 release repackaged with a NOTICE (another fingerprint). Only the store is under test
    # here, and a bf16 engine scores in seconds on a CPU where FP8 is emulated.
    candidate = shutil.copytree(tiny_dir, tmp_path / "repackaged")
    (candidate / "NOTICE").write_text("repackaged\n")
    args = ["eval", "--reference", str(tiny_dir), "--candidate", str(candidate)]
    args += ["--data", str(data), "--out", str(results), "--max-model-len", "4096", "--enforce-eager"]
    first = cli(*args)
    assert first.exit_code == 0, first.output
    before = json.loads((results / "results.json").read_text())
    reference = next(s for s in before["sides"] if s["role"] == "reference")
    path = results / reference["probabilities"]

    items = entries(path)
    assert len(items) == 14
    edited, nan, shape = items[0], items[1], items[2]
    edited["probs"][0] = [1.0] + [0.0] * (len(edited["probs"][0]) - 1)  # hashes left as they were
    nan["probs"][0][0] = math.nan
    shape["probs"][0] = [*shape["probs"][0], 0.0]
    producer = {"model": reference["model_hash"]["sha256"], "settings": reference["settings"]}
    for item in (nan, shape):  # hashes recomputed: only the content checks can tell
        item["made_by"] = producer_digest(item["key"], producer)
        item["sha256"] = content_digest(item)
    text = "".join(json.dumps(item) + "\n" for item in items)
    path.write_text(text[:-30])  # and the last line torn

    second = cli(*args)
    assert second.exit_code == 0, second.output
    assert "records scored 4, reused 38" in second.output  # 14 records x 3 sides; only the reference rescored
    warning = next(line for line in second.output.splitlines() if line.startswith("warning:"))
    assert warning.startswith(
        "warning: bf16 reference: stored probabilities that did not verify were scored again (4: "
    )
    for name in (edited["id"], nan["id"], shape["id"], items[13]["id"]):
        assert name in warning
    after = json.loads((results / "results.json").read_text())
    side = next(s for s in after["sides"] if s["role"] == "reference")
    assert side["records_rejected"] == 4 and side["records_scored"] == 4
    for key, per_task in before["values"].items():
        for task, row in per_task.items():
            for metric, value in row.items():
                if value is not None and metric in QUESTION_METRICS:  # speeds differ from run to run
                    assert after["values"][key][task][metric] == pytest.approx(value, abs=1e-3), (key, task, metric)

    third = cli(*args)
    assert third.exit_code == 0 and "records scored 0, reused 42" in third.output
    assert "warning:" not in third.output

    # The store still holds the wrong-shape line before its rescored one; load_results keeps the later line.
    probs = load_results(results).probabilities
    assert probs.groupby("side_key").size().to_dict() == {s["key"]: 14 for s in after["sides"]}
    by_side = {key: group.set_index("id")["probs"] for key, group in probs.groupby("side_key")}
    shapes = [{i: [len(q) for q in p] for i, p in found.items()} for found in by_side.values()]
    assert all(shape == shapes[0] for shape in shapes)
