"""The optional image task (ScienceQA rows with an image): built from the fixtures' Parquet rows, evaluated like
the seven text tasks so that quantization damage on image requests is measured."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_eval import ENGINE_KWARGS, PER_TASK, SharedEngines, build, lines

from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.report import write_results
from clef_quant.evaluation.runner import run_eval
from clef_quant.evaluation.tasks import load_tasks

TASK = "scienceqa_image"


@pytest.fixture(scope="module")
def image_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("image-data") / "data"
    result = build(out, "--task", TASK)
    assert result.exit_code == 0, result.output
    return out


def test_the_image_task_is_optional() -> None:
    assert TASK not in [task.name for task in load_tasks()]
    (task,) = load_tasks(names=[TASK])
    assert task.dataset.id == "derek-thomas/ScienceQA" and task.dataset.eval_split == "test"


def test_build_data_makes_image_requests_from_rows_with_an_image(image_data: Path) -> None:
    from PIL import Image

    records = lines(image_data / "eval" / f"{TASK}.jsonl")
    assert len(records) == PER_TASK
    for record in records:
        request = record["request"]
        (image,) = request["images"]
        assert Image.open(io.BytesIO(base64.b64decode(image))).size == (48, 32)
        criteria = request["questions"]["answer"]["criteria"]
        assert 2 <= len(criteria) <= 5 and list(criteria) == list("ABCDE")[: len(criteria)]
        assert record["gold"]["answer"] in criteria
    summary = json.loads((image_data / "summary.json").read_text())
    skipped = json.dumps(summary)
    assert "row does not fit the task" in skipped  # the fixture's rows without an image


@pytest.mark.slow
def test_eval_reports_the_image_task(
    tiny_dir: Path, quantized_dir: Any, image_data: Path, clef_engine: Any, tmp_path: Path
) -> None:
    config = EvalConfig(
        reference=str(tiny_dir),
        candidates=[str(quantized_dir("fp8-dynamic"))],
        data=image_data,
        out=tmp_path / "results",
        max_model_len=clef_engine(tiny_dir, **ENGINE_KWARGS).max_length,
    )
    run = run_eval(config, engines=SharedEngines(clef_engine, config.max_model_len))
    write_results(run.results, config.out)
    assert run.scored == 3 * PER_TASK  # reference, noise floor, candidate
    reference = run.results.values[run.sides[0].key][TASK]
    assert reference["agreement"] == 1.0 and reference["kl"] == 0.0
    for side in run.sides[1:]:
        values = run.results.values[side.key][TASK]
        assert 0.0 <= values["agreement"] <= 1.0 and values["kl"] >= 0.0
    assert "ScienceQA with images" in (config.out / "results.md").read_text()
