"""The head benchmark's results and their markdown report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clef_quant.bench.timing import PROFILED_RUNS, SETTLE_S
from clef_quant.formatting import facts_table, markdown_table
from clef_vllm.head.files import HeadConfig


@dataclass(frozen=True)
class HeadBenchRow:
    shape: str
    questions: int
    options: int
    vectorized_ms: float
    fast_ms: float
    kernel_ms: float | None  # device time of the fast path's kernels per call (GPU only)
    loop_ms: float
    max_abs_diff: float  # vectorized vs loop
    fast_diff: float  # fast vs vectorized
    fast_loop_diff: float  # fast vs loop
    # bf16 only: each form against the same head and inputs in fp32 (the size of bf16 rounding here)
    vectorized_ref_diff: float | None = None
    fast_ref_diff: float | None = None

    @property
    def speedup(self) -> float:
        return self.loop_ms / self.vectorized_ms

    @property
    def fast_speedup(self) -> float:
        return self.loop_ms / self.fast_ms


@dataclass(frozen=True)
class StepRow:
    """One mimicked pooler step: `records` head calls, synchronized once at the end."""

    records: int
    vectorized_ms: float
    fast_ms: float


@dataclass(frozen=True)
class HeadBenchResult:
    device: str
    dtype: str
    machine: str
    torch_version: str
    date: str
    tokens: int
    vocab_rows: int
    config: HeadConfig
    repeats: int
    warmup: int
    seed: int
    load: str  # the host's load average at the start: other work on a shared CPU slows the numbers
    rows: tuple[HeadBenchRow, ...]
    step: StepRow | None = None


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_markdown(result: HeadBenchResult, command: str) -> str:
    c = result.config
    with_ref = any(row.vectorized_ref_diff is not None for row in result.rows)
    facts = {
        "machine": result.machine,
        "device, dtype": f"{result.device}, {result.dtype}",
        "torch": result.torch_version,
        "date": result.date,
        "command": f"`{command}`",
        "head": f"hidden {c.hidden_size}, width {c.width}, routing layers {c.routing_layers}, "
        f"layers {c.layers}, heads {c.heads}, feedforward {c.feedforward}; random weights (seed {result.seed})",
        "record": f"one record of {result.tokens} tokens, {result.vocab_rows} output-embedding rows",
        "timing": f"median of {result.repeats} runs after {result.warmup} warm-up runs of the vectorized "
        f"and fast forms (on a GPU at least {SETTLE_S} s of warm-up for each form), perf_counter, device "
        "synchronized around each run",
        "load": result.load,
    }
    lines = [
        *facts_table("Joint schema head: batched forward, fast path and loop form", facts),
        "",
        "`vectorized` is `JointSchemaHead.forward`; `fast` is `clef_vllm.head.graphs.GraphedHead`, what the "
        "pooler calls (on CUDA a CUDA graph replay per shape bucket, elsewhere the vectorized forward); `loop` "
        "is `clef_quant.head_loop.loop_logits`, the release's loop form (one attention call over the whole "
        "memory per option and layer). `GPU kernel ms` is the device time of the fast path's kernels and device "
        f"copies per call, from torch.profiler over {PROFILED_RUNS} calls: the floor its wall time can approach. "
        "Diffs are the largest absolute differences between two forms' logits on the same inputs.",
        "",
    ]
    header = [
        "shape",
        "questions",
        "options",
        "vectorized ms",
        "fast ms",
        "GPU kernel ms",
        "loop ms",
        "loop / vectorized",
        "loop / fast",
        "diff vectorized-loop",
        "diff fast-vectorized",
        "diff fast-loop",
    ]
    if with_ref:
        header += ["diff vectorized-fp32", "diff fast-fp32"]
    rows = []
    for row in result.rows:
        cells = [
            row.shape,
            str(row.questions),
            str(row.options),
            _ms(row.vectorized_ms),
            _ms(row.fast_ms),
            _ms(row.kernel_ms),
            _ms(row.loop_ms),
            f"{row.speedup:.1f}x",
            f"{row.fast_speedup:.1f}x",
            f"{row.max_abs_diff:.2e}",
            f"{row.fast_diff:.2e}",
            f"{row.fast_loop_diff:.2e}",
        ]
        if with_ref:
            cells += [f"{row.vectorized_ref_diff:.2e}", f"{row.fast_ref_diff:.2e}"]
        rows.append(cells)
    lines.append(markdown_table(header, rows))
    if with_ref:
        lines += [
            "",
            f"`-fp32` diffs compare each {result.dtype} form with the same head and inputs in fp32 (vectorized "
            f"forward): the rounding of {result.dtype} itself, the scale against which the fast-vectorized diff "
            "is to be read.",
        ]
    if result.step is not None:
        step = result.step
        lines += [
            "",
            f"A pooler step: {step.records} fresh records of {result.tokens} tokens (the shapes above in turn), "
            "one head call each, the device synchronized once at the end:",
            "",
            markdown_table(
                ["records", "vectorized ms", "fast ms"],
                [[step.records, f"{step.vectorized_ms:.2f}", f"{step.fast_ms:.2f}"]],
                "rrr",
            ),
        ]
    return "\n".join(lines) + "\n"


def bench_command(
    device: str, dtype: str, repeats: int, warmup: int, out: Path, program: str = "clef-quant bench head"
) -> str:
    """The command line that reproduces a run, as recorded in the report."""
    return f"{program} --device {device} --dtype {dtype} --repeats {repeats} --warmup {warmup} --out {out}"
