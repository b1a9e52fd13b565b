"""`clef-quant encode` and `clef-quant score` through the real CLI on the tiny checkpoint.

User errors must end with exit code 2 and exactly one `error: ...` line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

NOUL_TRUE = '{"description":"The proposition is true or the answer is yes.","option_id":"true"}'
NOUL_FALSE = '{"description":"The proposition is false or the answer is no.","option_id":"false"}'

MIXED_REQUEST = {
    "model": "clef-tiny",
    "id": "rec-1",
    "state": {"ticket": "My parcel arrived broken. Grüße aus Köln!", "priority": 2},
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "topic": {
            "type": "choice",
            "instructions": {"task": "topic"},
            "criteria": {"shipping": "Delivery problems", "billing": "Payments", "10": None},
        },
        "anger": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
    },
}


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


@pytest.fixture(scope="module")
def cli_app():
    from clef_quant.cli import app

    return app


def write(tmp_path: Path, request, name="request.json") -> str:
    path = tmp_path / name
    path.write_text(request if isinstance(request, str) else json.dumps(request), encoding="utf-8")
    return str(path)


def invoke(runner, app, *args):
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(result, pattern: str) -> str:
    """Exit 2, nothing on stdout, one `error:` line on stderr that matches `pattern`, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


# --- encode ------------------------------------------------------------------------------------------------


def test_encode_prints_tokens_spans_and_their_text(runner, cli_app, tiny_dir, tokenizer, tmp_path):
    from clef_vllm.format.encoding import encode_request
    from clef_vllm.format.request import parse_request

    result = invoke(runner, cli_app, "encode", "--model", tiny_dir, write(tmp_path, MIXED_REQUEST))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    out = json.loads(result.stdout)

    assert out["num_tokens"] == len(out["input_ids"])
    assert out["max_length"] == 16384
    state_ids = tokenizer(
        '{"priority":2,"ticket":"My parcel arrived broken. Grüße aus Köln!"}', add_special_tokens=False
    )
    assert out["state"] == {"tokens": len(state_ids["input_ids"]), "truncated": False, "tokens_dropped": 0}

    questions = out["questions"]
    assert [(q["id"], q["type"], q["type_id"]) for q in questions] == [
        ("refund", "noul", 0),
        ("topic", "choice", 1),
        ("anger", "score", 2),
    ]
    assert [q["span"]["text"] for q in questions] == [
        "Does the customer ask for a refund?",
        '{"task":"topic"}',
        "anger",
    ]
    assert [[o["id"] for o in q["options"]] for q in questions] == [
        ["true", "false"],
        ["10", "billing", "shipping"],
        ["0", "1", "2"],
    ]
    assert [[o["span"]["text"] for o in q["options"]] for q in questions] == [
        [NOUL_TRUE, NOUL_FALSE],
        [
            '{"option_id":"10"}',
            '{"description":"Payments","option_id":"billing"}',
            '{"description":"Delivery problems","option_id":"shipping"}',
        ],
        [
            '{"description":"calm","option_id":"0"}',
            '{"description":"annoyed","option_id":"1"}',
            '{"description":"furious","option_id":"2"}',
        ],
    ]
    spans = [q["span"] for q in questions] + [o["span"] for q in questions for o in q["options"]]
    for span in spans:
        assert tokenizer.decode(out["input_ids"][span["start"] : span["end"]]) == span["text"]

    library = encode_request(parse_request(MIXED_REQUEST), tokenizer)
    assert out["input_ids"] == library.input_ids
    assert [(q["span"]["start"], q["span"]["end"]) for q in questions] == [tuple(s) for s in library.question_spans]


