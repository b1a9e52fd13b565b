"""`clef-quant bench modes`, `latency` and `workloads` refuse what they cannot use before any engine starts: a report
they cannot write, a report whose JSON would overwrite it, a saved report `--append` cannot read, an engine argument
the servers they start would refuse. Each refusal is one `error:` line and exit status 2."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_quant.bench import processes
from clef_quant.bench.errors import BenchError
from clef_quant.bench.modes import MODES, ModesResult, read_result
from clef_quant.bench.modes_options import release_and_modes
from clef_quant.bench.processes import running
from clef_quant.cli import app
from clef_vllm.errors import SettingsError
from clef_vllm.server.settings import ServeConfig


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)


@pytest.fixture(autouse=True)
def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything that gets as far as an engine, a server or the workloads has missed its refusal."""
    import clef_quant.bench.flide_workloads
    import clef_vllm.engine

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the refusal")

    monkeypatch.setattr(clef_vllm.engine.ClefEngine, "_start", started)  # both ways in, from_settings too
    monkeypatch.setattr(clef_quant.bench.flide_workloads, "flide_workloads", started)
    monkeypatch.setattr(processes, "running", started)


COMMANDS = {
    "modes": ["bench", "modes", "--release", "{tiny}"],
    "latency": ["bench", "latency", "--release", "{tiny}"],
    "workloads": ["bench", "workloads", "--model", "{tiny}"],
}
WITH_JSON = ("modes", "latency")  # the commands that write a JSON beside their markdown report
# Each case: the --out given, what the error line starts with ({tmp}: the test's folder), the commands it applies to.
UNWRITABLE = [
    ("folder", "{tmp}/folder", "cannot write {tmp}/folder: it is a folder", tuple(COMMANDS)),
    ("dev-full", "/dev/full", "cannot write /dev/full: it is not a regular file", tuple(COMMANDS)),
    ("proc", "/proc/clef-x/r.md", "cannot write /proc/clef-x/r.md: cannot create a folder in /proc", tuple(COMMANDS)),
    ("json-folder", "{tmp}/sibling.md", "cannot write {tmp}/sibling.json: it is a folder", WITH_JSON),
    ("out-json", "{tmp}/r.json", "--out {tmp}/r.json names the markdown report", WITH_JSON),
]


