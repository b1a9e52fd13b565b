"""`clef-quant bench latency`: the Flide-shaped workloads one request at a time on a release, in its own engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_quant.bench.flide_workloads import FLIDE_MS, SGLANG_MS, flide_workloads
from clef_quant.bench.modes import MODES
from clef_quant.cli import app


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)


def invoke(*args: object):
    return CliRunner().invoke(app, ["bench", "latency", *map(str, args)])


def test_each_workload_is_timed_on_the_release_and_reported_beside_flide(tiny_dir: Path, tmp_path: Path) -> None:
    # The engine is the command's own: no shared engine takes the quality workload's 7k tokens.
    out = tmp_path / "latency.md"
    result = invoke("--release", tiny_dir, "--repeats", 2, "--enforce-eager", "--profile", "--out", out)
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"wrote {out} and {out.with_suffix('.json')}" in result.stdout

    saved = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert saved["repeats"] == 2 and saved["engine"] == {"enforce_eager": "True"}
    (release,) = saved["releases"]
    assert release["release"] == str(tiny_dir) and release["model"] == "clef-flash" and release["scheme"] == "bf16"
    assert release["mode"] == "invariant"
    assert release["error"] is None
    expected = {w.name: w for w in flide_workloads(tiny_dir)}
    assert [w["workload"] for w in release["workloads"]] == list(expected) == list(FLIDE_MS)
    for row in release["workloads"]:
        # The engine's own count of what it ran: the state was not cut to fit.
        assert row["input_tokens"] == expected[row["workload"]].input_tokens
        assert row["state_tokens"] == expected[row["workload"]].state_tokens
        assert len(row["latency_ms"]) == len(row["encode_ms"]) == 2
        assert all(0 < encode < total for encode, total in zip(row["encode_ms"], row["latency_ms"], strict=True))
        assert row["p50_over_flide"] == pytest.approx(row["p50_ms"] / FLIDE_MS[row["workload"]])

    report = out.read_text(encoding="utf-8")
    assert "Flide p50 ms" in report and "SGLang p50 ms" in report
    for name, row in zip(FLIDE_MS, release["workloads"], strict=True):
        line = next(line for line in report.splitlines() if f"| {name} |" in line)
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[1] == "invariant" and cells[3:5] == ["2", f"{row['input_tokens']:,}"]
        assert cells[9:11] == [f"{FLIDE_MS[name]:.1f}", f"{SGLANG_MS[name]:.1f}"]

    # --profile: each workload read from a trace of its own, written where the help says.
    traces = [row["breakdown"]["trace"] for row in release["workloads"]]
    assert len(set(traces)) == len(traces) == len(FLIDE_MS)
    assert all((tmp_path / "latency-traces" / "release-1" / trace).is_file() for trace in traces)
    assert all(row["breakdown"]["wall_ms"] > 0 and not row["breakdown"]["gpu"] for row in release["workloads"])
    assert "## Where one request's engine time goes (ms, torch profiler)" in report
    assert "ran on a CPU: its trace has no GPU kernels" in report


def test_a_profiled_gpu_workload_reports_each_part_in_its_column() -> None:
    from clef_quant.bench.latency import LatencyResult, ReleaseLatency, WorkloadLatency
    from clef_quant.bench.latency_report import PROFILE_PARTS, render_markdown
    from clef_quant.bench.profile_trace import Breakdown

    parts = {"GEMM": 30.0, "Gated DeltaNet": 5.0, "pooler and head": 1.5}
    breakdown = Breakdown(parts_ms=parts, busy_ms=36.5, wall_ms=40.0, kernels=800, trace="t.json")
    row = WorkloadLatency(workload="race", input_tokens=685, state_tokens=426, flide_ms=50.8, sglang_ms=91.3)
    row.latency_ms, row.encode_ms, row.breakdown = [41.0], [1.0], breakdown
    result = LatencyResult(
        machine="H100", date="d", versions={}, command="c", repeats=1, max_model_len=12288, engine={}
    )
    result.releases = [
        ReleaseLatency(release="/w/clef-FP8_DYNAMIC", model="clef", scheme="FP8_DYNAMIC", mode="invariant-gdn-eager")
    ]
    result.releases[0].workloads = [row]

    report = render_markdown(result)
    # A mode other than the default says what it changes.
    assert f"- `invariant-gdn-eager`: {MODES['invariant-gdn-eager'].about}" in report

    header, _, line = report.split("## Where one request's engine time goes")[1].strip().splitlines()[2:5]
    cells = dict(zip(header.strip("|").split("|"), line.strip("|").split("|"), strict=True))
    cells = {key.strip(): value.strip() for key, value in cells.items()}
    assert cells["mode"] == "invariant-gdn-eager"
    assert [cells[part] for part in PROFILE_PARTS] == [f"{parts.get(part, 0.0):.2f}" for part in PROFILE_PARTS]
    assert (cells["GPU idle"], cells["engine wall"], cells["kernels"]) == ("3.50", "40.00", "800")
    assert "ran on a CPU" not in report
    # The JSON holds the breakdown and reads back.
    assert LatencyResult.model_validate_json(result.model_dump_json()).releases[0].workloads[0].breakdown == breakdown


def test_each_release_runs_in_each_mode_one_after_another(tiny_dir: Path, tmp_path: Path) -> None:
    from clef_quant.bench.latency import latency_runs

    other = tmp_path / "other"
    other.symlink_to(tiny_dir, target_is_directory=True)
    runs = latency_runs([tiny_dir, other], 12288, ("invariant", "invariant-gdn-eager"))
    assert [(row.release, row.mode) for row, _ in runs] == [
        (str(tiny_dir), "invariant"),
        (str(tiny_dir), "invariant-gdn-eager"),
        (str(other), "invariant"),
        (str(other), "invariant-gdn-eager"),
    ]
    assert [w.name for w in runs[1][1]] == list(FLIDE_MS)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--release", "{tmp}", "--out", "{tmp}/r.md"], "error: {tmp} is not a release folder"),
        (
            ["--release", "{tiny}", "--release", "{tiny}", "--out", "{tmp}/r.md"],
            "error: --release {tiny} is given twice",
        ),
        (["--release", "{tiny}", "--repeats", "0", "--out", "{tmp}/r.md"], "error: Invalid value for '--repeats'"),
        (
            ["--release", "{tiny}", "--engine-arg", "max_model_len=9", "--out", "{tmp}/r.md"],
            "error: --engine-arg max_model_len=...: use --max-model-len",
        ),
        (
            ["--release", "{tiny}", "--max-model-len", "4096", "--out", "{tmp}/r.md"],
            "error: --max-model-len 4096 is below the quality workload's",
        ),
        (
            ["--release", "{tiny}", "--mode", "fastest", "--out", "{tmp}/r.md"],
            "error: unknown mode 'fastest'; choose one of invariant,",
        ),
    ],
    ids=["not a release", "twice", "no repeats", "engine arg with a flag", "too short", "unknown mode"],
)
def test_bad_arguments_are_refused_before_any_engine_starts(
    tiny_dir: Path, tmp_path: Path, args: list[str], line: str
) -> None:
    def filled(text: str) -> str:
        return text.format(tmp=tmp_path, tiny=tiny_dir)

    result = CliRunner().invoke(app, ["bench", "latency", *map(filled, args)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    error, *hints = result.stderr.splitlines()
    assert error.startswith(filled(line)) and all(hint.startswith("hint: ") for hint in hints)
    assert not (tmp_path / "r.md").exists()
