"""Files users hand the tools: every problem with one is a single line that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from clef_quant.documents import parse_json_line, read_document, validated
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


BROKEN = b'{"state": 1,\n "questions": }'
WHY = "Expecting value (line 2 column 15)"


def test_json_that_does_not_parse_is_refused_in_one_wording_by_every_reader(tmp_path: Path) -> None:
    from clef_quant.throughput_report import read_report
    from clef_vllm.errors import CheckpointError, ClefError, RequestError
    from clef_vllm.format import strict_json
    from clef_vllm.head.files import HeadConfig

    path = tmp_path / "broken.json"
    path.write_bytes(BROKEN)
    readers = {
        "a document": lambda: read_document(path, what="shape file", error=Refused),
        "a throughput report": lambda: read_report(path),
        "a head config": lambda: HeadConfig.read(path),
    }
    for what, read in readers.items():
        with pytest.raises((Refused, ClefError, CheckpointError)) as caught:
            read()
        assert str(caught.value) == f"{path} is not valid JSON: {WHY}", what
    with pytest.raises(RequestError) as request:
        strict_json.loads(BROKEN)
    assert (request.value.message, request.value.code) == (f"body is not valid JSON: {WHY}", "invalid_json")
    with pytest.raises(Refused) as line:
        parse_json_line('{"state": }', where=f"{path}:2", error=Refused)
    assert str(line.value) == f"{path}:2 is not valid JSON: Expecting value (column 11)"


def test_json_that_is_not_utf8_is_refused_in_one_wording(tmp_path: Path) -> None:
    from clef_vllm.errors import RequestError
    from clef_vllm.format import strict_json

    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"state": "K\xf6ln"}')
    with pytest.raises(Refused) as caught:
        read_document(path, what="shape file", error=Refused)
    assert str(caught.value) == f"{path} is not valid UTF-8 at byte 12"
    with pytest.raises(RequestError) as request:
        strict_json.loads(path.read_bytes())
    assert request.value.message == "body is not valid UTF-8 at byte 12"


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
