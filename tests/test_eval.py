"""build-data on the fixtures, and eval of the tiny bf16 folder against its FP8_DYNAMIC and NVFP4 folders.

The eval runs through the real components (transformers reference, vLLM plugin engines shared with the plugin
tests through the `clef_engine` fixture); its records are few (4 per task) so the module stays fast.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.divergences import kl_divergence
from clef_quant.evaluation import load_results
from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.data import read_eval_data
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.metrics import (
    METRICS,
    QuestionObservation,
    RecordObservation,
    compute,
    expected_calibration_error,
    format_value,
)
from clef_quant.evaluation.report import write_results
from clef_quant.evaluation.results import ALL
from clef_quant.evaluation.runner import run_eval
from clef_quant.evaluation.sides import NOISE_FLOOR_NAME
from clef_quant.evaluation.tasks import load_tasks
from clef_quant.quantize.calibration import read_request_bodies
from clef_vllm.format.text import render

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
PER_TASK = 4
CALIBRATION = 14
TASK_TITLES = ["ANLI R1 multi-question", "ANLI R3", "ARC-Challenge", "BANKING77", "BoolQ", "HellaSwag", "MMLU"]
ENGINE_KWARGS = {"max_num_batched_tokens": 4096}  # the plugin tests' engines: shared, not started again


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def build(out: Path, *extra: str) -> Any:
    return cli(
        "build-data", "--out", str(out), "--source", str(FIXTURES),
        "--per-task", str(PER_TASK), "--calibration-count", str(CALIBRATION), *extra,
    )  # fmt: skip


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "data"
    result = build(out)
    assert result.exit_code == 0, result.output
    return out


# -- build-data ------------------------------------------------------------------------------------------------


def test_build_data_writes_seven_tasks_and_calibration(data_dir: Path) -> None:
    files = sorted(p.stem for p in (data_dir / "eval").glob("*.jsonl"))
    assert files == sorted(task.name for task in load_tasks()) and len(files) == 7
    summary = json.loads((data_dir / "summary.json").read_text())
    assert summary["counts"] == {
        "tasks": 7, "eval_records": 7 * PER_TASK, "eval_questions": 6 * PER_TASK + 3 * PER_TASK,
        "calibration_records": CALIBRATION,
    }  # fmt: skip
    multi = lines(data_dir / "eval" / "anli_r1_multi.jsonl")[0]
    assert list(multi["request"]["questions"]) == ["relation", "entails", "support"]
    label = {"entailment": ("true", "4"), "neutral": ("false", "2"), "contradiction": ("false", "0")}
    assert (multi["gold"]["entails"], multi["gold"]["support"]) == label[multi["gold"]["relation"]]
    # The calibration file is what `clef-quant quantize --calibration` reads.
    assert len(read_request_bodies(data_dir / "calibration.jsonl")) == CALIBRATION
    assert not (data_dir.parent / "data.partial").exists()


def test_the_summary_reads_back_as_written_and_a_wrong_one_is_refused(data_dir: Path, tmp_path: Path) -> None:
    written = json.loads((data_dir / "summary.json").read_text())
    summary = read_eval_data(data_dir).summary
    assert summary.to_json() == written  # nothing lost, nothing added
    assert (summary.seed, summary.counts.calibration_records, summary.from_hub) == (0, CALIBRATION, False)
    assert [summary.title(name) for name in sorted(written["tasks"])] == TASK_TITLES
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    (copy / "summary.json").write_text(json.dumps({**written, "counts": {"eval_records": "many"}}))
    with pytest.raises(DataError) as caught:
        read_eval_data(copy)
    assert str(caught.value).startswith(f"{copy / 'summary.json'}: counts.eval_records: ")
    assert "\n" not in str(caught.value)


def test_build_data_measures_lengths_in_the_release_tokens(data_dir: Path, tiny_dir: Path, tmp_path: Path) -> None:
    """--tokenizer: each task's lengths are the real, uncut encoding of its records."""
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request

    result = build(tmp_path / "tokens", "--tokenizer", str(tiny_dir))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "tokens" / "summary.json").read_text())
    assert summary["length_unit"] == "tokens"
    encoder = Encoder(tiny_dir, max_length=10**9)
    for name, entry in summary["tasks"].items():
        records = lines(tmp_path / "tokens" / "eval" / f"{name}.jsonl")
        counts = [encoder.encode(parse_request(r["request"])).num_tokens for r in records]
        assert (entry["eval"]["lengths"]["min"], entry["eval"]["lengths"]["max"]) == (min(counts), max(counts))
        assert entry["eval"]["lengths"]["unit"] == "tokens"


