"""One request at a time on each release: the five workloads shaped like Flide's (`flide_workloads`), timed the
way Flide publishes their latency for the 27B on one H200.

For every release one `ClefEngine` starts in each mode asked for (`clef_quant.bench.modes.MODES`; unless told, the
default mode, invariant kernels; images allowed, for gqa). Each workload runs once untimed (lazy set-up and the
first run of each shape stay out of the timing), then each workload's `repeats` requests run one after another.
A request is timed from its body to its answers, as `ClefEngine.score` handles one body: validating and encoding
it (tokenizer, image processor), the engine, the answers; the encoding's share is recorded beside it. Results are
saved after every workload, so a run cut short keeps what it measured.

Profiled (`profile_root`), each release's engine starts with vLLM's torch profiler configured, and after its timed
requests each workload runs `PROFILED_REQUESTS` more times under the profiler: where one request's engine time goes,
by part of the model, and how long the GPU sat idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, computed_field

from clef_quant.bench.engine_record import recorded_engine
from clef_quant.bench.errors import BenchError
from clef_quant.bench.flide_workloads import FlideWorkload
from clef_quant.bench.modes import MODES, failure_line, median, mode_settings, percentile, started_engine
from clef_quant.bench.modes_profile import profiled_calls, profiler_engine_kwargs
from clef_quant.bench.profile_trace import Breakdown
from clef_quant.bench.releases import row_name
from clef_quant.families import family_of_folder
from clef_quant.formatting import utc_minute
from clef_quant.progress import Progress, Stages
from clef_quant.release_folder.versions import SCORING_TOOLS, tool_versions
from clef_vllm.format.answers import response_from_logits

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings


class WorkloadLatency(BaseModel):
    # The figures derived from the latencies are written into the JSON too; reading recomputes them (`ignore`).
    model_config = ConfigDict(extra="ignore")

    workload: str
    input_tokens: int  # as the engine encoded the request
    state_tokens: int
    flide_ms: float
    sglang_ms: float
    latency_ms: list[float] = []
    encode_ms: list[float] = []  # of each latency: validating and encoding the body
    breakdown: Breakdown | None = None  # profiled runs only: the engine's share of one request, by part

    @computed_field  # type: ignore[prop-decorator]
    @property
    def p50_ms(self) -> float:
        return median(self.latency_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def p95_ms(self) -> float:
        return percentile(self.latency_ms, 0.95)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def encode_p50_ms(self) -> float:
        return median(self.encode_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def p50_over_flide(self) -> float:
        return self.p50_ms / self.flide_ms


class ReleaseLatency(BaseModel):
    release: str  # the folder
    model: str  # its family (clef-flash, clef, clef-omni)
    scheme: str  # bf16, or the labels of the scheme it was quantized with
    mode: str = "invariant"  # the serving mode its engine ran in (`clef_quant.bench.modes.MODES`)
    start_s: float = 0.0
    workloads: list[WorkloadLatency] = []
    error: str | None = None


class LatencyResult(BaseModel):
    machine: str
    date: str
    versions: dict[str, str | None]
    command: str
    repeats: int
    max_model_len: int
    engine: dict[str, str]  # engine settings given beyond the defaults (--enforce-eager, --engine-arg)
    releases: list[ReleaseLatency] = []


def latency_runs(
    folders: list[Path], max_model_len: int, modes: tuple[str, ...] = ("invariant",)
) -> list[tuple[ReleaseLatency, list[FlideWorkload]]]:
    """An empty row per release and mode (the modes of a release one after another, so that they run side by side)
    and the release's workloads, built from its own tokenizer; refused when the longest workload does not fit
    `max_model_len`, since its state would be cut and the timing would be of a shorter request."""
    from clef_quant.bench.flide_workloads import flide_workloads

    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:  # before any release's workloads are built
        raise BenchError(f"unknown mode {unknown[0]!r}; choose one of {', '.join(MODES)}")
    runs = []
    for folder in folders:
        workloads = flide_workloads(folder)
        longest = max(workloads, key=lambda w: w.input_tokens)
        if longest.input_tokens > max_model_len:
            raise BenchError(
                f"--max-model-len {max_model_len} is below the {longest.name} workload's {longest.input_tokens} "
                f"tokens on {folder}; its state would be cut"
            )
        family = family_of_folder(folder)
        model = family.name if family is not None else "unknown"
        for mode in modes:
            row = ReleaseLatency(release=str(folder), model=model, scheme=row_name(folder), mode=mode)
            runs.append((row, workloads))
    return runs


def starting_result(command: str, *, repeats: int, settings: EngineSettings) -> LatencyResult:
    """The empty result of a run with the engine `settings` each release gets, on the machine the engines run
    on."""
    from clef_quant.bench.environment import engine_device, machine_name

    return LatencyResult(
        machine=machine_name(engine_device()),
        date=utc_minute(),
        versions=tool_versions(SCORING_TOOLS, source_trees=True),
        command=command,
        repeats=repeats,
        max_model_len=settings.max_model_len,
        engine=recorded_engine(settings),
    )


def time_request(engine: Any, body: dict[str, Any]) -> tuple[float, float, int]:
    """One request on its own: ms from body to answers, ms of them encoding it, and its prompt tokens."""
    start = time.perf_counter()
    request, encoding = engine.encode(body)
    encoded = time.perf_counter()
    (logits,) = engine.logits([encoding])  # tensors on the host: the GPU's work is finished
    response_from_logits(request, logits, encoding.num_tokens)
    end = time.perf_counter()
    return (end - start) * 1000, (encoded - start) * 1000, encoding.num_tokens


# Requests of each workload under the profiler: one trace per workload, the breakdown their mean.
PROFILED_REQUESTS = 3


def measure_workloads(
    engine: Any,
    workloads: list[FlideWorkload],
    run: ReleaseLatency,
    *,
    repeats: int,
    save: Callable[[], object],
    trace_dir: Path | None = None,
) -> None:
    """Every workload once untimed, then `repeats` timed requests of each, then (`trace_dir`: the engine was started
    with the profiler writing there) `PROFILED_REQUESTS` more under the profiler; saving after each workload."""
    tokens = {workload.name: time_request(engine, workload.body)[2] for workload in workloads}
    for workload in workloads:
        row = WorkloadLatency(
            workload=workload.name,
            input_tokens=tokens[workload.name],
            state_tokens=workload.state_tokens,
            flide_ms=workload.flide_ms,
            sglang_ms=workload.sglang_ms,
        )
        run.workloads.append(row)
        for _ in range(repeats):
            total_ms, encode_ms, _ = time_request(engine, workload.body)
            row.latency_ms.append(total_ms)
            row.encode_ms.append(encode_ms)
        if trace_dir is not None:
            _, encoding = engine.encode(workload.body)
            row.breakdown = profiled_calls(engine, [[encoding]] * PROFILED_REQUESTS, trace_dir)
        save()


def run_latency(
    releases: list[tuple[ReleaseLatency, list[FlideWorkload]]],
    result: LatencyResult,
    save: Callable[[], object],
    settings: EngineSettings,
    *,
    profile_root: Path | None = None,
    progress: Progress | None = None,
) -> LatencyResult:
    """Each release's engine in turn, `settings` for its folder in the row's mode: started, measured on its
    workloads, stopped; `save` writes `result` after every workload. A release that fails keeps its error in the
    result and the next one runs. Images stay allowed (the gqa workload holds one), unlike the text-only engines of
    `bench modes`.
    `profile_root`: profile each workload too, the traces of the n-th release under `release-<n>` there."""
    stage = Stages(progress)
    for index, (run, workloads) in enumerate(releases, start=1):
        trace_dir = None if profile_root is None else profile_root / f"release-{index}"
        extra = profiler_engine_kwargs(trace_dir) if trace_dir is not None else None
        stage(f"{run.release} ({run.mode}): starting the engine")
        result.releases.append(run)
        start = time.perf_counter()
        try:
            mode = MODES[run.mode]
            with started_engine(mode_settings(settings.for_model(run.release), mode, extra), mode) as engine:
                run.start_s = time.perf_counter() - start
                stage(f"{run.release}: timing {len(workloads)} workloads")
                measure_workloads(engine, workloads, run, repeats=result.repeats, save=save, trace_dir=trace_dir)
        except Exception as exc:  # a release that cannot run here is a result, not the end of the run
            run.error = failure_line(exc)
        save()
    stage.done()
    return result