def test_encode_reports_state_truncation(runner, cli_app, tiny_dir, tmp_path):
    path = write(tmp_path, MIXED_REQUEST)
    full = json.loads(invoke(runner, cli_app, "encode", "--model", tiny_dir, path).stdout)
    max_length = full["num_tokens"] - 7

    result = invoke(runner, cli_app, "encode", "--model", tiny_dir, "--max-model-len", max_length, path)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["num_tokens"] == max_length
    assert out["max_length"] == max_length
    assert out["state"] == {"tokens": full["state"]["tokens"] - 7, "truncated": True, "tokens_dropped": 7}
    # the schema is the same, only shifted left by the 7 dropped state tokens
    for cut, whole in zip(out["questions"], full["questions"], strict=True):
        assert cut["span"]["text"] == whole["span"]["text"]
        assert cut["span"]["start"] == whole["span"]["start"] - 7


def test_encode_reads_stdin(runner, cli_app, tiny_dir, tmp_path):
    from_file = invoke(runner, cli_app, "encode", "--model", tiny_dir, write(tmp_path, MIXED_REQUEST))
    from_stdin = runner.invoke(cli_app, ["encode", "--model", str(tiny_dir), "-"], input=json.dumps(MIXED_REQUEST))
    assert from_stdin.exit_code == 0, from_stdin.output
    assert json.loads(from_stdin.stdout) == json.loads(from_file.stdout)


def test_encode_image_request(runner, cli_app, tiny_dir, tmp_path):
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (48, 32), (1, 2, 3)).save(buffer, format="PNG")
    request = dict(MIXED_REQUEST, images=[base64.b64encode(buffer.getvalue()).decode()])
    text_only = json.loads(
        invoke(runner, cli_app, "encode", "--model", tiny_dir, write(tmp_path, MIXED_REQUEST)).stdout
    )
    result = invoke(runner, cli_app, "encode", "--model", tiny_dir, write(tmp_path, request, "image.json"))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    added = out["num_tokens"] - text_only["num_tokens"]
    assert added >= 4  # vision_start, at least one image_pad, vision_end, newline
    assert [q["span"]["text"] for q in out["questions"]] == [q["span"]["text"] for q in text_only["questions"]]
    assert out["questions"][0]["span"]["start"] == text_only["questions"][0]["span"]["start"] + added


# --- user errors -------------------------------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param([1, 2], r"JSON object", id="not-an-object"),
    pytest.param({"model": None, "state": 1, "questions": {"q": {"type": "noul"}}}, r"model", id="model-null"),
    pytest.param({"model": 3, "state": 1, "questions": {"q": {"type": "noul"}}}, r"model", id="model-not-str"),
    pytest.param({"model": "m", "questions": {"q": {"type": "noul"}}}, r"state is required", id="missing-state"),
    pytest.param({"model": "m", "state": 1, "questions": {}}, r"questions must be a non-empty", id="empty-questions"),
    pytest.param({"model": "m", "state": 1, "questions": {"q": {"type": "bool"}}}, r'"q".*type', id="bad-type"),
    pytest.param(
        {"model": "m", "state": 1, "questions": {"q": {"type": "choice", "criteria": {}}}},
        r'"q".*non-empty criteria',
        id="no-options",
    ),
    pytest.param(
        {"model": "m", "state": 1, "questions": {"q": {"type": "score", "criteria": {"a": "x"}}}},
        r'"q".*list',
        id="score-criteria-object",
    ),
    pytest.param(
        {"model": "m", "state": 1, "questions": {f"q{i}": {"type": "noul"} for i in range(65)}},
        r"too many questions: 65",
        id="65-questions",
    ),
]


@pytest.mark.parametrize("command", ["encode", "score"])
@pytest.mark.parametrize(("request_body", "pattern"), BAD_REQUESTS)
def test_bad_request_is_one_error_line(runner, cli_app, tiny_dir, tmp_path, command, request_body, pattern):
    result = invoke(runner, cli_app, command, "--model", tiny_dir, write(tmp_path, request_body))
    assert_user_error(result, pattern)


@pytest.mark.parametrize("command", ["encode", "score"])
def test_invalid_json_file(runner, cli_app, tiny_dir, tmp_path, command):
    path = write(tmp_path, '{"model": "m",\n "state": ', "broken.json")
    line = assert_user_error(invoke(runner, cli_app, command, "--model", tiny_dir, path), "")
    assert line == f"error: {path} is not valid JSON: Expecting value (line 2 column 11)"  # the server's words


