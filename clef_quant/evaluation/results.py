"""results.json of an evaluation run: its one shape (`ResultsFile`), which the runner fills (`results_dict`) and
every reader validates, and the view readers use (`Results`: the eval report, `load_results` and the model card).

results.json holds config, data, tasks, metrics, sides, `values[side key][task or All][metric]` and the intervals:
`intervals` (how drawn), `bounds[side key][task or All][metric]` (low, high), `differences` (every pair of plugin
sides). Its format string changes when an older reader would misread it; later fields have defaults (older files read).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clef_quant.bootstrap import covers_zero
from clef_quant.documents import read_document, validated
from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.data import EvalData, records_by_task
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.metrics import METRICS
from clef_quant.evaluation.sides import Side
from clef_quant.evaluation.store import SHOWN_IDS, tool_versions
from clef_quant.evaluation.summary import DataSummary
from clef_quant.formatting import utc_minute

RESULTS_FORMAT = "clef-quant-eval-results/1"
RESULTS_JSON = "results.json"
PROBS_DIR = "probs"
ALL = "All"  # the row over every question of every task (so it weighs questions, not tasks)


# Sections keep keys they do not name, so a reader of this version passes over what a later one adds.
_SECTION = ConfigDict(extra="allow", populate_by_name=True)


class RunConfig(BaseModel):
    model_config = _SECTION

    reference: str = ""
    candidates: list[str] = []
    max_model_len: int | None = None
    batch_size: int | None = None
    reference_device: str | None = None
    engine: dict[str, Any] = {}


class DataEntry(BaseModel):
    model_config = _SECTION

    folder: str = ""
    files: dict[str, str] = {}  # relative path -> sha256
    summary: DataSummary = DataSummary()  # the DATA folder's summary.json as it was


class TaskEntry(BaseModel):
    model_config = _SECTION

    name: str
    title: str | None = None  # the name, in files that have none
    records: int
    questions: int


class MetricEntry(BaseModel):
    model_config = _SECTION

    name: str
    title: str
    description: str
    direction: str
    level: str
    aggregation: str
    compares_with_reference: bool


class ModelHash(BaseModel):
    model_config = _SECTION

    sha256: str = ""
    from_: str = Field("", alias="from")  # "manifest" or "files"
    scheme: str | None = None


class SideEntry(BaseModel):
    model_config = _SECTION

    key: str
    name: str
    role: Literal["reference", "noise-floor", "candidate"]
    runner: str = ""
    folder: str
    model_hash: ModelHash = ModelHash()
    settings: dict[str, Any] = {}
    records_scored: int = 0
    records_reused: int = 0
    records_rejected: int = 0
    rejected: list[str] = []
    seconds_scored: float = 0.0
    probabilities: str = ""  # RESULTS-relative path of the side's probability store
    engine: dict[str, Any] = {}  # what its engine ran with, read from the started engine (kv_cache_memory_bytes)


class IntervalSettings(BaseModel):
    model_config = _SECTION

    method: str
    confidence: float
    resamples: int | None = None  # the bootstrap of files written before the t-interval
    seed: int | None = None
    metrics: list[str]
    min_records: int | None = None  # a task (or All) with fewer records has no interval and decides nothing


class DifferenceEntry(BaseModel):
    """`a` minus `b` (side keys) for one task (or All) and metric, with its interval over the same records."""

    model_config = _SECTION

    a: str
    b: str
    task: str
    metric: str
    difference: float | None
    low: float | None
    high: float | None

    @property
    def distinguishable(self) -> bool | None:
        """False when the interval covers 0 (the records cannot tell the two apart); None without an interval."""
        if self.low is None or self.high is None:
            return None
        return not covers_zero(self.low, self.high)


class ResultsFile(BaseModel):
    """results.json, as written and as read."""

    model_config = _SECTION

    format: Literal["clef-quant-eval-results/1"]
    created: str = ""
    tools: dict[str, str | None] = {}
    config: RunConfig = RunConfig()
    data: DataEntry = DataEntry()
    tasks: list[TaskEntry]
    metrics: list[MetricEntry] = []
    sides: list[SideEntry]
    values: dict[str, dict[str, dict[str, float | None]]]
    intervals: IntervalSettings | None = None  # absent in files written before intervals
    bounds: dict[str, dict[str, dict[str, list[float | None]]]] = {}
    differences: list[DifferenceEntry] = []

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def metric_entries() -> list[MetricEntry]:
    """What results.json says about each metric it holds."""
    return [
        MetricEntry(
            name=m.name,
            title=m.title,
            description=m.description,
            direction=m.direction,
            level=m.level,
            aggregation=m.aggregation,
            compares_with_reference=m.compares,
        )
        for m in METRICS
    ]


def results_dict(
    config: EvalConfig,
    data: EvalData,
    sides: Sequence[Side],
    engine_settings: dict[str, Any],
    values: dict[str, dict[str, dict[str, float]]],
    uncertainty: Uncertainty | None = None,
) -> dict[str, Any]:
    """Everything results.json holds; `values` is `comparison.compare` of the same sides, `uncertainty` their
    intervals (`comparison.intervals`)."""
    tasks = [
        TaskEntry(
            name=task,
            title=data.summary.title(task),
            records=len(indices),
            questions=sum(len(data.records[i].request.questions) for i in indices),
        )
        for task, indices in records_by_task(data.records).items()
    ]
    written = ResultsFile(
        format=RESULTS_FORMAT,
        created=utc_minute(),
        tools=tool_versions(),
        config=RunConfig(
            reference=str(config.reference),
            candidates=[str(c) for c in config.candidates],
            max_model_len=config.max_model_len,
            reference_device=config.device,
            engine=engine_settings,
        ),
        data=DataEntry(folder=str(data.folder), files=data.files, summary=data.summary),
        tasks=tasks,
        metrics=metric_entries(),
        sides=[
            SideEntry(
                key=side.key,
                name=side.name,
                role=side.role,
                runner=side.runner,
                folder=str(side.folder),
                model_hash=ModelHash(
                    sha256=side.fingerprint.sha256, from_=side.fingerprint.source, scheme=side.fingerprint.scheme
                ),
                settings=side.settings,
                records_scored=side.scored,
                records_reused=side.reused,
                records_rejected=len(side.rejected),
                rejected=[str(r) for r in side.rejected[:SHOWN_IDS]],
                seconds_scored=round(side.seconds_scored, 3),
                probabilities=f"{PROBS_DIR}/{side.key}.jsonl",
                engine=side.engine,
            )
            for side in sides
        ],
        values={
            key: {task: {m: _json_number(v) for m, v in row.items()} for task, row in per_task.items()}
            for key, per_task in values.items()
        },
    )
    if uncertainty is not None:
        written.intervals = uncertainty.settings
        written.bounds = {
            key: {task: {m: [_json_number(x) for x in pair] for m, pair in row.items()} for task, row in per.items()}
            for key, per in uncertainty.bounds.items()
        }
        written.differences = uncertainty.differences
    return written.to_json()


@dataclass(frozen=True)
class Uncertainty:
    """The intervals of one run, as `comparison.intervals` draws them."""

    settings: IntervalSettings
    bounds: dict[str, dict[str, dict[str, tuple[float | None, float | None]]]]  # side key -> task -> metric -> bounds
    differences: list[DifferenceEntry]


def _json_number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


@dataclass(frozen=True)
class ResultSide:
    """One side as results.json lists it."""

    key: str
    name: str
    role: str  # "reference", "noise-floor" or "candidate"
    runner: str
    folder: str
    sha256: str  # the model fingerprint (see store.folder_fingerprint)
    hash_from: str  # "manifest" or "files"
    scheme: str | None
    settings: dict[str, Any]
    records_scored: int
    records_reused: int
    probabilities: str  # RESULTS-relative path of the side's probability store

    @property
    def is_candidate(self) -> bool:
        return self.role == "candidate"

    def producer(self) -> dict[str, Any]:
        """What produced the side's stored lines, as `sides.Side.producer` hashed it: lets a reader verify them."""
        return {"model": self.sha256, "settings": self.settings}


