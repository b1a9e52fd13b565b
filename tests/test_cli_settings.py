"""What a command is given is what its run uses: every option set to something other than its default shows up in
what the run records (the manifest of `quantize`, the summary of `build-data`). An option renamed on one side of
the CLI and the library, or dropped on the way, would leave the default there instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.release_folder.manifest import MANIFEST_FILE

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"


def run(*args: object) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def test_quantize_records_the_options_it_was_given(tiny_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    (source / "modeling_extra.py").write_text("# carried on purpose\n")
    out = tmp_path / "out"
    run("quantize", source, "--scheme", "fp8-dynamic", "--out", out, "--max-seq-len", "321",
        "--include", "modeling_*.py", "--streaming")  # fmt: skip
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["source"]["id"] == str(source)
    assert manifest["scheme"] == "fp8-dynamic"
    assert manifest["calibration"]["max_seq_len"] == 321
    assert manifest["run"]["path"] == "streaming"
    assert [entry["why"] for entry in manifest["included"]] == ["--include modeling_*.py"]
    run("quantize", source, "--scheme", "fp8-dynamic", "--out", out, "--overwrite", "--no-streaming")
    assert json.loads((out / MANIFEST_FILE).read_text())["run"]["path"] == "oneshot"


def test_build_data_records_the_options_it_was_given(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    run("build-data", "--out", out, "--source", FIXTURES, "--per-task", "3", "--calibration-count", "5", "--seed", "7",
        "--task", "boolq", "--tokenizer", tiny_dir)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["per_task"], summary["calibration_requested"], summary["seed"]) == (3, 5, 7)
    assert (summary["length_unit"], summary["tokenizer"]) == ("tokens", str(tiny_dir))
    assert list(summary["tasks"]) == ["boolq"] and summary["counts"]["calibration_records"] == 5
    assert summary["source"] == "eval/fixtures"
