"""The options every command shares (`--device`, `--scheme`, `--size`, `--dtype`, `--repo-id`) are checked in one
place: a bad value is refused before anything loads, in one `error:` line that says what is accepted, exit 2."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.devices import device_problem
from clef_quant.formatting import binary_size, count, decimal_size, first_few
from clef_quant.tiny.sizes import SIZES

REPO = Path(__file__).resolve().parents[1]
CLI_DIR = REPO / "clef_quant" / "cli"


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)


def refused(args: list[str]) -> str:
    """Run the CLI; it must refuse with exactly one `error:` line on stderr, nothing on stdout, exit 2."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def commands_with_device(tmp_path: Path) -> dict[str, list[str]]:
    data = tmp_path / "data"
    return {
        "quantize": ["quantize", tmp_path, "--out", tmp_path / "out", "--scheme", "fp8-dynamic"],
        "scan": ["scan", tmp_path, "--out", tmp_path / "scan"],
        "make-tiny": ["make-tiny", tmp_path / "tiny"],
        "eval": ["eval", "--reference", tmp_path, "--candidate", tmp_path, "--data", data, "--out", tmp_path / "r"],
        "score": ["score", "--model", tmp_path, tmp_path / "request.json"],
        "bench head": ["bench", "head"],
        "bench throughput": ["bench", "throughput", "--reference", tmp_path, "--data", data],
    }


@pytest.mark.parametrize("device", ["cuda:x", "tpu", "cuda:", "CPU", "cuda:0:1"])
@pytest.mark.parametrize(
    "command", ["quantize", "scan", "make-tiny", "eval", "score", "bench head", "bench throughput"]
)
def test_a_malformed_device_is_one_line_everywhere(tmp_path: Path, command: str, device: str) -> None:
    line = refused([*commands_with_device(tmp_path)[command], "--device", device])
    assert line == f"error: --device must be cpu or cuda[:N], not {device!r}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "tiny").exists()


def test_device_names_follow_torch() -> None:
    assert device_problem("cpu") is None
    for bad in ("gpu", "cuda:-1", "cuda:1x", " cpu"):
        assert device_problem(bad) == f"--device must be cpu or cuda[:N], not {bad!r}"


def test_a_cuda_device_this_machine_lacks_is_refused() -> None:
    import torch

    if torch.cuda.is_available():
        beyond = f"cuda:{torch.cuda.device_count()}"
        assert "CUDA device(s)" in (device_problem(beyond) or "")
        assert device_problem("cuda:0") is None
    else:
        assert device_problem("cuda:0") == "--device cuda:0 was given, but no CUDA device is available"


@pytest.mark.parametrize(
    "args",
    [
        ["quantize", "SRC", "--out", "OUT", "--scheme", "int3"],
        ["bench", "quantize", "--model", "SRC", "--work", "W", "--scheme", "int3"],
    ],
)
def test_an_unknown_scheme_lists_every_scheme(args: list[str]) -> None:
    # Expected from the recipe files themselves, in their `order`, not from the registry under test.
    choices = [name for name, _ in sorted(recipe_files().items(), key=lambda item: item[1]["order"])]
    line = refused(args)
    assert line == f"error: unknown scheme 'int3'; choose one of {', '.join([*choices, 'auto'])}"


def test_scan_names_the_schemes_it_can_scan() -> None:
    scannable = sorted((f for f in recipe_files().values() if f.get("scan")), key=lambda f: f["scan"]["order"])
    line = refused(["scan", "SRC", "--out", "OUT", "--scheme", "nvfp4", "--scheme", "nvfp4-awq"])
    assert line == f"error: cannot scan nvfp4-awq; choose one of {', '.join(f['name'] for f in scannable)}"


def recipe_files() -> dict[str, dict]:
    """Each file of recipes/ by the scheme name its front matter gives, read as plain YAML."""
    found = {}
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        front = yaml.safe_load(path.read_text().split("\n---\n", 1)[0])["clef"]
        found[front["name"]] = front
    return found


