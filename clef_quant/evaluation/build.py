"""`clef-quant build-data`: sample every task and write a DATA folder (layout in `clef_quant.evaluation.data`).

The folder is written as DATA.partial and renamed when complete (`release_folder.staged_folder`), so a DATA folder
is never half written, and Ctrl-C or SIGTERM leaves neither folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.evaluation.data import CALIBRATION_FILE, DATA_FORMAT, EVAL_DIR, SUMMARY_FILE
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.sampling import Record, calibration_quotas, sample_task
from clef_quant.evaluation.sources import FIXTURES, HUB, check_local_source
from clef_quant.evaluation.summary import Counts, Dataset, DataSummary, Lengths, Split, TaskFile, TaskSummary
from clef_quant.evaluation.tasks import Task
from clef_quant.formatting import utc_minute
from clef_quant.progress import NoProgress, Progress
from clef_quant.release_folder.atomic import write_json_atomic
from clef_quant.release_folder.outputs import check_output
from clef_quant.release_folder.staged import staged_folder
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.request import parse_request
from clef_vllm.format.text import render

DEFAULT_PER_TASK = 200
DEFAULT_CALIBRATION = 512


@dataclass(frozen=True)
class BuildConfig:
    out: Path
    per_task: int = DEFAULT_PER_TASK
    calibration_count: int = DEFAULT_CALIBRATION
    seed: int = 0
    source: str = HUB
    tokenizer: Path | None = None  # a release folder: lengths in tokens instead of characters
    overwrite: bool = False


@dataclass(frozen=True)
class BuildResult:
    out: Path
    summary: DataSummary


# Lengths are measured uncut: no record is long enough to reach this.
UNCUT = 10**9


def _lengths(records: Sequence[Record], encoder: Encoder | None) -> Lengths:
    """Prompt lengths in tokens (the real encoding, uncut) or, without a tokenizer, characters of state + questions."""
    if not records:
        return Lengths()
    if encoder is not None:
        unit = "tokens"
        values = [encoder.encode(parse_request(r.request)).num_tokens for r in records]
    else:
        unit = "characters (state + questions as JSON)"
        values = [len(render(r.request["state"])) + len(render(r.request["questions"])) for r in records]
    import pandas as pd

    lengths = pd.Series(values, dtype="int64")
    # "higher": percentiles are lengths some record has (the upper one of two), never a blend of two records.
    p50, p95 = lengths.quantile([0.5, 0.95], interpolation="higher")
    result = Lengths(
        unit=unit,
        min=int(lengths.min()),
        mean=round(float(lengths.mean()), 1),
        p50=int(p50),
        p95=int(p95),
        max=int(lengths.max()),
    )
    if encoder is not None:
        result.over_default_max_length = sum(v > DEFAULT_MAX_LENGTH for v in values)
    return result


def _write_jsonl(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def build_data(
    config: BuildConfig,
    tasks: Sequence[Task],
    progress: Progress | None = None,
) -> BuildResult:
    """Sample every task, write DATA.partial and rename it to DATA. Each task's sampling is a `progress` task."""
    if config.source == FIXTURES:
        # datasets opens the Parquet files itself, so it needs them as real files.
        with resources.as_file(shipped.fixtures()) as folder:
            return build_data(replace(config, source=str(folder)), tasks, progress)
    if config.per_task < 1:
        raise DataError("--per-task must be at least 1")
    if config.calibration_count < 0:
        raise DataError("--calibration-count must be 0 or more")
    out = Path(config.out)
    check_output(out, "build-data", config.overwrite)
    if config.source != HUB:
        check_local_source(Path(config.source), tasks, calibration=config.calibration_count > 0)
    encoder = Encoder(config.tokenizer, max_length=UNCUT) if config.tokenizer is not None else None

    progress = progress or NoProgress()
    quotas = calibration_quotas(tasks, config.calibration_count)
    exclude: set[str] = set()
    samples = []
    for task in tasks:
        progress.start(f"{task.name}: sampling")
        samples.append(
            sample_task(
                task,
                per_task=config.per_task,
                calibration=quotas[task.name],
                seed=config.seed,
                source=config.source,
                exclude_states=exclude,
            )
        )
        progress.finish(f"{task.name}: sampling")

    summary_tasks: dict[str, TaskSummary] = {}
    for sample in samples:
        spec = sample.task.dataset
        summary_tasks[sample.task.name] = TaskSummary(
            title=sample.task.body.title,
            task_file=TaskFile(
                path=shipped.display(sample.task.path), version=sample.task.body.version, sha256=sample.task.sha256
            ),
            dataset=Dataset(id=spec.id, config=spec.config, revision=spec.revision),
            eval=Split(
                split=spec.eval_split,
                rows=sample.eval_rows,
                records=len(sample.eval_records),
                questions=sum(len(r.request["questions"]) for r in sample.eval_records),
                lengths=_lengths(sample.eval_records, encoder),
            ),
            calibration=Split(
                split=spec.calibration_split,
                rows=sample.calibration_rows,
                records=len(sample.calibration_records),
                lengths=_lengths(sample.calibration_records, encoder),
            ),
            skipped=sample.skipped,
        )
    calibration = [r.request for sample in samples for r in sample.calibration_records]
    summary = DataSummary(
        format=DATA_FORMAT,
        created=utc_minute(),
        source=config.source if config.source == HUB else shipped.display(Path(config.source)),
        seed=config.seed,
        per_task=config.per_task,
        calibration_requested=config.calibration_count,
        length_unit="tokens" if encoder is not None else "characters",
        tokenizer=str(config.tokenizer) if config.tokenizer else None,
        counts=Counts(
            tasks=len(samples),
            eval_records=sum(len(s.eval_records) for s in samples),
            eval_questions=sum(t.eval.questions or 0 for t in summary_tasks.values()),
            calibration_records=len(calibration),
        ),
        tasks=summary_tasks,
    )
    with staged_folder(out, command="build-data", overwrite=config.overwrite) as partial:
        (partial / EVAL_DIR).mkdir()
        for sample in samples:
            _write_jsonl(
                partial / EVAL_DIR / f"{sample.task.name}.jsonl",
                [{"id": r.id, "task": r.task, "request": r.request, "gold": r.gold} for r in sample.eval_records],
            )
        _write_jsonl(partial / CALIBRATION_FILE, calibration)
        write_json_atomic(partial / SUMMARY_FILE, summary.to_json())
    return BuildResult(out=out, summary=summary)
