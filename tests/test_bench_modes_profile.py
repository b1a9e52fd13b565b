"""`clef-quant bench modes --profile`: several (release, mode) pairs profiled in one run, each with single requests
and one call over the whole workload, read from the right trace and reported side by side."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from typer.testing import CliRunner

from clef_quant.bench.modes import ModeRun, ModesResult, read_result
from clef_quant.bench.modes_profile import written_trace
from clef_quant.bench.modes_report import render_markdown
from clef_quant.bench.profile_trace import Breakdown, kernel_breakdown
from clef_quant.cli import app


def _trace(path: Path, kernels: dict[str, float]) -> Path:
    events = [
        {"cat": "kernel", "name": name, "ts": i * 1000, "dur": dur} for i, (name, dur) in enumerate(kernels.items())
    ]
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return path


def test_a_second_profile_reads_its_own_trace_not_the_first_ones(tmp_path: Path) -> None:
    first = _trace(tmp_path / "rank0.1.pt.trace.json", {"cutlass_3x_gemm_sm90_fp8": 4000.0})
    earlier = set(tmp_path.rglob("*"))
    second = _trace(tmp_path / "rank0.2.pt.trace.json", {"rms_norm_kernel": 2000.0, "nvjet_gemm": 6000.0})
    os.utime(first, (second.stat().st_mtime + 60,) * 2)  # the earlier trace is the newest file on disk

    found = written_trace(tmp_path, earlier, timeout_s=10.0)

    assert found == second
    breakdown = kernel_breakdown(found, requests=2)
    assert breakdown.parts_ms == {"GEMM": 3.0, "norms, activations, rotary (fused)": 1.0}


def test_both_profiles_of_each_mode_are_reported_and_older_reports_still_read(tmp_path: Path) -> None:
    single = Breakdown(parts_ms={"GEMM": 40.0}, busy_ms=40.0, wall_ms=60.0, kernels=800, trace="a.json")
    batch = Breakdown(parts_ms={"GEMM": 6.0}, busy_ms=7.0, wall_ms=8.0, kernels=30, trace="b.json")
    result = ModesResult(
        machine="m", versions="v", command="c", records=64, tokens=95745, questions=3, max_model_len=4096
    )
    result.runs = [
        ModeRun("f", "FP8_DYNAMIC", "invariant", {}, 1.0, records_s=[20.0], breakdown=single, batch_breakdown=batch),
        ModeRun("f", "FP8_DYNAMIC", "batched", {}, 1.0, records_s=[35.0], breakdown=single),
    ]

    report = render_markdown(result)

    assert "## Where one request's time goes (FP8_DYNAMIC, invariant)" in report
    assert "## Where one request's time goes (FP8_DYNAMIC, batched)" in report
    assert "## Where a request's time goes in one call over all 64 (FP8_DYNAMIC, invariant)" in report
    assert "| GPU idle (scheduling, IPC, launch gaps) | 1.00 | 12% |" in report

    saved = asdict(result)
    for run in saved["runs"]:
        del run["batch_breakdown"]  # a report written before batch profiles existed
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(saved), encoding="utf-8")
    read = read_result(path)
    assert read.runs[0].breakdown == single
    assert read.runs[0].batch_breakdown is None


def test_each_profile_must_name_a_release_and_one_of_its_modes(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "modes.md"
    release = f"{tiny_dir}@invariant,batched"
    profiles = ["--profile", "bf16:one-per-step", "--profile", "bf16:invariant"]  # each checked, not the last
    result = CliRunner().invoke(app, ["bench", "modes", "--release", release, *profiles, "--out", str(out)])

    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.splitlines() == [
        "error: --profile bf16:one-per-step: name one of the releases (bf16) and one of its modes"
    ]
    assert not out.exists()


def test_a_profile_without_a_gpu_timeline_reports_no_gpu_idle_time(tmp_path: Path) -> None:
    """An engine on a CPU writes a trace of CPU ops only: there is no kernel time to sum and no GPU that sat idle."""
    events = [
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3000.0},
        {"cat": "user_annotation", "name": "execute_model", "ts": 0, "dur": 5000.0},
    ]
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    cpu = kernel_breakdown(trace, requests=1)
    cpu.wall_ms = 9.0
    gpu = kernel_breakdown(_trace(tmp_path / "gpu.json", {"nvjet_gemm": 4000.0}), requests=1)
    gpu.wall_ms = 9.0
    assert (cpu.gpu, gpu.gpu) == (False, True)
    result = ModesResult(machine="m", versions="v", command="c", records=8, tokens=800, questions=3, max_model_len=4096)
    result.runs = [
        ModeRun("f", "bf16", "invariant", {}, 1.0, records_s=[2.0], breakdown=cpu),
        ModeRun("f", "bf16", "batched", {}, 1.0, records_s=[3.0], breakdown=gpu),
    ]

    report = render_markdown(result)

    cpu_section, gpu_section = report.split("## Where one request's time goes")[1:]
    assert "(bf16, invariant)" in cpu_section and "idle" not in cpu_section.lower()
    assert "CPU only" in cpu_section and "| wall time per request | 9.00 | 100% |" in cpu_section
    assert "| GPU idle (scheduling, IPC, launch gaps) | 5.00 | 56% |" in gpu_section