def test_every_recipe_file_is_a_scheme_the_cli_accepts(tmp_path: Path) -> None:
    names = recipe_files()
    assert len(names) == len(list((REPO / "recipes").glob("*.yaml")))  # one scheme per file, none named twice
    shown = CliRunner().invoke(app, ["quantize", "--help"], env={"COLUMNS": "1000"}).output
    for name in names:
        assert f" {name}," in shown or f" {name}." in shown, name
        # Accepted: the run gets past the scheme and stops at the missing source.
        line = refused(["quantize", tmp_path / "missing", "--out", tmp_path / "out", "--scheme", name])
        assert "does not exist" in line, (name, line)


def docs_scheme_table() -> dict[str, dict[str, str]]:
    """The scheme table of the quantize page (docs/quantize.md), by scheme name."""
    text = (REPO / "docs" / "quantize.md").read_text()
    lines = text[text.index("| scheme | stores |") :].splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        rows[cells["scheme"].strip("`")] = cells
    return rows


def test_the_docs_scheme_table_lists_every_recipe_file_as_it_is() -> None:
    table, files = docs_scheme_table(), recipe_files()
    assert sorted(table) == sorted(files)
    for name, front in files.items():
        row = table[name]
        assert row["stores"] == " + ".join(front["labels"]), name
        assert row["calibration"] == ("yes" if front["calibration"] else "no"), name
        assert row["streams"] == ("yes" if front.get("streaming") else "no"), name
        scan = front.get("scan")
        assert row["scan"] == ("no" if scan is None else "default" if scan.get("default") else "yes"), name


def test_an_unknown_size_lists_the_sizes(tmp_path: Path) -> None:
    line = refused(["make-tiny", tmp_path / "t", "--size", "huge"])
    assert line == f"error: unknown size 'huge'; choose one of {', '.join(SIZES)}"
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("command", [["bench", "head"], ["score", "--model", "M", "R.json"]])
def test_an_unknown_dtype_lists_the_dtypes(command: list[str]) -> None:
    assert refused([*command, "--dtype", "int8"]) == "error: --dtype cannot be 'int8'; choose one of bfloat16, float32"


@pytest.mark.parametrize("command", ["card", "upload"])
def test_a_bad_repo_id_is_refused_before_the_folder_is_read(tmp_path: Path, command: str) -> None:
    args = [command, tmp_path / "missing", "--repo-id", "no-slash"]
    if command == "card":
        args += ["--results", tmp_path]
    assert refused(args) == "error: --repo-id must be ORG/NAME, not 'no-slash'"


def test_help_lists_the_choices() -> None:
    text = CliRunner().invoke(app, ["make-tiny", "--help"]).stdout
    words = " ".join(text.replace("│", " ").split())  # the help panel wraps and frames its lines
    assert "One of tiny, small, flash, clef, clef-tiny, omni, omni-tiny." in words


HEAVY_LIBRARIES = ("torch", "transformers", "compressed_tensors", "llmcompressor", "vllm", "safetensors")


def test_the_cli_and_every_help_load_no_heavy_library() -> None:
    """`clef-quant --help` and `clef-quant COMMAND --help` answer in about a second: the ML libraries (seconds to
    import) load inside the commands that use them. A fresh process, since this one has them loaded already."""
    script = f"""
import sys, clef_quant.cli
from typer.main import get_command
from typer.testing import CliRunner

def paths(command, path):
    yield path
    for name, sub in getattr(command, "commands", {{}}).items():
        yield from paths(sub, [*path, name])

for path in paths(get_command(clef_quant.cli.app), []):
    shown = CliRunner().invoke(clef_quant.cli.app, [*path, "--help"])
    assert shown.exit_code == 0 and "Usage" in shown.stdout, (path, shown.output)
print(" ".join(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_numbers_read_alike_everywhere() -> None:
    assert [binary_size(n) for n in (None, 512, 1536, 5 * 2**20, 3 * 2**30, 2**41)] == [
        "",
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "2048.0 GiB",
    ]
    assert [decimal_size(n) for n in (999, 4_500_000, 19_000_000_000)] == ["999 B", "4.5 MB", "19.0 GB"]
    assert [count(n) for n in (950, 2_180_000, 9_530_000_000)] == ["950", "2.18 M", "9.53 B"]


def test_long_problem_lists_are_cut_with_a_count() -> None:
    assert first_few(["a", "b"], 3) == "a; b"
    assert first_few(["a", "b", "c", "d", "e"], 3) == "a; b; c (and 2 more)"
    assert first_few(["x", "y", "z"], 1, separator=", ") == "x (and 2 more)"


def test_only_the_output_module_makes_a_results_console() -> None:
    """Tables go through results_console (full width into files and pipes); bars through the stderr module."""
    allowed = {"_output.py", "_stderr.py"}
    for path in CLI_DIR.glob("*.py"):
        if path.name in allowed:
            continue
        calls = [
            node
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Console"
        ]
        assert not calls, f"{path.name} builds its own rich Console"


def test_bench_quantize_reports_each_scheme(tiny_dir: Path, tmp_path: Path) -> None:
    """`clef-quant bench quantize` quantizes through the benchmarks' one quantize call and writes both reports."""
    out = tmp_path / "quality.md"
    args = ["bench", "quantize", "--model", tiny_dir, "--work", tmp_path / "work", "--scheme", "fp8-dynamic"]
    result = CliRunner().invoke(app, [str(a) for a in [*args, "--out", out]])
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {out}" in result.stdout
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["scheme"] == "fp8-dynamic" and 0 < row["backbone_bytes"] < row["source_bytes"]
    assert (tmp_path / "work" / f"{tiny_dir.name}-fp8-dynamic" / "clef_quant.json").is_file()
    assert "| fp8-dynamic |" in out.read_text()


