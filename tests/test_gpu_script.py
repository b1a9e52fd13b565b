"""scripts/measure_serving_gpu.sh: the GPU measurements as one script, checked on the CPU by what it would run."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from test_cli_vocabulary import parsed_options

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "measure_serving_gpu.sh"
STEPS = ["releases", "fp8", "profile", "schemes", "native", "eval", "latency"]
NAMED_ONLY = ["clef", "omni"]  # the full-size 27B and Omni: run only when named


def dry_run(tmp_path: Path, *steps: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "WORK": str(tmp_path / "work"),
        "RESULTS": str(tmp_path / "results"),
        "TAG": "h200",
        "ENGINE_ARGS": "--engine-arg gpu_memory_utilization=0.5",
    }
    return subprocess.run(["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True, check=False)


def row_name(release: str) -> str:
    """The report's row for a release folder `WORK/flash[-SCHEME]@MODES` of the script."""
    folder = Path(release.split("@")[0]).name
    return folder.split("-", 1)[1] if "-" in folder else "bf16"


def modes_of(release: str) -> list[str]:
    return release.split("@")[1].split(",")


def test_every_command_the_script_runs_parses_as_clef_quant_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import clef_quant.cli._options

    monkeypatch.setattr(clef_quant.cli._options, "device_problem", lambda _device: None)  # this CPU has no cuda
    done, named = dry_run(tmp_path), dry_run(tmp_path, *NAMED_ONLY)
    assert done.returncode == 0 and named.returncode == 0, done.stderr + named.stderr
    commands = [shlex.split(line) for line in (done.stdout + named.stdout).splitlines()]
    assert {words[0] for words in commands} == {"clef-quant"}
    reports = set()
    for words in commands:
        path = words[1:3] if words[1] == "bench" else words[1:2]
        params = parsed_options(path, words[1 + len(path) :])  # a renamed flag or an unknown mode fails here
        if path[0] in ("bench", "eval"):
            assert params["engine_arg"], words  # ENGINE_ARGS reaches every engine
        if path == ["bench", "modes"]:
            reports.add(Path(params["out"]).name)
            # What is profiled or served is a release of the same run (its row is the folder's scheme), in a
            # mode that run starts.
            runs = {(row_name(release), mode) for release in params["release"] for mode in modes_of(release)}
            for pair in params["profile"]:
                assert tuple(pair.split(":")) in runs, words
            for row in [*params["serve"], *params["serve_native"]]:
                assert row in {scheme for scheme, _ in runs}, words
    assert reports == {"serve-h200.md", "serve-h200-fp8-profile.md"}
    assert not (tmp_path / "results").exists() and not (tmp_path / "work").exists()  # a dry run writes nothing


def test_steps_run_alone_and_an_unknown_step_stops_before_anything_runs(tmp_path: Path) -> None:
    each = [dry_run(tmp_path, step).stdout for step in STEPS]
    assert all(each) and "".join(each) == dry_run(tmp_path).stdout
    for step in NAMED_ONLY:
        assert "--device cuda" in dry_run(tmp_path, step).stdout
    done = dry_run(tmp_path, "releases", "graphs")
    assert done.returncode == 2 and done.stdout == ""
    assert "unknown step 'graphs'" in done.stderr and "releases fp8 profile" in done.stderr
