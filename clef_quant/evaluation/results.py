"""results.json of an evaluation run in its one typed form, `ResultsFile`: the runner builds it (`build_results`),
the report writes it (`to_json`, the only serialization), and every reader (the eval report, `load_results`, the
model card, `bench quantize`) reads and navigates it, from memory or through `read_results`.

results.json holds config, data, tasks, metrics, sides, `values[side key][task or All][metric]` and the intervals:
`intervals` (how drawn), `bounds[side key][task or All][metric]` (low, high), `differences` (every pair of plugin
sides). Its format string changes when an older reader would misread it; later fields have defaults (older files read).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

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
    title: str | None = None  # absent from files of the first runs: `label` falls back to the name
    records: int
    questions: int

    @property
    def label(self) -> str:
        """The title readers show: the name, in files that have no title."""
        return self.title or self.name


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

    @property
    def is_candidate(self) -> bool:
        return self.role == "candidate"

    def producer(self) -> dict[str, Any]:
        """What produced the side's stored lines, as `sides.Side.producer` hashed it: lets a reader verify them."""
        return {"model": self.model_hash.sha256, "settings": self.settings}


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
    """results.json, as built, written and read; its methods are what readers look up in it."""

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

    # Not a field: the bytes it was parsed from are the file's, and the card cites them, not a re-serialization.
    _read_sha256: str | None = PrivateAttr(default=None)

    def to_json(self) -> dict[str, Any]:
        """The JSON document: only the fields that were set (a file read back keeps the keys it had), aliases
        (`from`) as written."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    @property
    def file_sha256(self) -> str | None:
        """sha256 of the bytes `read_results` parsed; None for results built in memory."""
        return self._read_sha256

    @property
    def reference(self) -> SideEntry | None:
        return next((s for s in self.sides if s.role == "reference"), None)

    @property
    def noise_floor(self) -> SideEntry | None:
        return next((s for s in self.sides if s.role == "noise-floor"), None)

    @property
    def candidates(self) -> list[SideEntry]:
        return [s for s in self.sides if s.is_candidate]

    @property
    def task_rows(self) -> list[TaskEntry]:
        """The tasks in file order, then the All row (its counts summed over the tasks): the rows of every table."""
        records, questions = sum(t.records for t in self.tasks), sum(t.questions for t in self.tasks)
        return [*self.tasks, TaskEntry(name=ALL, title=ALL, records=records, questions=questions)]

    def value(self, side: SideEntry, task: str, metric: str) -> float:
        """One number; NaN where results.json has none (null: nothing to average, or not measured)."""
        found = self.values.get(side.key, {}).get(task, {}).get(metric)
        return math.nan if found is None else float(found)

    def bound(self, side: SideEntry, task: str, metric: str) -> tuple[float, float] | None:
        """(low, high) of one value's interval; None where results.json has none."""
        found = self.bounds.get(side.key, {}).get(task, {}).get(metric)
        if not found or any(x is None for x in found):
            return None
        return float(found[0]), float(found[1])  # type: ignore[arg-type]

    def at_floor(self, side: SideEntry, task: str = ALL) -> bool | None:
        """Whether `side`'s agreement interval overlaps the noise floor's (it cannot be told from the engine's own
        noise); None without a noise floor or intervals."""
        floor = self.noise_floor
        if floor is None:
            return None
        own, theirs = self.bound(side, task, "agreement"), self.bound(floor, task, "agreement")
        if own is None or theirs is None:
            return None
        return own[0] <= theirs[1] and theirs[0] <= own[1]


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


def build_results(
    config: EvalConfig,
    data: EvalData,
    sides: Sequence[Side],
    engine_settings: dict[str, Any],
    values: dict[str, dict[str, dict[str, float]]],
    uncertainty: Uncertainty | None = None,
) -> ResultsFile:
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
    return written


@dataclass(frozen=True)
class Uncertainty:
    """The intervals of one run, as `comparison.intervals` draws them."""

    settings: IntervalSettings
    bounds: dict[str, dict[str, dict[str, tuple[float | None, float | None]]]]  # side key -> task -> metric -> bounds
    differences: list[DifferenceEntry]


def _json_number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def results_json_path(path: Path) -> Path:
    """results.json of an eval output: `path` itself, or the file inside the RESULTS folder `path`."""
    path = Path(path)
    return path / RESULTS_JSON if path.is_dir() else path


def read_results(path: Path) -> ResultsFile:
    """The results of an eval output folder or of its results.json, with the sha256 of the bytes read."""
    file = results_json_path(path)
    if not file.is_file():
        raise DataError(f"{file} is missing: give the RESULTS folder of clef-quant eval or its results.json")
    raw, data = read_document(file, what="results file", error=DataError)
    if not isinstance(raw, dict) or raw.get("format") != RESULTS_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise DataError(f"{file} has format {found!r}; clef-quant reads {RESULTS_FORMAT}")
    results = validated(ResultsFile, raw, error=DataError, prefix=f"{file}: not results of clef-quant eval")
    results._read_sha256 = hashlib.sha256(data).hexdigest()
    return results
