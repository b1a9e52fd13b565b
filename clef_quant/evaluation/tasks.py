"""Task files (`eval/tasks/*.yaml`): which dataset split a task reads and how one row becomes a SystemOne request.

A task file is data. Its `request` and `gold` sections are JSON-like templates evaluated against one dataset row.
A file that says `expressions: jinja2` (every shipped one) writes them in Jinja2:

- every string is a Jinja2 template whose variables are the row's columns (`{{ choices.text }}` reaches into a
  struct; a field named like a dict method, e.g. `items`, is read as `choices["items"]`). A string that is one
  `{{ expression }}` gives the expression's value as it is (a list, an object, a number, a string that looks like
  a number); with text around it, or several expressions, the result is a string;
- filters: `readable` (underscores to spaces, e.g. `{{ subject | readable }}`); `lookup(table)`, the row's value
  looked up in a table with keys compared as text (`{{ label | lookup({0: 'A', 1: 'B'}) }}`: `0`, `'0'` and
  `true` match the values 0, "0" and True; a value not in the table means the row does not fit);
  `png_base64`, a `datasets` Image as base64 PNG for the request's `images` (a row without one does not fit);
- functions: `label_name('column')`, the class name of a ClassLabel column (names come from the dataset's
  features); `criteria(ids, descriptions)`, two lists paired into an object, for choice criteria taken from a row
  (ids beyond the descriptions are unused; fewer ids than descriptions means the row does not fit);
- templates run in Jinja2's immutable sandbox, and nothing undefined is ever left empty: a column the row lacks
  (or a struct field, or a list item past the end), an unknown filter or a syntax error is an error of the file
  (a TaskFileError naming the file and the template; syntax and filters are checked when the file is loaded),
  while a value that does not fit (a key not in the table, too few ids, a failing operation) skips the row
  (RowError).

Lists and objects are evaluated item by item (object keys are kept as written), anything else is kept as it is.

A file without `expressions:` (or with `expressions: legacy`) is read in the older syntax it was written in:
`{column}` and `{column|readable}` placeholders in strings, and the objects `{$column: path}`,
`{$label_name: column}`, `{$map: path, values: {...}}`, `{$zip: {ids: EXPR, descriptions: EXPR}}` and
`{$image: column}`, which follow the same rules as `lookup`, `label_name`, `criteria` and `png_base64`.
The two languages live in `expressions.py`.

Gold answers are option ids: a choice's key, `"true"`/`"false"` for noul, `"0"`, `"1"`, ... for score levels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clef_quant import shipped
from clef_quant.documents import read_document, validated
from clef_quant.evaluation.errors import RowError, TaskFileError
from clef_quant.evaluation.expressions import (
    JINJA2,
    Expressions,
    JinjaExpressions,
    LabelNames,
    LegacyExpressions,
    Row,
    key_text,
)
from clef_vllm.errors import RequestError
from clef_vllm.format.request import ClefRequest, parse_request

TASK_SUFFIX = ".yaml"
REQUEST_MODEL = "clef-flash"  # echoed in responses only; the model that answers is the one being evaluated


class DatasetSpec(BaseModel):
    """Where a task's rows come from; `revision` is set only where the default branch cannot be read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    config: str
    revision: str | None = None
    revision_reason: str | None = None
    eval_split: str
    calibration_split: str
    columns: tuple[str, ...]


class TaskBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_]+$")
    title: str
    version: int
    description: str = ""
    optional: bool = False  # built and evaluated only when asked for by name (--task)
    expressions: Literal["jinja2", "legacy"] = "legacy"  # absent: a file written before Jinja2, read as it was
    dataset: DatasetSpec
    request: dict[str, Any]
    gold: dict[str, Any]