def test_build_data_is_deterministic(data_dir: Path, tmp_path: Path) -> None:
    again = build(tmp_path / "again")
    assert again.exit_code == 0, again.output
    for path in sorted((data_dir / "eval").glob("*.jsonl")):
        assert [r["id"] for r in lines(path)] == [r["id"] for r in lines(tmp_path / "again" / "eval" / path.name)]
    assert (data_dir / "calibration.jsonl").read_bytes() == (tmp_path / "again" / "calibration.jsonl").read_bytes()
    other_seed = build(tmp_path / "seed1", "--seed", "1")
    assert other_seed.exit_code == 0, other_seed.output
    ids = lambda folder: [r["id"] for p in sorted((folder / "eval").glob("*.jsonl")) for r in lines(p)]  # noqa: E731
    assert ids(data_dir) != ids(tmp_path / "seed1")


def test_calibration_never_overlaps_eval(data_dir: Path) -> None:
    evaluation = [r for p in (data_dir / "eval").glob("*.jsonl") for r in lines(p)]
    calibration = lines(data_dir / "calibration.jsonl")
    assert {r["id"] for r in evaluation}.isdisjoint({r["id"] for r in calibration})
    eval_states = {render(r["request"]["state"]) for r in evaluation}
    assert eval_states.isdisjoint({render(r["state"]) for r in calibration})


def test_a_text_in_both_splits_is_kept_out_of_calibration(tmp_path: Path) -> None:
    # The fixture's BANKING77 test and train splits share one text (row 0), as the real splits share a few.
    result = cli(
        "build-data", "--out", str(tmp_path / "d"), "--source", str(FIXTURES), "--task", "banking77",
        "--per-task", "32", "--calibration-count", "32",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    task = json.loads((tmp_path / "d" / "summary.json").read_text())["tasks"]["banking77"]
    skipped = task["skipped"]["train: same state as an eval record"]  # row 0, and any chance repeat of the generator
    assert skipped >= 1 and task["calibration"]["records"] == 32 - skipped
    eval_texts = {r["request"]["state"] for r in lines(tmp_path / "d" / "eval" / "banking77.jsonl")}
    assert "How do I activate my new card?" in eval_texts
    assert eval_texts.isdisjoint(r["state"] for r in lines(tmp_path / "d" / "calibration.jsonl"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "no/such/folder"], "--source no/such/folder is neither 'hub', 'fixtures' nor a folder"),
        (["--task", "nope"], "unknown task(s) nope"),
        (["--source", "tests", "--task", "boolq"], "tests has no Parquet files for 2 split(s): google/boolq/default/"),
    ],
)
def test_build_data_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = cli("build-data", "--out", str(tmp_path / "d"), *args)
    assert result.exit_code == 2
    # (a spinner may leave a blank line first when the output is not a terminal)
    assert result.output.strip().startswith("error: ") and message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.partial").exists()


def test_existing_data_is_refused_without_overwrite(data_dir: Path) -> None:
    result = cli("build-data", "--out", str(data_dir), "--source", str(FIXTURES))
    assert result.exit_code == 2 and "already exists; pass --overwrite" in result.output


