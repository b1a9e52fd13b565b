"""summary.json of a DATA folder: its one shape, written by build-data and read back by eval, its report and the
model card (through results.json, which keeps the summary it was run on).

Every field has a default and every section keeps keys it does not name, so a summary of an earlier build-data
(or one a later version extends) still reads; a field that is absent reads as None, never as a guess.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from clef_quant.evaluation.sources import HUB

# Written with `exclude_unset`: a section reads back as exactly the keys that were given.
_SECTION = ConfigDict(extra="allow")


class Lengths(BaseModel):
    """Prompt lengths of a split's records; empty for a split with no records."""

    model_config = _SECTION

    unit: str | None = None
    min: int | None = None
    mean: float | None = None
    p50: int | None = None
    p95: int | None = None
    max: int | None = None
    over_default_max_length: int | None = None  # with --tokenizer only


class TaskFile(BaseModel):
    model_config = _SECTION

    path: str | None = None  # as shipped (`eval/tasks/x.yaml`), else as given
    version: int | str | None = None
    sha256: str | None = None


class Dataset(BaseModel):
    model_config = _SECTION

    id: str | None = None
    config: str | None = None
    revision: str | None = None


class Split(BaseModel):
    model_config = _SECTION

    split: str | None = None
    rows: int | None = None
    records: int | None = None
    questions: int | None = None  # eval split only
    lengths: Lengths = Lengths()


class TaskSummary(BaseModel):
    model_config = _SECTION

    title: str | None = None
    task_file: TaskFile = TaskFile()
    dataset: Dataset = Dataset()
    eval: Split = Split()
    calibration: Split = Split()
    skipped: dict[str, int] = {}  # reason -> rows skipped


class Counts(BaseModel):
    model_config = _SECTION

    tasks: int | None = None
    eval_records: int | None = None
    eval_questions: int | None = None
    calibration_records: int | None = None


class DataSummary(BaseModel):
    """summary.json."""

    model_config = _SECTION

    format: str | None = None
    created: str | None = None
    source: str | None = None  # "hub", or the folder of the rows (the shipped fixtures by their repository path)
    seed: int | None = None
    per_task: int | None = None
    calibration_requested: int | None = None
    length_unit: str | None = None
    tokenizer: str | None = None
    counts: Counts = Counts()
    tasks: dict[str, TaskSummary] = {}

    @property
    def from_hub(self) -> bool:
        return self.source == HUB

    def title(self, task: str) -> str:
        """The task's title, or its name where the summary gives none."""
        found = self.tasks.get(task)
        return found.title if found is not None and found.title else task

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", exclude_unset=True)