@pytest.mark.parametrize("command", ["encode", "score"])
def test_missing_request_file(runner, cli_app, tiny_dir, tmp_path, command):
    missing = tmp_path / "nope.json"
    line = assert_user_error(invoke(runner, cli_app, command, "--model", tiny_dir, missing), r"cannot read")
    assert "nope.json" in line


@pytest.mark.parametrize("command", ["encode", "score"])
def test_missing_model_folder(runner, cli_app, tmp_path, command):
    path = write(tmp_path, MIXED_REQUEST)
    assert_user_error(invoke(runner, cli_app, command, "--model", tmp_path / "no-such-model", path), r"no-such-model")


def test_folder_that_is_not_a_release(runner, cli_app, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(runner, cli_app, "encode", "--model", empty, write(tmp_path, MIXED_REQUEST))
    assert_user_error(result, r"not a release folder")


# What names a release, refused in the same words by every command and by the library.
NOT_RELEASES = {
    "missing": ("{tmp}/no/such/model", "{tmp}/no/such/model does not exist and is not a Hub id (ORG/NAME)"),
    "no-config": ("{tmp}/empty", "{tmp}/empty is not a release folder: it has no config.json"),
    "relative": ("./no-such-model", "./no-such-model does not exist and is not a Hub id (ORG/NAME)"),
}
COMMANDS_WITH_A_RELEASE = {
    "encode": ["encode", "--model", "{model}", "{request}"],
    "score": ["score", "--model", "{model}", "{request}"],
    "quantize": ["quantize", "{model}", "--scheme", "fp8-dynamic", "--out", "{tmp}/out"],
    "scan": ["scan", "{model}", "--out", "{tmp}/scan"],
}


@pytest.mark.parametrize("case", NOT_RELEASES)
def test_what_is_not_a_release_is_refused_in_one_wording_everywhere(runner, cli_app, tmp_path, case):
    from clef_vllm.engine import ClefEngine
    from clef_vllm.errors import CheckpointError

    (tmp_path / "empty").mkdir()
    model, message = (text.format(tmp=tmp_path) for text in NOT_RELEASES[case])
    places = {"model": model, "request": write(tmp_path, MIXED_REQUEST), "tmp": tmp_path}
    for command, args in COMMANDS_WITH_A_RELEASE.items():
        line = assert_user_error(invoke(runner, cli_app, *(arg.format(**places) for arg in args)), "")
        assert line == f"error: {message}", command
    script = Path(sys.executable).with_name("clef-systemone")
    proc = subprocess.run([str(script), "--model", model], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {message}\n")
    with pytest.raises(CheckpointError) as info:
        ClefEngine(model)
    assert str(info.value) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "request.json"]


@pytest.mark.parametrize("command", ["encode", "score"])
def test_schema_too_long(runner, cli_app, tiny_dir, tmp_path, command):
    path = write(tmp_path, MIXED_REQUEST)
    result = invoke(runner, cli_app, command, "--model", tiny_dir, "--max-model-len", 10, path)
    assert_user_error(result, r"^error: schema requires \d+ tokens before state; maximum is 10$")


@pytest.mark.parametrize("command", ["encode", "score"])
def test_bad_image_is_one_error_line(runner, cli_app, tiny_dir, tmp_path, command):
    request = dict(MIXED_REQUEST, images=["definitely not base64!"])
    result = invoke(runner, cli_app, command, "--model", tiny_dir, write(tmp_path, request))
    assert_user_error(result, r"images\[0\]")


def test_installed_script_prints_no_traceback(tiny_dir, tmp_path):
    """One case through the real console script: the tokenizer is loaded, the encoder refuses, no traceback."""
    script = Path(sys.executable).with_name("clef-quant")
    assert script.exists(), script
    env = {k: v for k, v in os.environ.items() if k != "CLEF_QUANT_DEBUG"}
    path = write(tmp_path, MIXED_REQUEST)
    proc = subprocess.run(
        [str(script), "encode", "--model", str(tiny_dir), "--max-model-len", "10", path],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert re.fullmatch(r"error: schema requires \d+ tokens before state; maximum is 10\n", proc.stderr), proc.stderr


# --- score -------------------------------------------------------------------------------------------------


def check_answer(question: dict, answer: dict) -> None:
    """A valid SystemOne answer for `question`, per clef-format.md's "The answer"."""
    assert answer["type"] == question["type"]
    if question["type"] == "noul":
        assert set(answer) == {"type", "noul"}
        assert 0.0 <= answer["noul"] <= 1.0
        assert round(answer["noul"], 4) == answer["noul"]
        return
    probabilities = answer["probabilities"]
    values = list(probabilities.values())
    assert all(0.0 <= p <= 1.0 and round(p, 4) == p for p in values)
    assert abs(sum(values) - 1.0) <= 5e-5 * len(values) + 1e-9
    assert answer["confidence"] == max(values)
    if question["type"] == "choice":
        assert set(answer) == {"type", "choice", "confidence", "probabilities"}
        assert list(probabilities) == list(question["criteria"])  # the request's order
        assert abs(sum(values) - 1.0) <= 4e-4
        assert answer["choice"] in probabilities
        assert probabilities[answer["choice"]] == max(values)
        return
    levels = question["criteria"]
    assert set(answer) == {"type", "score", "confidence", "legend", "probabilities"}
    assert list(probabilities) == [str(i) for i in range(len(levels))]
    assert answer["legend"] == {str(i): level for i, level in enumerate(levels)}
    expectation = sum(i * p for i, p in enumerate(values))
    assert abs(answer["score"] - expectation) <= 5e-5 * sum(range(len(levels))) + 5e-5 + 1e-9
    assert 0.0 <= answer["score"] <= len(levels) - 1
    assert round(answer["score"], 4) == answer["score"]


def score_json(runner, app, tiny_dir, path, *extra):
    result = invoke(runner, app, "score", "--model", tiny_dir, *extra, path)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def test_score_mixed_request(runner, cli_app, tiny_dir, tmp_path):
    path = write(tmp_path, MIXED_REQUEST)
    response = score_json(runner, cli_app, tiny_dir, path)
    assert set(response) == {"model", "answers", "usage"}
    assert response["model"] == "clef-tiny"
    assert list(response["answers"]) == list(MIXED_REQUEST["questions"])
    for qid, question in MIXED_REQUEST["questions"].items():
        check_answer(question, response["answers"][qid])
    encoded = json.loads(invoke(runner, cli_app, "encode", "--model", tiny_dir, path).stdout)
    assert response["usage"] == {"input_tokens": encoded["num_tokens"], "output_tokens": 0}


@pytest.mark.parametrize(
    "question",
    [
        pytest.param({"type": "noul", "criteria": {"true": "It is spam.", "other": "ignored"}}, id="noul"),
        pytest.param(
            {"type": "choice", "criteria": {"zebra": "Z", "2": "two", "apple": None, "10": {"n": 10}}},
            id="choice",
        ),
        pytest.param(
            {"type": "score", "instructions": ["rate", 1], "criteria": [0, "one", {"x": 2}, None]}, id="score"
        ),
    ],
)
def test_score_each_question_type(runner, cli_app, tiny_dir, tmp_path, question):
    request = {"model": "tiny/any-name", "state": "Buy cheap watches now!!!", "questions": {"q": question}}
    path = write(tmp_path, request)
    response = score_json(runner, cli_app, tiny_dir, path)
    assert response["model"] == "tiny/any-name"
    check_answer(question, response["answers"]["q"])
    encoded = json.loads(invoke(runner, cli_app, "encode", "--model", tiny_dir, path).stdout)
    assert response["usage"] == {"input_tokens": encoded["num_tokens"], "output_tokens": 0}


def test_score_truncated_state_counts_max_length(runner, cli_app, tiny_dir, tmp_path):
    path = write(tmp_path, MIXED_REQUEST)
    full = json.loads(invoke(runner, cli_app, "encode", "--model", tiny_dir, path).stdout)
    max_length = full["num_tokens"] - 5
    response = score_json(runner, cli_app, tiny_dir, path, "--max-model-len", max_length)
    assert response["usage"]["input_tokens"] == max_length
    for qid, question in MIXED_REQUEST["questions"].items():
        check_answer(question, response["answers"][qid])


def test_score_rejects_bad_options(runner, cli_app, tiny_dir, tmp_path):
    path = write(tmp_path, MIXED_REQUEST)
    assert_user_error(invoke(runner, cli_app, "score", "--model", tiny_dir, "--dtype", "int8", path), r"--dtype")
    assert_user_error(invoke(runner, cli_app, "score", "--model", tiny_dir, "--device", "tpu", path), r"--device")


# --- every refusal of every command: one line, exit 2, nothing written ---------------------------------------

DEEP_REQUEST = '{"model": "m", "questions": {"q": {"type": "noul"}}, "state": ' + "[" * 5000 + "]" * 5000 + "}"
NOT_UTF8_REQUEST = b'{"model": "m\xff", "state": 1, "questions": {"q": {"type": "noul"}}}'

# Each case's arguments name its places by key: {file} is a regular file, {other} a folder of something else,
# {tiny} the tiny release, {tmp} the test's own folder, {deep} and {not_utf8} request files.
REFUSALS = [
    pytest.param(["make-tiny", "{file}/x"], r"cannot write .*/x: .*file is not a folder", id="make-tiny-under-file"),
    pytest.param(
        ["build-data", "--out", "{file}/x", "--source", "fixtures"], r"file is not a folder", id="build-data-under-file"
    ),
    pytest.param(
        ["quantize", "{tiny}", "--scheme", "fp8-dynamic", "--out", "{file}/x"],
        r"file is not a folder",
        id="quantize-under-file",
    ),
    pytest.param(["scan", "{tiny}", "--out", "{file}/x"], r"file is not a folder", id="scan-under-file"),
    pytest.param(["scan", "{tiny}", "--out", "{file}"], r"file is not a folder", id="scan-out-is-file"),
    pytest.param(["make-tiny", "/proc/clef-x"], r"cannot create a folder in /proc", id="make-tiny-in-proc"),
    pytest.param(["build-data", "--out", "/proc/clef-x", "--source", "fixtures"], r"in /proc", id="build-data-in-proc"),
    pytest.param(
        ["quantize", "{tiny}", "--scheme", "fp8-dynamic", "--out", "/proc/clef-x"], r"in /proc", id="quantize-in-proc"
    ),
    pytest.param(["scan", "{tiny}", "--out", "/proc/clef-x"], r"in /proc", id="scan-in-proc"),
    pytest.param(["encode", "--model", "{tiny}", "{not_utf8}"], r"not_utf8\.json is not valid UTF-8", id="encode-utf8"),
    pytest.param(["score", "--model", "{tiny}", "{not_utf8}"], r"not_utf8\.json is not valid UTF-8", id="score-utf8"),
    pytest.param(
        ["encode", "--model", "{tiny}", "{deep}"], r"deep\.json: state.*nested more than 64", id="encode-deep"
    ),
    pytest.param(["score", "--model", "{tiny}", "{deep}"], r"deep\.json: state.*nested more than 64", id="score-deep"),
    pytest.param(["make-tiny", "{tmp}/t", "--seed", "abc"], r"Invalid value for '--seed'", id="seed-abc"),
    pytest.param(
        ["encode", "--model", "{tiny}", "--max-model-len", "0", "{deep}"], r"'--max-model-len'", id="max-model-len-0"
    ),
    pytest.param(["build-data", "--out", "{tmp}/d", "--per-task", "0"], r"'--per-task'", id="per-task-0"),
    pytest.param(
        ["eval", "--max-model-len", "0", "--reference", "{tiny}", "--candidate", "{tiny}", "--data", "{tmp}"],
        r"'--max-model-len'",
        id="eval-max-model-len-0",
    ),
    pytest.param(["no-such-command"], r"No such command 'no-such-command'", id="unknown-command"),
    pytest.param(["bench", "no-such-command"], r"No such command", id="unknown-bench-command"),
    pytest.param(
        ["bench", "latency", "--release", "{tiny}", "--out", "{file}/r.md"],
        r"cannot write .*/r\.md: .*file is not a folder",
        id="bench-latency-under-file",
    ),
    pytest.param(["make-tiny"], r"Missing argument 'DIR'", id="missing-argument"),
    pytest.param(
        ["make-tiny", "{file}", "--overwrite"],
        r"file is not a folder; --overwrite replaces only a folder make-tiny wrote",
        id="make-tiny-overwrite-file",
    ),
    pytest.param(
        ["make-tiny", "{other}", "--overwrite"],
        r"other is not a folder make-tiny wrote \(its README\.md has no make-tiny mark\)",
        id="make-tiny-overwrite-other",
    ),
    pytest.param(
        ["quantize", "{tiny}", "--scheme", "fp8-dynamic", "--out", "{file}", "--overwrite"],
        r"file is not a folder; --overwrite replaces only a quantized release",
        id="quantize-overwrite-file",
    ),
    pytest.param(
        ["quantize", "{tiny}", "--scheme", "fp8-dynamic", "--out", "{other}", "--overwrite"],
        r"other is not a quantized release \(it has no clef_quant\.json\)",
        id="quantize-overwrite-other",
    ),
    pytest.param(
        ["build-data", "--out", "{file}", "--source", "fixtures", "--overwrite"],
        r"file is not a folder; --overwrite replaces only a DATA folder",
        id="build-data-overwrite-file",
    ),
    pytest.param(
        ["build-data", "--out", "{other}", "--source", "fixtures", "--overwrite"],
        r"other is not a DATA folder \(it has no summary\.json\)",
        id="build-data-overwrite-other",
    ),
]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


@pytest.mark.parametrize(("args", "pattern"), REFUSALS)
def test_every_refusal_is_one_error_line_and_writes_nothing(runner, cli_app, tiny_dir, tmp_path, args, pattern):
    (tmp_path / "file").write_text("a user's file\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("a user's notes\n")
    (tmp_path / "deep.json").write_text(DEEP_REQUEST)
    (tmp_path / "not_utf8.json").write_bytes(NOT_UTF8_REQUEST)
    places = {"file": tmp_path / "file", "other": tmp_path / "other", "tiny": tiny_dir, "tmp": tmp_path}
    places |= {"deep": tmp_path / "deep.json", "not_utf8": tmp_path / "not_utf8.json"}
    before, release_before = snapshot(tmp_path), snapshot(tiny_dir)

    result = runner.invoke(cli_app, [arg.format(**places) for arg in args])

    assert_user_error(result, pattern)
    assert snapshot(tmp_path) == before  # no .partial, no probe folder, the user's file and folder untouched
    assert snapshot(tiny_dir) == release_before
    assert not Path("/proc/clef-x").exists()


def test_a_refusal_of_the_parser_is_one_line_from_the_installed_script(tmp_path):
    """Typer draws its refusals in a boxed panel; the console script prints our one line instead."""
    script = Path(sys.executable).with_name("clef-quant")
    env = {k: v for k, v in os.environ.items() if k != "CLEF_QUANT_DEBUG"}
    proc = subprocess.run(
        [str(script), "make-tiny", str(tmp_path / "t"), "--seed", "abc"], capture_output=True, text=True, env=env
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert re.fullmatch(r"error: Invalid value for '--seed': [^\n]*\n", proc.stderr), proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_clef_systemone_refuses_a_non_finite_flag(value):
    script = Path(sys.executable).with_name("clef-systemone")
    proc = subprocess.run(
        [str(script), "--model", "unused", "--max-body-mb", value], capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: argument --max-body-mb: '{value}' is not a finite number\n"


def test_overwrite_replaces_a_folder_of_the_same_kind(runner, cli_app, tmp_path):
    out = tmp_path / "tiny"
    assert invoke(runner, cli_app, "make-tiny", out).exit_code == 0
    (out / "stale.txt").write_text("from before")
    result = invoke(runner, cli_app, "make-tiny", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
