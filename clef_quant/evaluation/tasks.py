"""Task files (`eval/tasks/*.yaml`): which dataset split a task reads and how one row becomes a SystemOne request.

A task file is data. Its `request` and `gold` sections are JSON-like templates evaluated against one dataset row:

- a string is a template: `{column}` is replaced by the row's value (dotted paths reach into structs, e.g.
  `{choices.text}`), `{column|readable}` also turns underscores into spaces;
- `{$column: path}` is the row's raw value (a list, a number, ...);
- `{$label_name: column}` is the class name of a ClassLabel column (names come from the dataset's features);
- `{$map: path, values: {...}}` looks the row's value up in a table (keys compare as text: `0`, `"0"` and
  `true` match the values 0, "0" and True);
- `{$zip: {ids: EXPR, descriptions: EXPR}}` pairs two lists into an object, for choice criteria taken from a row;
- `{$image: column}` is the row's image (a `datasets` Image) as base64 PNG, for the request's `images`; a row
  without one does not fit the task;
- lists and objects are evaluated item by item, anything else is kept as it is.

Gold answers are option ids: a choice's key, `"true"`/`"false"` for noul, `"0"`, `"1"`, ... for score levels.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from clef_quant import shipped
from clef_quant.documents import read_document, validated
from clef_quant.evaluation.errors import RowError, TaskFileError
from clef_vllm.errors import RequestError
from clef_vllm.request import ClefRequest, parse_request

TASK_SUFFIX = ".yaml"
REQUEST_MODEL = "clef-flash"  # echoed in responses only; the model that answers is the one being evaluated

Row = Mapping[str, Any]
LabelNames = Mapping[str, list[str]]  # ClassLabel column -> class names

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|(\w+))?\}")
FILTERS: dict[str, Callable[[str], str]] = {"readable": lambda text: text.replace("_", " ").strip()}


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
    dataset: DatasetSpec
    request: dict[str, Any]
    gold: dict[str, Any]


@dataclass(frozen=True)
class Task:
    """A loaded task file; `sha256` of the file is recorded in DATA so results name the exact task version."""

    body: TaskBody
    path: Path | Traversable  # a shipped task file is a Traversable
    sha256: str

    @property
    def name(self) -> str:
        return self.body.name

    @property
    def dataset(self) -> DatasetSpec:
        return self.body.dataset

    def request(self, row: Row, names: LabelNames, record_id: str) -> dict[str, Any]:
        """The SystemOne request body of one row."""
        template = self.body.request
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
        return {qid: _option_id(evaluate(expr, row, names)) for qid, expr in self.body.gold.items()}

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


def gold_index(request: ClefRequest, gold: Mapping[str, str]) -> list[int]:
    """Position of each question's gold option in model order (the order probabilities come in)."""
    return [[o.id for o in q.options].index(gold[q.id]) for q in request.questions]


# -- the expression language -----------------------------------------------------------------------------------


def evaluate(expr: Any, row: Row, names: LabelNames) -> Any:
    if isinstance(expr, str):
        return _fill(expr, row)
    if isinstance(expr, list):
        return [evaluate(item, row, names) for item in expr]
    if isinstance(expr, dict):
        operators = [key for key in expr if isinstance(key, str) and key.startswith("$")]
        if not operators:
            return {str(key): evaluate(value, row, names) for key, value in expr.items()}
        if len(operators) != 1 or operators[0] not in _OPERATORS:
            raise TaskFileError(f"unknown or repeated operator in {expr!r}; known: {', '.join(_OPERATORS)}")
        return _OPERATORS[operators[0]](expr, row, names)
    return expr


def _lookup(row: Row, path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise TaskFileError(f"the row has no column {path!r}")
        value = value[part]
    return value


def _fill(template: str, row: Row) -> str:
    def one(match: re.Match[str]) -> str:
        value = _lookup(row, match.group(1))
        text = value if isinstance(value, str) else str(value)
        if match.group(2):
            if match.group(2) not in FILTERS:
                raise TaskFileError(f"unknown filter |{match.group(2)}; known: {', '.join(FILTERS)}")
            text = FILTERS[match.group(2)](text)
        return text

    return _PLACEHOLDER.sub(one, template)


def _key_text(value: Any) -> str:
    """Table keys and row values compare as text; YAML reads `true:` as a bool and `0:` as an int."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _option_id(value: Any) -> str:
    if isinstance(value, str | int):  # bool is an int: True becomes "true"
        return _key_text(value)
    raise RowError(f"a gold answer must be an option id, not {value!r}")


def _op_column(expr: dict[str, Any], row: Row, names: LabelNames) -> Any:
    return _lookup(row, expr["$column"])


def _op_label_name(expr: dict[str, Any], row: Row, names: LabelNames) -> str:
    column = expr["$label_name"]
    if column not in names:
        raise TaskFileError(f"column {column!r} is not a ClassLabel in this dataset, so its values have no names")
    value = _lookup(row, column)
    if not isinstance(value, int) or not 0 <= value < len(names[column]):
        raise RowError(f"{column}={value!r} is not a class index of {len(names[column])} names")
    return names[column][value]


def _op_image(expr: dict[str, Any], row: Row, names: LabelNames) -> str:
    import base64
    import io

    value = _lookup(row, expr["$image"])
    if value is None:
        raise RowError(f"the row has no image in {expr['$image']!r}")
    if isinstance(value, Mapping):  # an undecoded Image feature: {"bytes", "path"}
        if not value.get("bytes"):
            raise RowError(f"the row has no image bytes in {expr['$image']!r}")
        return base64.b64encode(value["bytes"]).decode("ascii")
    if not hasattr(value, "save"):
        raise RowError(f"{expr['$image']!r} is not an image")
    buffer = io.BytesIO()
    value.convert("RGB").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _op_map(expr: dict[str, Any], row: Row, names: LabelNames) -> Any:
    table = {_key_text(key): value for key, value in (expr.get("values") or {}).items()}
    value = _key_text(_lookup(row, expr["$map"]))
    if value not in table:
        raise RowError(f"{expr['$map']}={value!r} has no entry in the task's $map values ({', '.join(table)})")
    return evaluate(table[value], row, names)


def _op_zip(expr: dict[str, Any], row: Row, names: LabelNames) -> dict[str, Any]:
    spec = expr["$zip"]
    ids = evaluate(spec["ids"], row, names)
    descriptions = evaluate(spec["descriptions"], row, names)
    if not isinstance(ids, list) or not isinstance(descriptions, list):
        raise RowError("$zip needs two lists (ids and descriptions)")
    # The row decides how many options there are (ARC has 3 to 5); ids beyond the descriptions are unused.
    if len(ids) < len(descriptions):
        raise RowError(f"$zip has {len(descriptions)} descriptions but only {len(ids)} ids")
    return {str(i): d for i, d in zip(ids, descriptions, strict=False)}


_OPERATORS: dict[str, Callable[[dict[str, Any], Row, LabelNames], Any]] = {
    "$column": _op_column,
    "$label_name": _op_label_name,
    "$map": _op_map,
    "$zip": _op_zip,
    "$image": _op_image,
}


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
    return Task(body=body, path=path, sha256=hashlib.sha256(raw).hexdigest())


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
