"""DATA folders: their layout, and reading the evaluation records back with every line validated.

A DATA folder (written by `clef_quant.evaluation.build`):
    eval/<task>.jsonl     {"id", "task", "request", "gold"} per line; gold maps question id -> option id
    calibration.jsonl     plain SystemOne requests (with "id"), for `clef-quant quantize --calibration`
    summary.json          counts, lengths, seed, source, task file hashes
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from clef_quant.documents import parse_json_line, read_document, validated
from clef_quant.evaluation.errors import DataError, TaskFileError
from clef_quant.evaluation.summary import DataSummary
from clef_quant.evaluation.tasks import check_gold, gold_index
from clef_quant.formatting import first_few
from clef_vllm.errors import RequestError, first_validation_error
from clef_vllm.format.request import ClefRequest, parse_request

DATA_FORMAT = "clef-quant-eval-data/1"
EVAL_DIR = "eval"
CALIBRATION_FILE = "calibration.jsonl"
SUMMARY_FILE = "summary.json"
MAX_LISTED_PROBLEMS = 3


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation record of a DATA folder; `origin` is `file:line` for error messages."""

    id: str
    task: str
    body: dict[str, Any]
    request: ClefRequest
    gold: dict[str, str]
    gold_index: list[int]  # per question, in request order, the gold option's position in model order
    origin: str


@dataclass(frozen=True)
class EvalData:
    folder: Path
    records: list[EvalRecord]
    summary: DataSummary
    files: dict[str, str]  # relative path -> sha256

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.records))


class DataLine(BaseModel):
    """One line of `eval/<task>.jsonl` as written by build-data, before its request is parsed."""

    model_config = ConfigDict(extra="ignore")

    id: StrictStr = Field(min_length=1)
    task: StrictStr = Field(min_length=1)
    request: Any  # parse_request checks it, with the server's own messages
    gold: dict[StrictStr, StrictStr]  # question id -> option id


def _check_line(value: Any) -> tuple[str, str, dict[str, Any], ClefRequest, dict[str, str]]:
    if not isinstance(value, dict):
        raise DataError("a line must be a JSON object")
    try:
        line = DataLine.model_validate(value)
    except ValidationError as exc:
        missing = [str(error["loc"][0]) for error in exc.errors() if error["type"] == "missing"]
        if missing:
            raise DataError(f"missing {', '.join(missing)}") from None
        raise DataError(first_validation_error(exc)) from None
    record_id, task, body, gold = line.id, line.task, line.request, line.gold
    try:
        request = parse_request(body)
    except RequestError as exc:
        raise DataError(f"request: {exc}") from None
    try:
        check_gold(request, gold)
    except TaskFileError as exc:
        raise DataError(str(exc)) from None
    return record_id, task, body, request, gold


def read_eval_data(folder: Path) -> EvalData:
    """Every evaluation record of a DATA folder, each line validated; all problems are reported together."""
    folder = Path(folder)
    eval_dir = folder / EVAL_DIR
    files = sorted(eval_dir.glob("*.jsonl")) if eval_dir.is_dir() else []
    if not files:
        raise DataError(f"{folder} holds no {EVAL_DIR}/*.jsonl; build it with: clef-quant build-data --out {folder}")
    summary_path = folder / SUMMARY_FILE
    raw_summary, _ = read_document(summary_path, what="DATA summary", error=DataError)
    summary = validated(DataSummary, raw_summary, error=DataError, prefix=str(summary_path))

    records: list[EvalRecord] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for path in files:
        raw = path.read_bytes()
        hashes[f"{EVAL_DIR}/{path.name}"] = hashlib.sha256(raw).hexdigest()
        for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            origin = f"{path}:{number}"
            try:
                value = parse_json_line(line, where=origin, error=DataError)
            except DataError as exc:
                problems.append(str(exc))
                continue
            try:
                record_id, task, body, request, gold = _check_line(value)
            except DataError as exc:
                problems.append(f"{origin}: {exc}")
                continue
            if record_id in seen:
                problems.append(f"{origin}: id {record_id!r} repeats {seen[record_id]}")
                continue
            seen[record_id] = origin
            records.append(EvalRecord(record_id, task, body, request, gold, gold_index(request, gold), origin))
    if problems:
        raise DataError(f"{len(problems)} invalid line(s) in {folder}: {first_few(problems, MAX_LISTED_PROBLEMS)}")
    return EvalData(folder=folder, records=records, summary=summary, files=hashes)


def records_by_task(records: Sequence[EvalRecord]) -> dict[str, list[int]]:
    """Positions of the records of each task, tasks in the order they first appear."""
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(record.task, []).append(index)
    return groups
