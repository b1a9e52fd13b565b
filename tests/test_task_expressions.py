"""Task files in Jinja2 and in the older brace syntax.

The shipped task files were rewritten from the brace syntax to Jinja2; `tests/data/legacy_tasks/` keeps them as
they were (the commit before `expressions: jinja2`), so every fixture row is turned into a record by both and the
two must agree exactly. The brace syntax is still read, so those copies are also the proof that it still loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clef_quant.evaluation.errors import RowError, TaskFileError
from clef_quant.evaluation.sources import label_names, load_split
from clef_quant.evaluation.tasks import Task, load_task, load_tasks

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "eval" / "fixtures"
LEGACY = Path(__file__).resolve().parent / "data" / "legacy_tasks"
SHIPPED = sorted(path.name for path in (REPO / "eval" / "tasks").glob("*.yaml"))

HEAD = """name: {name}
title: T
version: 1
{language}dataset: {{id: x/y, config: default, eval_split: test, calibration_split: train, columns: [text, label]}}
"""


def outcome(task: Task, row: dict[str, Any], names: Any, record_id: str) -> Any:
    """The record of a row, or the fact that the row does not fit (the two languages word that differently)."""
    try:
        return task.record(row, names, record_id)
    except RowError:
        return RowError


def write_task(folder: Path, body: str, *, name: str = "probe", jinja: bool = True) -> Path:
    path = folder / f"{name}.yaml"
    language = "expressions: jinja2\n" if jinja else ""
    path.write_text(HEAD.format(name=name, language=language) + body, encoding="utf-8")
    return path


ROW = {"text": "Hello_world ", "label": 1, "choices": {"label": ["A", "B"], "text": ["yes", "no"]}}
NAMES = {"label": ["first", "second"]}


def test_every_shipped_task_is_jinja2_and_the_copies_are_the_old_syntax() -> None:
    assert sorted(path.name for path in LEGACY.glob("*.yaml")) == SHIPPED and len(SHIPPED) == 8
    for name in SHIPPED:
        assert load_task(REPO / "eval" / "tasks" / name).body.expressions == "jinja2"
        assert load_task(LEGACY / name).body.expressions == "legacy"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_task_gives_the_old_records_on_every_fixture_row(name: str) -> None:
    new, old = load_task(REPO / "eval" / "tasks" / name), load_task(LEGACY / name)
    assert new.body.model_dump(exclude={"request", "gold", "expressions"}) == old.body.model_dump(
        exclude={"request", "gold", "expressions"}
    )
    fitting = 0
    for split in (new.dataset.eval_split, new.dataset.calibration_split):
        dataset = load_split(new, split, str(FIXTURES))
        names = label_names(dataset)
        for index in range(len(dataset)):
            row, record_id = dataset[index], f"{name}/{split}/{index}"
            expected = outcome(old, row, names, record_id)
            assert outcome(new, row, names, record_id) == expected, record_id
            fitting += expected is not RowError
    assert fitting >= 32  # most rows fit: the comparison is about records, not about two identical refusals


def test_the_old_syntax_still_loads_and_gives_its_records(tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name in SHIPPED:
        (folder / name).write_bytes((LEGACY / name).read_bytes())
    assert [task.name for task in load_tasks(folder)] == [task.name for task in load_tasks()]
    old = write_task(
        tmp_path,
        'request:\n  state: "{text|readable}!"\n  questions:\n    q:\n      type: choice\n      instructions: Pick.\n'
        "      criteria: {$zip: {ids: {$column: choices.label}, descriptions: {$column: choices.text}}}\n"
        "gold:\n  q: {$map: label, values: {0: A, 1: B}}\n",
        jinja=False,
    )
    body, gold = load_task(old).record(ROW, NAMES, "r")
    assert body["state"] == "Hello world!" and body["questions"]["q"]["criteria"] == {"A": "yes", "B": "no"}
    assert gold == {"q": "B"}


def test_a_single_expression_keeps_its_value_and_text_around_makes_a_string(tmp_path: Path) -> None:
    path = write_task(
        tmp_path,
        'request:\n  state: {whole: "{{ text }}", count: "{{ label }}", said: "n={{ label }}", plain: 7}\n'
        "  questions:\n    q:\n      type: choice\n      instructions: \"{{ label_name('label') }}\"\n"
        '      criteria: "{{ criteria(choices.label, choices.text) }}"\n'
        "gold:\n  q: \"{{ label | lookup({0: 'A', '1': 'B'}) }}\"\n",
    )
    task = load_task(path)
    # A text that reads as a Python literal stays text (jinja2's native_concat would make it the number 42).
    body, gold = task.record({**ROW, "text": "42"}, NAMES, "r")
    assert body["state"] == {"whole": "42", "count": 1, "said": "n=1", "plain": 7}
    assert body["questions"]["q"]["instructions"] == "second"
    assert gold == {"q": "B"}  # the row's 1 matches the key '1': keys compare as text, as in `$map`


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            'request:\n  state: "{{ txt }}"',
            "'{{ txt }}': the row has no column 'txt'",
        ),
        (
            'request:\n  state: "{{ choices.texts }}"',
            "'{{ choices.texts }}': 'dict object' has no attribute 'texts'",
        ),
        (
            "request:\n  state: \"{{ label_name('text') }}\"",
            "column 'text' is not a ClassLabel in this dataset, so its values have no names",
        ),
    ],
)
def test_a_template_wrong_for_every_row_is_a_file_error_naming_file_and_template(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write_task(
        tmp_path, body + "\n  questions: {q: {type: noul, instructions: Is it true}}\ngold: {q: 'true'}\n"
    )
    task = load_task(path)
    with pytest.raises(TaskFileError) as caught:
        task.record(ROW, NAMES, "r")
    assert not isinstance(caught.value, RowError)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("{{ text | readble }}", "'{{ text | readble }}': Jinja2 error: No filter named 'readble'. (ours: readable,"),
        ("{{ text ", "'{{ text ': Jinja2 error: unexpected end of template"),
        ("{% if text %}", "'{% if text %}': Jinja2 error: Unexpected end of template."),
    ],
)
def test_a_bad_filter_or_syntax_error_fails_when_the_file_is_loaded(tmp_path: Path, state: str, message: str) -> None:
    path = write_task(
        tmp_path,
        f'request:\n  state: "{state}"\n  questions: {{q: {{type: noul, instructions: Is it true}}}}\n'
        "gold: {q: 'true'}\n",
    )
    with pytest.raises(TaskFileError) as caught:
        load_task(path)
    assert str(caught.value).startswith(f"{path}: {message}"), str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_an_old_operator_in_a_jinja2_file_is_refused(tmp_path: Path) -> None:
    path = write_task(
        tmp_path,
        "request:\n  state: {$column: text}\n  questions: {q: {type: noul, instructions: Is it true}}\n"
        "gold: {q: {$map: label, values: {1: 'true'}}}\n",
    )
    with pytest.raises(TaskFileError, match=r": \$column, \$map belong\(s\) to the old syntax; "):
        load_task(path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {**ROW, "label": 7},
            "task probe, row r: \"{{ label | lookup({0: 'A', 1: 'B'}) }}\": '7' has no entry in the table (0, 1)",
        ),
        (
            {**ROW, "choices": {"label": ["A"], "text": ["yes", "no"]}},
            "task probe, row r: '{{ criteria(choices.label, choices.text) }}': 2 descriptions but only 1 ids",
        ),
    ],
)
def test_a_row_that_does_not_fit_is_a_row_error(tmp_path: Path, row: dict[str, Any], message: str) -> None:
    path = write_task(
        tmp_path,
        'request:\n  state: "{{ text }}"\n  questions:\n    q:\n      type: choice\n      instructions: Pick.\n'
        '      criteria: "{{ criteria(choices.label, choices.text) }}"\n'
        "gold:\n  q: \"{{ label | lookup({0: 'A', 1: 'B'}) }}\"\n",
    )
    with pytest.raises(RowError) as caught:
        load_task(path).record(row, NAMES, "r")
    assert str(caught.value) == message


def test_the_sandbox_refuses_what_a_task_file_has_no_business_doing(tmp_path: Path) -> None:
    path = write_task(
        tmp_path,
        "request:\n  state: \"{{ choices.update({'label': []}) }}\"\n"
        "  questions: {q: {type: noul, instructions: Is it true}}\ngold: {q: 'true'}\n",
    )
    with pytest.raises(TaskFileError, match=r"access to attribute 'update' of 'dict' object is unsafe"):
        load_task(path).record(ROW, NAMES, "r")


@pytest.mark.parametrize(
    ("state", "row", "error", "message"),
    [
        ("{txt}", ROW, TaskFileError, "the row has no column 'txt'"),
        ("{text|loud}", ROW, TaskFileError, "unknown filter |loud; known: readable"),
        (
            "{text}",
            {**ROW, "label": 7},
            RowError,
            "task probe, row r: $map label: '7' has no entry in the table (0, 1)",
        ),
    ],
)
def test_the_old_syntax_keeps_its_errors(
    tmp_path: Path, state: str, row: dict[str, Any], error: type[Exception], message: str
) -> None:
    path = write_task(
        tmp_path,
        f'request:\n  state: "{state}"\n  questions: {{q: {{type: noul, instructions: Is it true}}}}\n'
        "gold: {q: {$map: label, values: {0: 'false', 1: 'true'}}}\n",
        jinja=False,
    )
    with pytest.raises(error) as caught:
        load_task(path).record(row, NAMES, "r")
    # A file error names the file; a row error names the task and row, and build-data skips that row.
    assert type(caught.value) is error
    assert str(caught.value) == (message if error is RowError else f"{path}: {message}")