def test_source_fixtures_reads_the_shipped_rows(data_dir: Path, tmp_path: Path) -> None:
    # `--source fixtures` is how an installed clef-quant reaches eval/fixtures; it must be the same data.
    result = cli(
        "build-data", "--out", str(tmp_path / "d"), "--source", "fixtures",
        "--per-task", str(PER_TASK), "--calibration-count", str(CALIBRATION),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("calibration.jsonl", *(f"eval/{p.name}" for p in (data_dir / "eval").glob("*.jsonl"))):
        assert (tmp_path / "d" / name).read_bytes() == (data_dir / name).read_bytes(), name
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["source"] == "eval/fixtures"
    assert summary["tasks"]["mmlu"]["task_file"]["path"] == "eval/tasks/mmlu.yaml"


# -- metrics ---------------------------------------------------------------------------------------------------


def test_metric_values_on_known_distributions() -> None:
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    assert kl_divergence(p, q) == pytest.approx(0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1))
    assert kl_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(-np.log(1e-12))
    # Two questions at confidence 0.9 (one right) and one at 0.6 (right): |0.5-0.9|*2/3 + |1-0.6|*1/3.
    assert expected_calibration_error([(0.9, True), (0.9, False), (0.6, True)]) == pytest.approx(0.4)
    values = compute(
        [QuestionObservation(p, q, gold=1), QuestionObservation(q, q, gold=0)],
        [RecordObservation(tokens=100, seconds=0.5), RecordObservation(tokens=300, seconds=1.5)],
    )
    assert values["accuracy"] == 0.5 and values["agreement"] == 1.0  # argmax of [0.5, 0.5] is the first
    assert values["tv"] == pytest.approx(0.2) and values["max_dp"] == pytest.approx(0.4)
    assert values["records_per_s"] == pytest.approx(1.0) and values["tokens_per_s"] == pytest.approx(200.0)


# -- eval ------------------------------------------------------------------------------------------------------

ARROW = {"higher": "↑", "lower": "↓"}