def refused(args: list[str], tmp_path: Path, tiny: Path) -> str:
    """The one line a refused command printed (after checking it refused as every command does)."""
    result = CliRunner().invoke(app, [arg.format(tmp=tmp_path, tiny=tiny) for arg in args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    error, *hints = result.stderr.splitlines()
    assert error.startswith("error: ") and all(hint.startswith("hint: ") for hint in hints), result.stderr
    return error.removeprefix("error: ")


@pytest.mark.parametrize(
    ("command", "out", "line"),
    [
        pytest.param(command, out, line, id=f"{command}-{case}")
        for case, out, line, commands in UNWRITABLE
        for command in commands
    ],
)
def test_a_report_that_cannot_be_written_is_refused_before_any_work(
    tiny_dir: Path, tmp_path: Path, command: str, out: str, line: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "sibling.json").mkdir()

    error = refused([*COMMANDS[command], "--out", out], tmp_path, tiny_dir)

    assert error.startswith(line.format(tmp=tmp_path))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder", "sibling.json"]  # nothing written
    assert not any((tmp_path / "sibling.json").iterdir())


def test_a_report_that_can_be_written_passes_the_check(tiny_dir: Path, tmp_path: Path) -> None:
    """The same check lets a writable place through: the command goes on until the first work (stopped here)."""
    (tmp_path / "r.md").write_text("an earlier report", encoding="utf-8")  # rewritten by a run, not refused
    result = CliRunner().invoke(app, ["bench", "latency", "--release", str(tiny_dir), "--out", str(tmp_path / "r.md")])
    assert isinstance(result.exception, AssertionError) and "work started" in str(result.exception)
    assert (tmp_path / "r.md").read_text(encoding="utf-8") == "an earlier report"


def saved_report(**changes: object) -> str:
    result = ModesResult(machine="m", versions="v", command="c", records=8, tokens=1, questions=3, max_model_len=4096)
    return json.dumps({**asdict(result), **changes})


@pytest.mark.parametrize(
    ("saved", "line"),
    [
        pytest.param("{", "is not valid JSON: Expecting property name", id="corrupt"),
        pytest.param(b'{"machine": "\xff"}', "is not valid UTF-8 at byte 13", id="not-utf8"),
        pytest.param("[1, 2]", "is not a report of bench modes: its top level is not a JSON object", id="list"),
        pytest.param(
            json.dumps({"machine": "m", "repeats": 2, "releases": []}),
            "is not a report of bench modes: ",
            id="foreign",
        ),
        pytest.param(saved_report(runs=[{"release": "r"}]), "is not a report of bench modes: runs.0.", id="bad-run"),
        pytest.param(saved_report(records=9), "--append: {json} measured another machine and records", id="other"),
    ],
)
def test_append_refuses_a_saved_report_it_cannot_read_naming_the_file(
    tiny_dir: Path, tmp_path: Path, saved: str | bytes, line: str
) -> None:
    saved_json = tmp_path / "modes.json"
    if isinstance(saved, bytes):
        saved_json.write_bytes(saved)
    else:
        saved_json.write_text(saved, encoding="utf-8")
    args = ["bench", "modes", "--release", "{tiny}@invariant", "--records", "8", "--append"]

    error = refused([*args, "--out", "{tmp}/modes.md"], tmp_path, tiny_dir)

    if line.startswith("--append"):
        assert error.startswith(line.format(json=saved_json))
    else:
        assert error.startswith(f"{saved_json} {line}")
    assert not (tmp_path / "modes.md").exists()


# The reports `bench modes` wrote (the table of docs/benchmarks.md): what --append must go on reading.
MODES_REPORTS = sorted(Path(__file__).parent.parent.glob("bench/results/serve-h200*.json"))


@pytest.mark.parametrize("saved", MODES_REPORTS, ids=[path.name for path in MODES_REPORTS])
def test_the_reports_bench_modes_wrote_are_read_by_append(saved: Path) -> None:
    result = read_result(saved)
    assert result.runs and all(run.scheme and run.mode for run in result.runs)


@pytest.mark.parametrize(
    ("given", "expected", "modes"),
    [
        pytest.param("{tmp}/a@b/flash", "{tmp}/a@b/flash", ["invariant"], id="at-inside-a-path"),
        pytest.param("{tmp}/x@batched", "{tmp}/x@batched", ["invariant"], id="folder-named-like-a-mode"),
        pytest.param("{tmp}/r@batched,one-per-step", "{tmp}/r", ["batched", "one-per-step"], id="trailing-modes"),
        pytest.param("{tmp}/gone@b/flash", "{tmp}/gone@b/flash", ["invariant"], id="missing-path"),
        pytest.param("@batched", "@batched", ["invariant"], id="no-folder"),
    ],
)
def test_only_a_trailing_at_with_known_modes_splits_a_release(
    tmp_path: Path, given: str, expected: str, modes: list[str]
) -> None:
    for folder in ("a@b/flash", "x@batched", "r"):
        (tmp_path / folder).mkdir(parents=True)

    folder, chosen = release_and_modes(given.format(tmp=tmp_path), [MODES["invariant"]])

    assert folder == Path(expected.format(tmp=tmp_path))
    assert [mode.name for mode in chosen] == modes


def test_a_mode_name_that_is_no_mode_after_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="unknown mode 'invarant'; choose from invariant, "):
        release_and_modes(f"{tmp_path}@invariant,invarant", [MODES["invariant"]])


def test_a_release_folder_whose_path_holds_an_at_is_read_as_a_folder(tiny_dir: Path, tmp_path: Path) -> None:
    release = tmp_path / "a@b" / "flash"
    release.parent.mkdir()
    release.symlink_to(tiny_dir)
    # The release is read as bf16 and then checked further: the profile names a mode it does not run in.
    args = ["bench", "modes", "--release", str(release), "--profile", "bf16:one-per-step", "--out", "{tmp}/m.md"]

    assert refused(args, tmp_path, tiny_dir).startswith("--profile bf16:one-per-step: name one of the releases (bf16)")


# Engine arguments vLLM knows that clef-systemone refuses (it has a flag of its own for them), while an engine alone
# would take them: a benchmark that starts the server with them must refuse them before its engines run.
SERVER_REFUSES = ["max_num_seqs=2", "served_model_name=clef", "max_num_batched_tokens=8192"]


@pytest.mark.parametrize("engine_arg", SERVER_REFUSES)
@pytest.mark.parametrize(
    "command",
    [
        ["bench", "modes", "--release", "{tiny}@invariant", "--serve", "bf16", "--out", "{tmp}/m.md"],
        ["bench", "modes", "--release", "{tiny}@invariant", "--out", "{tmp}/m.md"],
        ["bench", "serve", "--model", "{tiny}", "--out", "{tmp}/s.md"],
    ],
    ids=["modes-serve", "modes", "serve"],
)
def test_engine_arguments_are_checked_as_clef_systemone_checks_them(
    tiny_dir: Path, tmp_path: Path, command: list[str], engine_arg: str
) -> None:
    with pytest.raises(SettingsError) as server:
        ServeConfig(model=str(tiny_dir), engine_arg=(engine_arg,)).engine_overrides()

    assert refused([*command, "--engine-arg", engine_arg], tmp_path, tiny_dir) == str(server.value)
    assert list(tmp_path.iterdir()) == []


def test_pieces_of_prompts_are_refused_outside_the_long_inputs_run(tiny_dir: Path, tmp_path: Path) -> None:
    command = ["bench", "serve", "--model", "{tiny}", "--prompt-chunk", "1024", "--out", "{tmp}/s.md"]
    assert refused(command, tmp_path, tiny_dir).startswith("--prompt-chunk applies to --long-inputs")
    assert list(tmp_path.iterdir()) == []


def exits(reason: str) -> list[str]:
    """A server that says why it will not start, the way clef-systemone refuses its flags, and exits."""
    script = f"import sys; print('starting'); print({reason!r}, file=sys.stderr); sys.exit(2)"
    return [sys.executable, "-c", script]


def test_a_server_that_exits_by_itself_is_reported_by_its_own_reason(tmp_path: Path) -> None:
    """The group of a server that is gone is not there to signal; its last `error:` line is the reason shown."""
    server = exits("error: --engine-arg x: no such thing")
    with pytest.raises(processes.ServerExited) as exited, running(server, processes.free_port(), tmp_path / "log"):
        pass

    assert str(exited.value) == f"{Path(sys.executable).name} exited with status 2: --engine-arg x: no such thing"
    assert exited.value.status == 2 and "starting" in exited.value.log_tail


def test_bench_modes_shows_the_reason_a_server_exited_with(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import clef_quant.bench.modes

    def run_modes(*args: object, **kwargs: object) -> None:  # the offline runs done, the server does not start
        with running(exits("error: --port: in use"), processes.free_port(), tmp_path / "server.log"):
            pass

    monkeypatch.setattr(clef_quant.bench.modes, "run_modes", run_modes)
    out = tmp_path / "m.md"
    result = CliRunner().invoke(app, ["bench", "modes", "--release", f"{tiny_dir}@invariant", "--out", str(out)])

    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr.splitlines()[-1].endswith(" exited with status 2: --port: in use")
    assert out.is_file() and out.with_suffix(".json").is_file()  # what was measured until then is kept