def parsed_options(path: list[str], args: list[str]) -> dict:
    """The values the options of command `path` get from `args`, parsed as `clef-quant PATH ARGS` parses them."""
    import click
    import typer.main

    command = typer.main.get_command(app)
    context = click.Context(command, info_name="clef-quant", **command.context_settings)
    for name in path[:-1]:
        command = command.get_command(context, name)
        context = click.Context(command, info_name=name, parent=context)
    leaf = command.get_command(context, path[-1])
    return leaf.make_context(path[-1], list(args), parent=context).params


def help_words(command: list[str]) -> str:
    return " ".join(CliRunner().invoke(app, [*command, "--help"]).stdout.replace("│", " ").split())


ENGINE_COMMANDS = {
    "eval": ["--reference", "R", "--candidate", "C", "--data", "D", "--out", "O"],
    "bench throughput": ["--reference", "R", "--data", "D"],
}


@pytest.mark.parametrize("command", sorted(ENGINE_COMMANDS))
@pytest.mark.parametrize(("given", "value"), [("--enforce-eager", True), ("--eager", True), ("--no-eager", False)])
def test_enforce_eager_keeps_its_old_name_hidden(command: str, given: str, value: bool) -> None:
    assert parsed_options(command.split(), [*ENGINE_COMMANDS[command], given])["enforce_eager"] is value
    words = help_words(command.split())
    assert "--enforce-eager" in words
    assert "--eager" not in words.replace("--enforce-eager", "").replace("--no-enforce-eager", "")


@pytest.mark.parametrize("command", ["encode", "score"])
@pytest.mark.parametrize("given", [["--max-model-len", "300"], ["--max-length", "300"], ["--max-length=300"]])
def test_max_model_len_keeps_its_old_name_hidden(command: str, given: list[str]) -> None:
    assert parsed_options([command], ["--model", "M", "R.json", *given])["max_model_len"] == 300
    words = help_words([command])
    assert "--max-model-len" in words and "--max-length" not in words


def test_the_old_max_length_name_still_cuts_the_state(tiny_dir: Path, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"state": "word " * 400, "questions": {"q": {"type": "noul"}}}))
    outputs = []
    for name in ("--max-length", "--max-model-len"):
        result = CliRunner().invoke(app, ["encode", "--model", str(tiny_dir), name, "300", str(request)])
        assert result.exit_code == 0, (result.output, result.exception)
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1]
    assert outputs[0]["max_length"] == 300 and outputs[0]["num_tokens"] == 300


def test_calibration_length_is_its_own_option() -> None:
    """--max-seq-len (how much of a calibration record the quantizer sees) is not the engine's --max-model-len:
    quantize and scan take only the first, and bench quantize, which also evaluates, keeps both apart."""
    for command in ("quantize", "scan"):
        args = CALIBRATION_COMMANDS[command][1:]
        assert parsed_options([command], [*args, "--max-seq-len", "64"])["max_seq_len"] == 64
        line = refused([command, *args, "--max-model-len", "64"])
        assert line.startswith("error: ") and "--max-model-len" in line
    both = parsed_options(
        ["bench", "quantize"], ["--model", "M", "--work", "W", "--max-seq-len", "64", "--max-model-len", "512"]
    )
    assert (both["max_seq_len"], both["max_model_len"]) == (64, 512)


