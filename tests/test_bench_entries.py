"""The benchmarks' entries beside the Typer commands: `clef-quant bench quantize-vs-plain` (clef-quant against plain
llm-compressor, each side in its own process) and `python -m clef_quant bench head` on a bare GPU machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_quant.cli import app

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=50)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)


def invoke(command: str, *args: object):
    return CliRunner().invoke(app, ["bench", command, *map(str, args)])


MOVED = "error: --against-plain is now a command of its own: clef-quant bench quantize-vs-plain"


@pytest.mark.parametrize(
    ("command", "extra", "line"),
    [
        # Each command takes only its own options: the quality run's are not the comparison's, and back.
        ("quantize-vs-plain", ["--data", "DATA"], "error: No such option: --data"),
        ("quantize-vs-plain", ["--scan", "scan.json"], "error: No such option: --scan"),
        ("quantize-vs-plain", ["--max-model-len", "512"], "error: No such option: --max-model-len"),
        ("quantize", ["--device", "cpu"], "error: No such option: --device"),
        ("quantize-vs-plain", ["--device", "cuda:x"], "error: --device must be cpu or cuda[:N], not 'cuda:x'"),
        ("quantize-vs-plain", ["--scheme", "auto"], "error: auto is not compared against plain llm-compressor"),
        # The option of earlier versions names the command that replaced it, whatever else is given with it.
        ("quantize", ["--against-plain"], MOVED),
        ("quantize", ["--against-plain", "--device", "cuda", "--scheme", "fp8-dynamic"], MOVED),
        ("quantize", ["--against-plain", "--help"], MOVED),
    ],
)
def test_bad_or_mixed_options_are_refused_in_one_line(
    tmp_path: Path, command: str, extra: list[str], line: str
) -> None:
    result = invoke(command, "--model", tmp_path, "--work", tmp_path / "work", *extra)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), lines  # click may add the options it has instead
    assert result.stdout == ""
    assert not (tmp_path / "work").exists()


def test_quantize_vs_plain_measures_both_sides_in_their_own_processes(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / "quantize-cpu.json"
    result = invoke(
        "quantize-vs-plain", "--model", tiny_dir, "--work", tmp_path / "work", "--scheme", "fp8-dynamic",
        "--device", "cpu", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {out} and {out.with_suffix('.md')}" in result.stdout

    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and results["source"] == str(tiny_dir)
    assert list(results["schemes"]) == ["fp8-dynamic"]
    sides = results["schemes"]["fp8-dynamic"]
    # fp8-dynamic streams: plain model_free_ptq and clef-quant --no-streaming run beside the two.
    assert {"plain", "model-free", "clef-oneshot", "clef"} <= set(sides)
    assert (sides["clef"]["path"], sides["clef-oneshot"]["path"]) == ("streaming", "oneshot")
    assert "model_free_ptq" in sides["model-free"]["seconds"]
    assert sides["model_free_ratio"] == pytest.approx(
        sides["clef"]["process_wall_seconds"] / sides["model-free"]["process_wall_seconds"]
    )
    for side in ("plain", "model-free", "clef-oneshot", "clef"):
        run = sides[side]
        assert 0 < run["seconds"]["total"] <= run["process_wall_seconds"]
        assert run["peak_host_bytes"] > 0 and run["peak_gpu_bytes"] is None  # no GPU peak on a CPU
        assert run["out_bytes"] > 0
    assert {"load", "oneshot", "save"} <= set(sides["plain"]["seconds"])
    assert sides["clef"]["calibration"]["records"] == 0  # FP8_DYNAMIC needs no calibration
    assert sides["wall_ratio"] == pytest.approx(
        sides["clef"]["process_wall_seconds"] / sides["plain"]["process_wall_seconds"]
    )
    assert "| fp8-dynamic | plain |" in out.with_suffix(".md").read_text()
    assert "| fp8-dynamic | clef (streaming) |" in out.with_suffix(".md").read_text()
    assert not any((tmp_path / "work").iterdir())  # each side's output is removed once measured


BARE_MACHINE_MISSING = ("transformers", "vllm", "llmcompressor", "compressed_tensors")


def bare_machine_env(tmp_path: Path) -> dict[str, str]:
    """An environment where the packages a bare GPU machine lacks fail to import (they shadow the installed ones)."""
    for name in BARE_MACHINE_MISSING:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not on this machine')\n")
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_bench_head_runs_through_python_m_without_transformers_vllm_or_llm_compressor(tmp_path: Path) -> None:
    """Bare GPU machines carry our packages on PYTHONPATH and run `python -m clef_quant bench head`."""
    env = bare_machine_env(tmp_path)
    module = subprocess.run(
        [sys.executable, "-m", "clef_quant", "bench", "head", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert module.returncode == 0, module.stderr
    assert "Usage: python -m clef_quant bench head [OPTIONS]" in module.stdout
    assert option_names(module.stdout) == ["--device", "--dtype", "--repeats", "--warmup", "--out", "--help"]
    # What the command runs once its options are read: the benchmark itself.
    loaded = subprocess.run(
        [sys.executable, "-c", "import clef_quant.bench.head, clef_quant.bench.head_report"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert loaded.returncode == 0, loaded.stderr

    refused = subprocess.run(
        [sys.executable, "-m", "clef_quant", "bench", "head", "--device", "cuda:x"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == ["error: --device must be cpu or cuda[:N], not 'cuda:x'"]


def option_names(help_text: str) -> list[str]:
    return re.findall(r"│ (--[a-z-]+)", help_text)