def metric_sections(markdown: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """`### heading` -> (header cells, body rows) of the table under it; `\\|` in a cell is a literal bar."""
    found: dict[str, tuple[list[str], list[list[str]]]] = {}
    for part in markdown.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        lines = [line for line in body.split("\n## ")[0].splitlines() if line.startswith("|")]
        cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        found[heading] = (cells[0], cells[2:])
    return found


class SharedEngines:
    """The runner's EngineProvider over the session's shared engines; records which folders it opened."""

    def __init__(self, factory: Any, max_model_len: int, engine_kwargs: dict[str, Any] = ENGINE_KWARGS) -> None:
        self.factory = factory
        self.engine_kwargs = engine_kwargs
        self.settings = {"max_model_len": max_model_len, "enforce_eager": "True", **engine_kwargs}
        self.opened: list[Path] = []

    def check(self, folder: Path) -> None:
        """The settings the session's engine over `folder` starts with, checked as eval checks its own."""
        from plugins.engines import ENGINE_MAX_MODEL_LEN, small_kv_cache

        from clef_vllm.engine.check import check_engine_settings

        with small_kv_cache() as kv_cache:
            check_engine_settings(
                folder, max_model_len=ENGINE_MAX_MODEL_LEN, enforce_eager=True, **kv_cache, **self.engine_kwargs
            )

    @contextmanager
    def open(self, folder: Path) -> Iterator[Any]:
        self.opened.append(folder)
        yield self.factory(folder, **self.engine_kwargs)


@pytest.fixture(scope="module")
def eval_config(
    tiny_dir: Path, quantized_dir: Any, data_dir: Path, clef_engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> EvalConfig:
    return EvalConfig(
        reference=str(tiny_dir),
        candidates=[str(quantized_dir("fp8-dynamic")), str(quantized_dir("nvfp4"))],
        data=data_dir,
        out=tmp_path_factory.mktemp("results") / "results",
        # The reference must encode with the shared engines' length, or the two sides would cut states differently.
        max_model_len=clef_engine(tiny_dir, **ENGINE_KWARGS).max_length,
    )


@pytest.fixture(scope="module")
def first_run(eval_config: EvalConfig, clef_engine: Any):
    engines = SharedEngines(clef_engine, eval_config.max_model_len)
    run = run_eval(eval_config, engines=engines)
    write_results(run.results, eval_config.out)
    return run, engines


@pytest.mark.slow
def test_eval_scores_every_side_and_writes_one_table_per_metric(first_run: Any, eval_config: EvalConfig) -> None:
    run, engines = first_run
    assert [side.role for side in run.sides] == ["reference", "noise-floor", "candidate", "candidate"]
    assert run.scored == 4 * 7 * PER_TASK and run.reused == 0
    assert len(engines.opened) == 3  # the bf16 folder (noise floor) and the two candidates

    markdown = (eval_config.out / "results.md").read_text()
    sections = metric_sections(markdown)
    assert list(sections) == [f"{m.title} {ARROW[m.direction]}" for m in METRICS]  # one table per metric
    assert (
        markdown.index("## Quality")
        < markdown.index("### acc")
        < markdown.index("## Speed")
        < markdown.index("### rec/s")
    )
    frame = load_results(eval_config.out).results.set_index(["side_key", "task"])
    for metric in METRICS:
        header, rows = sections[f"{metric.title} {ARROW[metric.direction]}"]
        measured = [side for side in run.sides if side.role != "reference" or not metric.compares]
        assert header == ["task", *[side.name for side in measured]], metric.name
        assert [row[0] for row in rows] == [*TASK_TITLES, "**All**"]
        tasks = list(frame.loc[run.sides[0].key].index)  # results.json's task order, then All
        for row, task in zip(rows, tasks, strict=True):
            shown = [format_value(metric, frame.at[(side.key, task), metric.name]) for side in measured]
            assert row[1:] == shown, (metric.name, task)
    assert NOISE_FLOOR_NAME in sections["agree ↑"][0]

    results = json.loads((eval_config.out / "results.json").read_text())
    hashes = {side["role"]: side["model_hash"] for side in results["sides"]}
    assert hashes["candidate"]["from"] == "manifest" and hashes["reference"]["from"] == "files"
    assert results["data"]["summary"]["counts"]["eval_records"] == 7 * PER_TASK
    assert results["tools"]["transformers"] and results["tools"]["torch"]
    csv_lines = (eval_config.out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4 * 8  # header, then 4 sides x (7 tasks + All)
    assert csv_lines[0] == ",".join(
        ["side", "role", "folder", "task", "records", "questions", *[m.name for m in METRICS]]
    )
    assert len(list((eval_config.out / "probs").glob("*.jsonl"))) == 4


@pytest.mark.slow
@pytest.mark.parametrize("given", ["folder", "results.json"])
def test_load_results_gives_every_number_of_results_json(first_run: Any, eval_config: EvalConfig, given: str) -> None:
    run, _ = first_run
    results = json.loads((eval_config.out / "results.json").read_text())
    frames = load_results(eval_config.out if given == "folder" else eval_config.out / "results.json")

    values = frames.results
    metrics = [m.name for m in METRICS]
    columns = ["side", "side_key", "role", "folder", "task", "title", "records", "questions", *metrics]
    assert list(values.columns) == columns
    tasks = [t["name"] for t in results["tasks"]]
    assert list(values["side_key"]) == [side.key for side in run.sides for _ in range(len(tasks) + 1)]
    assert list(values["task"]) == [*tasks, ALL] * len(run.sides)
    for row in values.to_dict("records"):
        stored = results["values"][row["side_key"]][row["task"]]
        for metric in metrics:
            expected = stored[metric]
            assert math.isnan(row[metric]) if expected is None else row[metric] == expected, (row["task"], metric)
    every = values[values["task"] == ALL].iloc[0]
    assert every["records"] == 7 * PER_TASK and every["questions"] == sum(t["questions"] for t in results["tasks"])

    probs = frames.probabilities
    assert list(probs.columns) == ["side", "side_key", "role", "id", "task", "tokens", "seconds", "questions", "probs"]
    assert len(probs) == len(run.sides) * 7 * PER_TASK
    assert probs.groupby("side_key").size().to_dict() == {side.key: 7 * PER_TASK for side in run.sides}
    # The records are the run's own: agreement and tokens/s recomputed from them give results.json's All values.
    reference = probs[probs["role"] == "reference"].set_index("id")["probs"]
    for side in run.sides:
        own = probs[probs["side_key"] == side.key].set_index("id")
        agree = [
            np.argmax(mine) == np.argmax(theirs)
            for record_id in reference.index
            for theirs, mine in zip(reference[record_id], own.at[record_id, "probs"], strict=True)
        ]
        every = results["values"][side.key][ALL]
        assert np.mean(agree) == pytest.approx(every["agreement"]), side.name
        assert own["tokens"].sum() / own["seconds"].sum() == pytest.approx(every["tokens_per_s"]), side.name


def test_load_results_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError) as missing:
        load_results(tmp_path)
    expected = "is missing: give the RESULTS folder of clef-quant eval or its results.json"
    assert str(missing.value) == f"{tmp_path / 'results.json'} {expected}"
    (tmp_path / "results.json").write_text(json.dumps({"format": "something-else/1"}))
    with pytest.raises(DataError) as other:
        load_results(tmp_path / "results.json")
    expected = "has format 'something-else/1'; clef-quant reads clef-quant-eval-results/1"
    assert str(other.value) == f"{tmp_path / 'results.json'} {expected}"


@pytest.mark.slow
def test_reference_against_itself_gives_full_agreement_and_zero_kl(first_run: Any) -> None:
    run, _ = first_run
    reference = run.results.values[run.sides[0].key]
    for task, values in reference.items():
        assert values["agreement"] == 1.0 and values["kl"] == 0.0, task
        assert values["tv"] == 0.0 and values["max_dp"] == 0.0, task
    noise_floor = run.results.values[run.sides[1].key][ALL]
    assert 0.0 < noise_floor["kl"] < 0.01  # the engine differs from transformers, but only a little


@pytest.mark.slow
def test_second_run_reuses_every_stored_probability(first_run: Any, eval_config: EvalConfig, clef_engine: Any) -> None:
    engines = SharedEngines(clef_engine, eval_config.max_model_len)
    again = run_eval(eval_config, engines=engines)
    assert again.scored == 0 and again.reused == 4 * 7 * PER_TASK
    assert engines.opened == []  # nothing to score: no engine is even asked for
    assert again.results.values == first_run[0].results.values


BAD_LINES = [  # (the line, what follows FILE:2 in the refusal)
    ("{not json", " is not valid JSON: Expecting property name enclosed in double quotes (column 2)"),
    ('{"id": "x", "task": "boolq", "request": {"model": "m", "state": "s", "questions": {}}, "gold": {}}',
     ": request: questions must be a non-empty object"),
    ('{"id": "x", "task": "boolq", "request": {"model": "m", "state": "s", "questions": {"a": {"type": "noul"}}}}',
     ": missing gold"),
    ('{"id": "x", "task": "boolq", "request": {"model": "m", "state": "s", "questions": {"a": {"type": "noul"}}}, '
     '"gold": {"a": "maybe"}}', ": gold 'maybe' of question a is not one of its options"),
    ('{"id": 7, "task": "boolq", "request": {"model": "m", "state": "s", "questions": {"a": {"type": "noul"}}}, '
     '"gold": {"a": "yes"}}', ": id: Input should be a valid string"),
    ("[1, 2]", ": a line must be a JSON object"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_a_bad_data_line_stops_with_file_and_line(
    data_dir: Path, tiny_dir: Path, tmp_path: Path, line: str, reason: str
) -> None:
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    path = data / "eval" / "boolq.jsonl"
    kept = path.read_text().splitlines()
    path.write_text("\n".join([kept[0], line, *kept[1:]]) + "\n")
    result = cli(
        "eval", "--reference", str(tiny_dir), "--candidate", str(tiny_dir), "--data", str(data),
        "--out", str(tmp_path / "results"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and f"{path}:2{reason}" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "results").exists()  # stopped before any model or file


def test_read_eval_data_validates_the_built_data(data_dir: Path) -> None:
    data = read_eval_data(data_dir)
    assert len(data.records) == 7 * PER_TASK and data.tasks == sorted(data.tasks)
    multi = next(r for r in data.records if r.task == "anli_r1_multi")
    assert len(multi.gold_index) == 3


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_out_that_cannot_be_a_folder_stops_before_any_model(
    data_dir: Path, tiny_dir: Path, tmp_path: Path, where: str
) -> None:
    out = tmp_path / "results.txt" if where == "file" else Path("/proc/clef-results")
    if where == "file":
        out.write_text("keep me\n")
    result = cli(
        "eval", "--reference", str(tiny_dir), "--candidate", str(tiny_dir), "--data", str(data_dir),
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    expected = f"{out} is not a folder" if where == "file" else f"cannot write {out}: cannot create a folder in /proc"
    assert result.output.startswith(f"error: {expected}"), result.output
    assert "records scored" not in result.output
    if where == "file":
        assert out.read_text() == "keep me\n"
