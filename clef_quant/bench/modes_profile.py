"""The profile of `bench modes`: vLLM's torch profiler set up in an engine, calls run under it, and the trace its
workers write waited for and read (`profile_trace`) into where the wall time of one record goes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from clef_quant.bench.profile_trace import Breakdown, kernel_breakdown, newest_trace


def profiled_calls(engine: Any, calls: list[list[Any]], trace_dir: Path) -> Breakdown:
    """`calls` one after another under vLLM's torch profiler (the engine was started with it configured): where
    the wall time of one record goes, per record."""
    earlier = set(trace_dir.rglob("*")) if trace_dir.is_dir() else set()
    records = sum(len(call) for call in calls)
    engine.llm.start_profile()
    start = time.perf_counter()
    for call in calls:
        engine.logits(call)
    wall_ms = (time.perf_counter() - start) * 1000 / records
    engine.llm.stop_profile()
    breakdown = kernel_breakdown(written_trace(trace_dir, earlier), requests=records)
    breakdown.wall_ms = wall_ms
    return breakdown


def written_trace(
    trace_dir: Path, earlier: set[Path] | frozenset[Path] = frozenset(), timeout_s: float = 180.0
) -> Path:
    """The trace the workers write after `stop_profile`, not one of `earlier`, once its size has stopped
    changing."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        try:
            trace = newest_trace(trace_dir, earlier)
            size = trace.stat().st_size
        except FileNotFoundError:
            trace, size = None, -1
        if trace is not None and size == last and size > 0:
            return trace
        if time.monotonic() > deadline:
            return newest_trace(trace_dir, earlier)
        last = size
        time.sleep(2.0)


def profiler_engine_kwargs(trace_dir: Path) -> dict[str, Any]:
    """The engine setting that starts vLLM's torch profiler, its traces written to `trace_dir` unzipped and without
    stacks: `profile_trace` reads only kernel times from them."""
    return {
        "profiler_config": {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir.resolve()),
            "torch_profiler_with_stack": False,
            "torch_profiler_use_gzip": False,
            "torch_profiler_dump_cuda_time_total": False,
            "ignore_frontend": True,
        }
    }