@dataclass(frozen=True)
class Task:
    """A loaded task file; `sha256` of the file is recorded in DATA so results name the exact task version."""

    body: TaskBody
    path: Path | Traversable  # a shipped task file is a Traversable
    sha256: str
    expressions: Expressions  # the file's `request` and `gold`, ready to evaluate (Jinja2: compiled)

    @property
    def name(self) -> str:
        return self.body.name

    @property
    def dataset(self) -> DatasetSpec:
        return self.body.dataset

    def request(self, row: Row, names: LabelNames, record_id: str) -> dict[str, Any]:
        """The SystemOne request body of one row."""
        template, evaluate = self.body.request, self.expressions.evaluate
        body = {
            "id": record_id,
            "model": REQUEST_MODEL,
            "state": evaluate(template["state"], row, names),
            "questions": {qid: evaluate(q, row, names) for qid, q in template["questions"].items()},
        }
        if "images" in template:
            body["images"] = evaluate(template["images"], row, names)
        return body

    def gold(self, row: Row, names: LabelNames) -> dict[str, str]:
        return {qid: _option_id(self.expressions.evaluate(expr, row, names)) for qid, expr in self.body.gold.items()}

    def record(self, row: Row, names: LabelNames, record_id: str) -> tuple[dict[str, Any], dict[str, str]]:
        """Request and gold of one row, both checked: the request is valid and every gold is one of its options.

        Raises RowError when this row does not fit (build-data skips it), TaskFileError when no row can.
        """
        try:
            body = self.request(row, names, record_id)
            gold = self.gold(row, names)
            check_gold(parse_request(body), gold)
        except RequestError as exc:
            raise RowError(f"task {self.name}, row {record_id}: {exc}") from None
        except RowError as exc:
            raise RowError(f"task {self.name}, row {record_id}: {exc}") from None
        except TaskFileError as exc:
            raise TaskFileError(f"{self.path}: {exc}") from None
        return body, gold


def check_gold(request: ClefRequest, gold: Mapping[str, Any]) -> None:
    """Every question has exactly one gold answer and it is one of the question's options."""
    questions = {q.id: q for q in request.questions}
    if set(gold) != set(questions):
        raise RowError(f"gold answers {sorted(gold)} do not match the questions {sorted(questions)}")
    for qid, answer in gold.items():
        options = [o.id for o in questions[qid].options]
        if answer not in options:
            shown = ", ".join(options[:6]) + (", ..." if len(options) > 6 else "")
            raise RowError(f"gold {answer!r} of question {qid} is not one of its options ({shown})")


def _option_id(value: Any) -> str:
    if isinstance(value, str | int):  # bool is an int: True becomes "true"
        return key_text(value)
    raise RowError(f"a gold answer must be an option id, not {value!r}")


def gold_index(request: ClefRequest, gold: Mapping[str, str]) -> list[int]:
    """Position of each question's gold option in model order (the order probabilities come in)."""
    return [[o.id for o in q.options].index(gold[q.id]) for q in request.questions]


# -- loading task files ----------------------------------------------------------------------------------------


def load_task(path: Path | Traversable) -> Task:
    data, raw = read_document(path, what="task file", error=TaskFileError, syntax="YAML")
    body = validated(TaskBody, data, error=TaskFileError, prefix=str(path), top="file")
    stem = path.name.removesuffix(TASK_SUFFIX)
    if body.name != stem:
        raise TaskFileError(f"{path}: name {body.name!r} must equal the file name {stem!r}")
    questions = body.request.get("questions")
    if not {"state", "questions"} <= set(body.request) <= {"state", "questions", "images"} or not questions:
        raise TaskFileError(f"{path}: request needs a state, a non-empty questions object and optionally images")
    if not isinstance(questions, dict):
        raise TaskFileError(f"{path}: request needs a state, a non-empty questions object and optionally images")
    if set(body.gold) != set(questions):
        raise TaskFileError(f"{path}: gold must name every question exactly once ({', '.join(questions)})")
    try:
        expressions = JinjaExpressions([body.request, body.gold]) if body.expressions == JINJA2 else LegacyExpressions()
    except TaskFileError as exc:
        raise TaskFileError(f"{path}: {exc}") from None
    return Task(body=body, path=path, sha256=hashlib.sha256(raw).hexdigest(), expressions=expressions)


def load_tasks(folder: Path | Traversable | None = None, names: list[str] | None = None) -> list[Task]:
    """Every task file of `folder` (default: the shipped `eval/tasks/`, sorted by name) except optional ones, or
    only `names`; unknown names fail listing the known ones."""
    folder = shipped.tasks() if folder is None else folder
    files = folder.iterdir() if folder.is_dir() else []
    paths = sorted((p for p in files if p.name.endswith(TASK_SUFFIX) and p.is_file()), key=lambda p: p.name)
    if not paths:
        raise TaskFileError(f"no task files (*.yaml) in {folder}")
    tasks = [load_task(path) for path in paths]
    if names:
        known = {task.name: task for task in tasks}
        unknown = [name for name in names if name not in known]
        if unknown:
            raise TaskFileError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(known)}")
        tasks = [known[name] for name in names]
        return tasks
    return [task for task in tasks if not task.body.optional]
