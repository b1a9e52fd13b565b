"""Serving modes side by side: each release in each mode, offline and through `clef-systemone`, in one run.

For every (release, mode) pair one `ClefEngine` starts and measures, in this order:
1. throughput: the whole workload in one `logits` call, `repeats` times -> records/s and tokens/s;
2. invariance under load: `probes` records scored alone, one call each, against the same records inside the
   full batch (and the batch against itself across repeats) -> how many are bit-identical, and the largest
   probability difference;
3. latency: `latency_requests` single requests one after another -> p50 and p95 in ms;
4. optionally a profile (vLLM's torch profiler in the engine core) of single requests and of one call over the
   whole workload: GPU kernel time by part of the model per record, and the share of the wall time the GPU sat
   idle (scheduling, IPC, launch gaps). Profiling two modes of one release shows where one costs more.
Then `clef-systemone` serves each release given to `server_releases` in the default mode at 1, 8 and 64 clients,
and vLLM's own Clef class (`vllm serve` without our plugin, vLLM 0.33 and later) each one in `native_releases`.
Results go to a JSON file after every step, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from clef_quant.bench.engine_record import given_engine_settings
from clef_quant.bench.errors import BenchError
from clef_quant.bench.modes_profile import profiled_calls, profiler_engine_kwargs
from clef_quant.bench.modes_servers import NATIVE, SYSTEMONE, ServerRun, serve_at_client_counts
from clef_quant.bench.profile_trace import Breakdown
from clef_quant.bench.workload import mixed_length_requests
from clef_quant.documents import read_document
from clef_quant.progress import Progress, Stages
from clef_vllm.engine.flags import setting_of
from clef_vllm.engine.gdn_graphs import GDN_GRAPHS_ENV
from clef_vllm.engine.invariance import BF16_GEMM_ENV, GPU_METHOD_ENV, SPLIT_FREE_BLAS_ENV
from clef_vllm.errors import first_validation_error

if TYPE_CHECKING:
    import torch

    from clef_vllm.engine.engine_settings import EngineSettings


@dataclass(frozen=True)
class Mode:
    """One way of running the engine: the batch-invariance switch plus engine arguments."""

    name: str
    batch_invariant: bool
    engine_kwargs: dict[str, Any]
    about: str
    env: dict[str, str] = field(default_factory=dict)  # read by the engine's processes when they start


# Same token budget per step for the batched modes, so their difference is the invariance, not the step size.
STEP_TOKENS = 16384
# vLLM's own ceiling for CUDA graph sizes, sized for decode steps (GPU engines here capture whole prompts' sizes,
# `clef_vllm.engine.cuda_graphs`).
VLLM_GRAPH_TOKENS = 512
MODES = {
    mode.name: mode
    for mode in (
        Mode("invariant", True, {}, "the default: answers independent of load"),
        Mode(
            "invariant-vllm",
            True,
            {},
            "invariant through vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, GDN layers accepted)",
            env={GPU_METHOD_ENV: "vllm"},
        ),
        Mode(
            "invariant-split-free",
            True,
            {},
            "invariant through vLLM's own kernels with cuBLAS split-K and FlashAttention KV splits off",
            env={GPU_METHOD_ENV: "split-free"},
        ),
        Mode(
            "invariant-cublas",
            True,
            {},
            "the default with torch's own cuBLAS choice for bf16 linears instead of cuBLASLt (split-K off in both)",
            env={SPLIT_FREE_BLAS_ENV: "cublas"},
        ),
        Mode(
            "invariant-triton",
            True,
            {},
            "the default with vLLM's batch-invariant Triton matmul for bf16 linears instead of cuBLAS (split-K off)",
            env={BF16_GEMM_ENV: "triton"},
        ),
        Mode(
            "batched",
            False,
            {"max_num_batched_tokens": STEP_TOKENS},
            "--no-batch-invariant: vLLM batches and splits prompts freely",
        ),
        Mode("one-per-step", True, {"max_num_seqs": 1}, "one whole prompt per engine step (the CPU's method)"),
        Mode(
            "invariant-gdn-eager",
            True,
            {},
            "the default with every Gated DeltaNet prefill run from Python (no per-layer graphs for one-prompt steps)",
            env={GDN_GRAPHS_ENV: "0"},
        ),
        Mode(
            "invariant-vllm-graphs",
            True,
            {"compilation_config": {"max_cudagraph_capture_size": VLLM_GRAPH_TOKENS}},
            "the default with vLLM's own CUDA graph sizes (up to 512 tokens) instead of whole prompts' (up to 8,192)",
        ),
        Mode("invariant-eager", True, {"enforce_eager": True}, "the default without torch.compile and CUDA graphs"),
        Mode("batched-eager", False, {"max_num_batched_tokens": STEP_TOKENS, "enforce_eager": True}, "batched, eager"),
    )
}
MODE_NAMES = tuple(MODES)


@dataclass
class ModeRun:
    release: str
    scheme: str
    mode: str
    engine: dict[str, str]
    start_s: float
    records_s: list[float] = field(default_factory=list)
    tokens_s: list[float] = field(default_factory=list)
    probes: int = 0
    alone_identical: int = 0
    alone_max_dp: float = 0.0
    mixed_checked: int = 0  # answers compared inside batches of random sizes and mixed lengths
    mixed_identical: int = 0
    mixed_max_dp: float = 0.0
    repeats_identical: bool = True
    repeats_max_dp: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    breakdown: Breakdown | None = None  # single requests
    batch_breakdown: Breakdown | None = None  # the whole workload in one call, per record
    error: str | None = None

    @property
    def best_records_s(self) -> float:
        return max(self.records_s, default=0.0)


@dataclass
class ModesResult:
    machine: str
    versions: str
    command: str
    records: int
    tokens: int
    questions: int
    max_model_len: int
    date: str = ""
    runs: list[ModeRun] = field(default_factory=list)
    servers: list[ServerRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_result(path: Path) -> ModesResult:
    """A result that `run_modes` saved, to add more releases or modes to; a file that does not parse or holds
    something else is refused in one line naming it."""
    data, _ = read_document(path, what="report", error=BenchError)
    if not isinstance(data, dict):
        raise BenchError(f"{path} is not a report of bench modes: its top level is not a JSON object")
    try:
        return TypeAdapter(ModesResult).validate_python(data)
    except ValidationError as exc:
        raise BenchError(f"{path} is not a report of bench modes: {first_validation_error(exc)}") from None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(first: list[torch.Tensor], second: list[torch.Tensor]) -> tuple[int, float]:
    """How many pairs are bit-identical, and the largest absolute difference over all of them."""
    import torch

    identical = sum(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    worst = max(((a - b).abs().max().item() for a, b in zip(first, second, strict=True) if a.numel()), default=0.0)
    return identical, worst


def measure_engine(
    engine: Any,
    encodings: list[Any],
    run: ModeRun,
    *,
    repeats: int,
    probes: int,
    latency_requests: int,
    profile_dir: Path | None,
    save: Callable[[], None],
    mixed: list[Any] | None = None,
) -> None:
    """Steps 1-4 of the module docstring on one started engine, saving after each; `mixed` (encodings of mixed
    lengths) adds the check of answers inside batches of random sizes and mixed lengths."""
    tokens = sum(e.num_tokens for e in encodings)
    engine.logits(encodings[:8])  # warm-up: lazy setup and the first compile of each shape stay out of the timing
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        batches.append(engine.logits(encodings))
        elapsed = time.perf_counter() - start
        run.records_s.append(len(encodings) / elapsed)
        run.tokens_s.append(tokens / elapsed)
        save()
    for later in batches[1:]:
        identical, worst = compare(batches[0], later)
        run.repeats_identical &= identical == len(encodings)
        run.repeats_max_dp = max(run.repeats_max_dp, worst)
    alone = [engine.logits([encoding])[0] for encoding in encodings[:probes]]
    run.probes = len(alone)
    run.alone_identical, run.alone_max_dp = compare(alone, batches[0][:probes])
    save()
    if mixed:
        check_mixed_batches(engine, encodings, alone, mixed, run)
        save()
    for encoding in encodings[:latency_requests]:
        start = time.perf_counter()
        engine.logits([encoding])
        run.latency_ms.append((time.perf_counter() - start) * 1000)
    save()
    if profile_dir is not None:
        run.breakdown = profiled_calls(engine, [[encoding] for encoding in encodings[:4]], profile_dir)
        save()
        run.batch_breakdown = profiled_calls(engine, [encodings], profile_dir)
        save()


MIXED_ROUNDS = 3


def check_mixed_batches(
    engine: Any, encodings: list[Any], alone: list[torch.Tensor], mixed: list[Any], run: ModeRun, seed: int = 0
) -> None:
    """Each of `MIXED_ROUNDS` batches holds every mixed-length prompt and a random number of the workload's, in a
    random order; each answer whose request was also scored alone (`alone`: the first workload requests) is
    compared with that."""
    import random

    rng = random.Random(seed)
    mixed_alone = [engine.logits([encoding])[0] for encoding in mixed]
    got: list[torch.Tensor] = []
    expected: list[torch.Tensor] = []
    for _ in range(MIXED_ROUNDS):
        members = [("workload", index) for index in rng.sample(range(len(encodings)), rng.randint(1, len(encodings)))]
        members += [("mixed", index) for index in range(len(mixed))]
        rng.shuffle(members)
        answers = engine.logits([encodings[i] if kind == "workload" else mixed[i] for kind, i in members])
        for (kind, index), answer in zip(members, answers, strict=True):
            reference = mixed_alone[index] if kind == "mixed" else (alone[index] if index < len(alone) else None)
            if reference is not None:
                got.append(answer)
                expected.append(reference)
    run.mixed_checked = len(got)
    run.mixed_identical, run.mixed_max_dp = compare(got, expected)


def mode_settings(settings: EngineSettings, mode: Mode, extra: dict[str, Any] | None = None) -> EngineSettings:
    """`settings` in `mode`: its batch invariance, and its engine arguments (those that are settings' fields set
    them), then `extra` engine arguments. An engine argument the command line gave (`--engine-arg`) wins over the
    mode's, as it always has."""
    names = {f.name for f in dataclasses.fields(settings) if setting_of(f) is not None}
    given = settings.engine_overrides()
    fields = {key: value for key, value in mode.engine_kwargs.items() if key in names}
    args = {key: value for key, value in mode.engine_kwargs.items() if key not in names and key not in given}
    python_args = {**settings.python_args, **args, **(extra or {})}
    return replace(settings, batch_invariant=mode.batch_invariant, **fields, python_args=python_args)


