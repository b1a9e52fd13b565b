"""Where a request's GPU time goes, read from a torch profiler trace (Chrome trace JSON, as vLLM's profiler
writes it): kernel time summed by part of the model, and the pooler's share from its own annotation."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# The pooler runs inside POOLER_RANGE; the profiler puts the range on the GPU timeline too, so the kernels inside
# it are the pooler's whatever their names.
from clef_vllm.engine.pooling_contract import POOLER_RANGE

# Kernel name patterns by part of the model, tried in order; the first match wins.
PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "Gated DeltaNet",
        re.compile(
            r"chunk_|gated_delta|delta_rule|recurrent|causal_conv|conv1d|solve_tril|l2norm|recompute_w_u|kkt|gdn"
        ),
    ),
    ("attention", re.compile(r"flash|fmha|attn|attention")),
    ("activation quantization", re.compile(r"quant|fp4|fp8_")),
    ("GEMM", re.compile(r"gemm|cutlass|xmma|cublas|scaled_mm|marlin|nvjet|matmul|sm90_|wgmma")),
    ("norms, activations, rotary (fused)", re.compile(r"triton_|norm|act_and_mul|silu|rotary|elementwise|reduce")),
)
OTHER = "other kernels"
MEMCPY = "memory copies"
POOLER = "pooler and head"


@dataclass
class Breakdown:
    """Milliseconds per request: kernel time by part, the GPU's busy time, and (set by the caller) the wall time."""

    parts_ms: dict[str, float] = field(default_factory=dict)
    busy_ms: float = 0.0
    wall_ms: float = 0.0
    kernels: float = 0.0
    trace: str = ""
    # False for a trace with no GPU timeline (an engine on a CPU): no kernel time to sum, no GPU to sit idle.
    gpu: bool = True

    @property
    def idle_ms(self) -> float:
        return max(0.0, self.wall_ms - self.busy_ms)


def newest_trace(folder: Path, earlier: set[Path] | frozenset[Path] = frozenset()) -> Path:
    """The last trace written under `folder` by the engine's workers, leaving out the `earlier` ones."""
    traces = [p for p in folder.rglob("*") if p.is_file() and re.search(r"\.json(\.gz)?$", p.name) and p not in earlier]
    if not traces:
        raise FileNotFoundError(f"no profiler trace under {folder}")
    return max(traces, key=lambda p: p.stat().st_mtime)


def read_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def part_of(kernel_name: str) -> str:
    name = kernel_name.lower()
    return next((part for part, pattern in PARTS if pattern.search(name)), OTHER)


def kernel_breakdown(path: Path, *, requests: int) -> Breakdown:
    """Kernel and copy time in `path`, by part, per request; kernels inside the pooler's range count as its."""
    events = read_trace(path)
    pooler_windows = [
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("cat") == "gpu_user_annotation" and e.get("name") == POOLER_RANGE
    ]
    parts: dict[str, float] = {}
    busy = 0.0
    kernels = 0
    gpu = False
    for event in events:
        category = event.get("cat")
        if category not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        gpu = True
        duration = float(event.get("dur", 0))
        start = event.get("ts", 0)
        if any(low <= start < high for low, high in pooler_windows):
            part = POOLER
        elif category != "kernel":
            part = MEMCPY
        else:
            part = part_of(event.get("name", ""))
            kernels += 1
        parts[part] = parts.get(part, 0.0) + duration
        busy += duration
    scale = 1000.0 * requests  # microseconds in the trace -> ms per request
    return Breakdown(
        parts_ms={part: value / scale for part, value in sorted(parts.items(), key=lambda kv: -kv[1])},
        busy_ms=busy / scale,
        kernels=kernels / requests,
        trace=path.name,
        gpu=gpu,
    )
