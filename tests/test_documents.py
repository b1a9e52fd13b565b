"""Files users hand the tools: every problem with one is a single line that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from clef_quant.documents import read_document, validated
from clef_quant.evaluation.errors import TaskFileError
from clef_quant.evaluation.tasks import load_task


class Shape(BaseModel):
    name: str
    count: int


class Refused(Exception):
    pass


def test_a_document_comes_back_with_the_bytes_read(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b'{"name": "x", "count": 2}')
    data, raw = read_document(path, what="shape file", error=Refused)
    assert validated(Shape, data, error=Refused, prefix=str(path)) == Shape(name="x", count=2)
    assert raw == path.read_bytes()


@pytest.mark.parametrize(
    ("content", "syntax", "expected"),
    [
        (None, "JSON", "cannot read shape file"),
        (b"{not json", "JSON", "is not valid JSON: "),
        (b"\xff\xfe", "JSON", "is not valid JSON: "),
        (b"a: [unclosed", "YAML", "is not valid YAML: "),
    ],
)
def test_unreadable_or_unparsable_is_one_line(tmp_path: Path, content: bytes | None, syntax, expected: str) -> None:
    path = tmp_path / "doc"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(Refused) as caught:
        read_document(path, what="shape file", error=Refused, syntax=syntax)
    message = str(caught.value)
    assert expected in message and str(path) in message and len(message.splitlines()) == 1


def test_the_first_shape_problem_names_where_and_counts_the_rest() -> None:
    with pytest.raises(Refused) as caught:
        validated(Shape, {"count": "many"}, error=Refused, prefix="shape.json")
    assert str(caught.value).startswith("shape.json: ")
    assert "(and 1 more)" in str(caught.value)
    with pytest.raises(Refused, match=r"^shape.json: top level: "):
        validated(Shape, [1, 2], error=Refused, prefix="shape.json")


def test_a_task_file_with_a_wrong_field_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nsplit: 3\n", encoding="utf-8")
    with pytest.raises(TaskFileError) as caught:
        load_task(path)
    assert str(caught.value).startswith(f"{path}: ") and len(str(caught.value).splitlines()) == 1