def text_only(settings: EngineSettings) -> EngineSettings:
    """The workload is text: the vision tower stays unloaded, as `clef-systemone --language-model-only` does."""
    return replace(settings, limit_images=0, limit_videos=0)


@contextlib.contextmanager
def started_engine(settings: EngineSettings, mode: Mode) -> Iterator[Any]:
    """A `ClefEngine` with `settings` (`mode_settings` gives a mode's), started with `mode`'s environment and
    closed when the block ends (also when it ends early)."""
    import os

    from clef_vllm.engine import ClefEngine

    saved = {name: os.environ.get(name) for name in mode.env}
    os.environ.update(mode.env)
    try:
        engine = ClefEngine.from_settings(settings)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield engine
    finally:
        engine.close()
        del engine
        gc.collect()


def failure_line(exc: Exception) -> str:
    """What a report says of a run that failed: the exception's type and the first line of its message."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0] if message else ''}"


def run_modes(
    releases: list[tuple[str, Path, list[Mode]]],
    bodies: list[dict[str, Any]],
    result: ModesResult,
    save_to: Path,
    *,
    repeats: int = 3,
    probes: int = 16,
    latency_requests: int = 20,
    profile: set[tuple[str, str]] | None = None,
    server_releases: list[str] | None = None,
    native_releases: list[str] | None = None,
    settings: EngineSettings | None = None,
    native_flags: list[str] | None = None,
    progress: Progress | None = None,
) -> ModesResult:
    """Every release in each of its modes, then the servers; `profile` names the (release, mode) pairs to profile.
    `settings`: the engine settings every engine starts from, and `clef-systemone` serves with (the default mode)."""
    from clef_vllm.engine.engine_settings import EngineSettings
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request

    def save() -> None:
        save_to.parent.mkdir(parents=True, exist_ok=True)
        save_to.write_text(json.dumps(asdict(result), indent=2), encoding="utf-8")

    base = replace(settings or EngineSettings(model=""), max_model_len=result.max_model_len)
    stage = Stages(progress)
    encoder = Encoder(releases[0][1], max_length=result.max_model_len)
    encodings = [encoder.encode(parse_request(body)) for body in bodies]
    mixed = [encoder.encode(parse_request(body)) for body in mixed_length_requests()]
    for scheme, folder, modes in releases:
        for mode in modes:
            stage(f"{scheme}, {mode.name}")
            trace_dir = save_to.parent / f"traces-{scheme}-{mode.name}"
            profiled = (scheme, mode.name) in (profile or set())
            extra = profiler_engine_kwargs(trace_dir) if profiled else {}
            recorded = {**mode.engine_kwargs, **given_engine_settings(base), **extra}
            start = time.perf_counter()
            run = ModeRun(str(folder), scheme, mode.name, {k: repr(v) for k, v in recorded.items()}, 0.0)
            result.runs.append(run)
            try:
                in_mode = mode_settings(text_only(base.for_model(folder)), mode, extra)
                with started_engine(in_mode, mode) as engine:
                    run.start_s = time.perf_counter() - start
                    measure_engine(
                        engine,
                        encodings,
                        run,
                        repeats=repeats,
                        probes=probes,
                        latency_requests=latency_requests,
                        profile_dir=trace_dir if profiled else None,
                        save=save,
                        mixed=mixed,
                    )
            except Exception as exc:  # one mode that cannot run on this machine is a result, not the end of the run
                run.error = failure_line(exc)
            save()
    for server, chosen in ((SYSTEMONE, server_releases), (NATIVE, native_releases)):
        for scheme, folder, _ in releases:
            if scheme not in (chosen or []):
                continue
            stage(f"{server}, {scheme}")
            how = base if server == SYSTEMONE else (native_flags or [])
            result.servers += serve_at_client_counts(folder, scheme, bodies, result.max_model_len, how, server)
            save()
    stage.done()
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