@dataclass(frozen=True)
class ResultTask:
    name: str
    title: str
    records: int
    questions: int


@dataclass(frozen=True)
class Results:
    """results.json, typed. `tasks` ends with the All row (its counts summed over the tasks)."""

    raw: dict[str, Any]  # the file as read; the card hashes and quotes it
    file: ResultsFile  # the same, typed
    sides: tuple[ResultSide, ...]
    tasks: tuple[ResultTask, ...]
    metrics: tuple[MetricEntry, ...]
    values: dict[str, dict[str, dict[str, float | None]]]
    file_sha256: str | None = None  # of the bytes parsed, when read from a file (the card cites it)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Results:
        if raw.get("format") != RESULTS_FORMAT:
            raise DataError(f"results have format {raw.get('format')!r}; clef-quant reads {RESULTS_FORMAT}")
        read = validated(ResultsFile, raw, error=DataError, prefix="not results of clef-quant eval")
        sides = tuple(
            ResultSide(
                key=s.key,
                name=s.name,
                role=s.role,
                runner=s.runner,
                folder=s.folder,
                sha256=s.model_hash.sha256,
                hash_from=s.model_hash.from_,
                scheme=s.model_hash.scheme,
                settings=s.settings,
                records_scored=s.records_scored,
                records_reused=s.records_reused,
                probabilities=s.probabilities,
            )
            for s in read.sides
        )
        tasks = [ResultTask(t.name, t.title or t.name, t.records, t.questions) for t in read.tasks]
        every = ResultTask(ALL, ALL, sum(t.records for t in tasks), sum(t.questions for t in tasks))
        return cls(raw, read, sides, (*tasks, every), tuple(read.metrics), read.values)

    @property
    def reference(self) -> ResultSide | None:
        return next((s for s in self.sides if s.role == "reference"), None)

    @property
    def noise_floor(self) -> ResultSide | None:
        return next((s for s in self.sides if s.role == "noise-floor"), None)

    @property
    def candidates(self) -> list[ResultSide]:
        return [s for s in self.sides if s.is_candidate]

    @property
    def data_summary(self) -> DataSummary:
        return self.file.data.summary

    def value(self, side: ResultSide, task: str, metric: str) -> float:
        """One number; NaN where results.json has none (null: nothing to average, or not measured)."""
        found = self.values.get(side.key, {}).get(task, {}).get(metric)
        return math.nan if found is None else float(found)

    @property
    def intervals(self) -> IntervalSettings | None:
        """How the intervals were drawn; None for results.json written before intervals."""
        return self.file.intervals

    def bound(self, side: ResultSide, task: str, metric: str) -> tuple[float, float] | None:
        """(low, high) of one value's interval; None where results.json has none."""
        found = self.file.bounds.get(side.key, {}).get(task, {}).get(metric)
        if not found or any(x is None for x in found):
            return None
        return float(found[0]), float(found[1])  # type: ignore[arg-type]

    def differences(self, task: str = ALL) -> list[DifferenceEntry]:
        return [d for d in self.file.differences if d.task == task]

    def at_floor(self, side: ResultSide, task: str = ALL) -> bool | None:
        """Whether `side`'s agreement interval overlaps the noise floor's (it cannot be told from the engine's own
        noise); None without a noise floor or intervals."""
        floor = self.noise_floor
        if floor is None:
            return None
        own, theirs = self.bound(side, task, "agreement"), self.bound(floor, task, "agreement")
        if own is None or theirs is None:
            return None
        return own[0] <= theirs[1] and theirs[0] <= own[1]


def results_json_path(path: Path) -> Path:
    """results.json of an eval output: `path` itself, or the file inside the RESULTS folder `path`."""
    path = Path(path)
    return path / RESULTS_JSON if path.is_dir() else path


def read_results(path: Path) -> Results:
    """The typed results of an eval output folder or of its results.json."""
    file = results_json_path(path)
    if not file.is_file():
        raise DataError(f"{file} is missing: give the RESULTS folder of clef-quant eval or its results.json")
    raw, data = read_document(file, what="results file", error=DataError)
    if not isinstance(raw, dict) or raw.get("format") != RESULTS_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise DataError(f"{file} has format {found!r}; clef-quant reads {RESULTS_FORMAT}")
    try:
        results = Results.from_dict(raw)
    except DataError as exc:
        raise DataError(f"{file}: {exc}") from None
    return replace(results, file_sha256=hashlib.sha256(data).hexdigest())