# Every command that takes --max-model-len, with the arguments it needs besides it.
MAX_MODEL_LEN_COMMANDS = {
    "encode": ["--model", "M", "R.json"],
    "score": ["--model", "M", "R.json"],
    "eval": ENGINE_COMMANDS["eval"],
    "bench throughput": ENGINE_COMMANDS["bench throughput"],
    "bench serve": ["--model", "M"],
    "bench quantize": ["--model", "M", "--work", "W"],
    "bench modes": ["--release", "R"],
    "bench latency": ["--release", "R", "--out", "O"],
}


@pytest.mark.parametrize("command", sorted(MAX_MODEL_LEN_COMMANDS))
def test_max_model_len_has_one_bound_everywhere(command: str) -> None:
    """At least 1 in every command, as in clef-systemone: the shortest length one accepts, every other accepts."""
    assert (
        parsed_options(command.split(), [*MAX_MODEL_LEN_COMMANDS[command], "--max-model-len", "1"])["max_model_len"]
        == 1
    )
    line = refused([*command.split(), *MAX_MODEL_LEN_COMMANDS[command], "--max-model-len", "0"])
    assert "--max-model-len" in line and "greater than or equal to 1" in line


CALIBRATION_COMMANDS = {
    "quantize": ["quantize", "SRC", "--out", "OUT", "--scheme", "nvfp4"],
    "scan": ["scan", "SRC", "--out", "OUT"],
    "bench quantize": ["bench", "quantize", "--model", "M", "--work", "W"],
    "bench quantize-vs-plain": ["bench", "quantize-vs-plain", "--model", "M", "--work", "W"],
}


@pytest.mark.parametrize("command", sorted(CALIBRATION_COMMANDS))
@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["--calibration-records", "0"], "error: --calibration-records must be at least 1"),
        (["--max-seq-len", "0"], "error: --max-seq-len must be at least 1"),
        (["--max-seq-len", "2k"], "error: --max-seq-len must be a whole number, not '2k'"),
    ],
)
def test_calibration_counts_are_refused_alike_everywhere(command: str, given: list[str], line: str) -> None:
    """The library's own check: `quantize`'s and `scan`'s Python callers are refused in the same words."""
    assert refused([*CALIBRATION_COMMANDS[command], *given]) == line


def test_the_library_refuses_calibration_settings_in_the_command_line_words(tmp_path: Path) -> None:
    from clef_quant.quantize.errors import QuantizeError
    from clef_quant.quantize.scan import ScanConfig, scan

    with pytest.raises(QuantizeError) as caught:
        scan(ScanConfig(source=str(tmp_path), out=tmp_path / "scan", calibration_records=1, max_seq_len=0))
    assert f"error: {caught.value}" == "error: --max-seq-len must be at least 1"
    with pytest.raises(QuantizeError) as caught:
        scan(ScanConfig(source=str(tmp_path), out=tmp_path / "scan", schemes=("nvfp4-awq",)))
    assert f"error: {caught.value}" == refused(["scan", "SRC", "--out", "OUT", "--scheme", "nvfp4-awq"])


def test_build_data_count_has_its_own_name_and_reads_the_old_one_with_a_warning(tmp_path: Path) -> None:
    common = ["build-data", "--out", str(tmp_path / "d"), "--source", "fixtures", "--per-task", "1", "--task", "boolq"]
    new = CliRunner().invoke(app, [*common, "--calibration-count", "3"])
    old = CliRunner().invoke(app, [*common[:2], str(tmp_path / "e"), *common[3:], "--calibration", "3"])
    assert new.exit_code == 0 and old.exit_code == 0, (new.output, old.output)
    assert "warning: build-data's --calibration is now --calibration-count" in old.stderr
    assert "--calibration" not in new.stderr
    for folder in ("d", "e"):
        assert len((tmp_path / folder / "calibration.jsonl").read_text().splitlines()) == 3
    words = help_words(["build-data"])
    assert "--calibration-count" in words and "--calibration " not in words.replace("quantize's --calibration", "")
