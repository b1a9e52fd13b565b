"""Benchmark of the joint schema head: the batched forward and the graphed fast path against the loop form.

Random weights at clef-flash's head sizes on one random record of 3,000 tokens; what matters is the cost of
the head's structure (memory attention per option, per-question reductions), not the values. Each shape is
timed as a median over repeats after warmups, and the forms' logits are compared on the same inputs. On a GPU
the profiler also counts the device time of the fast path's kernels, the floor its wall time can approach, and
a pooler step is mimicked: 8 records, one head call each, one synchronization at the end.

`run_head_bench` returns the numbers and `render_markdown` the report; `clef-quant bench head` renders both.
`python -m clef_quant.bench.head` does the same with only torch, safetensors and pydantic installed (for bare GPU
machines).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from clef_quant.bench.environment import load_average, machine_name
from clef_quant.head_loop import loop_logits
from clef_vllm.head import JointSchemaHead
from clef_vllm.head_files import HeadConfig
from clef_vllm.head_graphs import GraphedHead
from clef_vllm.schema import RecordSchema

FLASH_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)
RECORD_TOKENS = 3000
VOCAB_ROWS = 16384  # only rows of option tokens are read, so the full 248,320 rows would change nothing
SETTLE_S = 0.5
STEP_RECORDS = 8  # records in the mimicked pooler step
PROFILED_RUNS = 10
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class BenchShape:
    """A record's schema: one type id and one option count per question."""

    name: str
    types: tuple[int, ...]
    options: tuple[int, ...]


SHAPES = (
    BenchShape("1 choice x 77 options", (1,), (77,)),
    BenchShape("3 mixed (choice 4, noul, score 5)", (1, 0, 2), (4, 2, 5)),
    BenchShape("49 noul x 2 options", (0,) * 49, (2,) * 49),
)


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


def bench_record(
    shape: BenchShape, tokens: int, hidden_size: int, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, RecordSchema]:
    """A random record laid out like an encoded request: state first, then the schema fields at the end."""

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    question_spans, option_spans = [], []
    pos = 0
    for count in shape.options:
        pos += 10  # "\nFIELD i\nID: ...\nTYPE: ...\nINSTRUCTION: "
        length = draw(3, 11)
        question_spans.append((pos, pos + length))
        pos += length + 5  # "\nALLOWED OPTIONS:\n"
        spans = []
        for _ in range(count):
            pos += 4  # "OPTION j: "
            length = draw(4, 17)
            spans.append((pos, pos + length))
            pos += length + 1
        option_spans.append(tuple(spans))
        pos += 3  # "END FIELD\n"
    schema_start = tokens - pos - 20  # room for the suffix
    if schema_start < 100:
        raise ValueError(f"{shape.name} needs about {pos + 120} tokens; the record has {tokens}")
    schema = RecordSchema(
        question_types=shape.types,
        question_spans=tuple((s + schema_start, e + schema_start) for s, e in question_spans),
        option_spans=tuple(tuple((s + schema_start, e + schema_start) for s, e in q) for q in option_spans),
    )
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    ids = torch.randint(0, vocab, (tokens,), generator=generator)
    return hidden, ids, schema


def _timed(func: Callable[[], torch.Tensor], device: torch.device, runs: int, warmup: int) -> list[float]:
    """Milliseconds of each run; the device is synchronized around every run so queued work is counted.

    On a GPU the warm-up also lasts at least SETTLE_S: an idle card starts at a low clock, and a forward of a
    few milliseconds would otherwise be timed while the clock ramps up.
    """
    start = time.perf_counter()
    done = 0
    while done < warmup or (device.type == "cuda" and time.perf_counter() - start < SETTLE_S):
        func()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        done += 1
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        func()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _kernel_ms(func: Callable[[], torch.Tensor], device: torch.device, runs: int = PROFILED_RUNS) -> float | None:
    """Device time of the kernels (and device copies) one call runs, from the profiler; None off the GPU."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(runs):
            func()
        torch.cuda.synchronize(device)
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return total_us / runs / 1e3 if total_us else None


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@torch.inference_mode()
def run_head_bench(
    *,
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 5,
    warmup: int = 1,
    tokens: int = RECORD_TOKENS,
    vocab: int = VOCAB_ROWS,
    config: HeadConfig = FLASH_HEAD,
    shapes: Sequence[BenchShape] = SHAPES,
    seed: int = 0,
    on_step: Callable[[str], None] | None = None,
) -> HeadBenchResult:
    """Time `JointSchemaHead.forward`, `GraphedHead` and `loop_logits` on the same random head and records."""
    target = torch.device(device)
    torch_dtype = DTYPES[dtype]
    notify = on_step or (lambda _message: None)
    load = load_average()
    notify("building a random head")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = JointSchemaHead(config)
    head = head.to(target).eval()
    # Below fp32, the same head in fp32 measures how far rounding alone moves the logits.
    reference = None if torch_dtype == torch.float32 else head
    if reference is not None:
        head = copy.deepcopy(reference).to(torch_dtype)
    fast_head = GraphedHead(head)
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(vocab, config.hidden_size, generator=generator).to(target)
    exact_embeddings, embeddings = embeddings, embeddings.to(torch_dtype)

    records = []
    for shape in shapes:
        hidden, ids, schema = bench_record(shape, tokens, config.hidden_size, vocab, generator)
        records.append((hidden.to(target), ids.to(target), schema))
    diffs = []
    for shape, (hidden, ids, schema) in zip(shapes, records, strict=True):
        notify(f"{shape.name}: comparing the forms")
        low = hidden.to(torch_dtype)
        vectorized = head([low], [ids], [schema], embeddings)[0]
        fast = fast_head(low, ids, schema, embeddings)
        looped = loop_logits(head, low, ids, schema, embeddings)
        ref_diffs: tuple[float | None, float | None] = (None, None)
        if reference is not None:
            exact = reference([hidden], [ids], [schema], exact_embeddings)[0]
            ref_diffs = (_max_diff(vectorized, exact), _max_diff(fast, exact))
        diffs.append((_max_diff(vectorized, looped), _max_diff(fast, vectorized), _max_diff(fast, looped), *ref_diffs))
    records = [(hidden.to(torch_dtype), ids, schema) for hidden, ids, schema in records]

    rows = []
    for shape, (hidden, ids, schema), diff in zip(shapes, records, diffs, strict=True):
        notify(f"{shape.name}: timing the vectorized form")
        vectorized = _timed(
            lambda h=hidden, i=ids, s=schema: head([h], [i], [s], embeddings)[0], target, repeats, warmup
        )
        notify(f"{shape.name}: timing the fast path")
        fast_call = lambda h=hidden, i=ids, s=schema: fast_head(h, i, s, embeddings)  # noqa: E731
        fast = _timed(fast_call, target, repeats, warmup)
        kernel = _kernel_ms(fast_call, target)
        notify(f"{shape.name}: timing the loop form")
        slow = _timed(lambda h=hidden, i=ids, s=schema: loop_logits(head, h, i, s, embeddings), target, repeats, 0)
        rows.append(
            HeadBenchRow(
                shape=shape.name,
                questions=len(shape.types),
                options=sum(shape.options),
                vectorized_ms=statistics.median(vectorized),
                fast_ms=statistics.median(fast),
                kernel_ms=kernel,
                loop_ms=statistics.median(slow),
                max_abs_diff=diff[0],
                fast_diff=diff[1],
                fast_loop_diff=diff[2],
                vectorized_ref_diff=diff[3],
                fast_ref_diff=diff[4],
            )
        )

    step = None
    if target.type == "cuda":
        notify(f"a pooler step: {STEP_RECORDS} records, one call each")
        batch = []
        for i in range(STEP_RECORDS):  # fresh records: the same shapes, other spans and states
            hidden, ids, schema = bench_record(shapes[i % len(shapes)], tokens, config.hidden_size, vocab, generator)
            batch.append((hidden.to(target, torch_dtype), ids.to(target), schema))

        def one_call_each(call: Callable[[torch.Tensor, torch.Tensor, RecordSchema], torch.Tensor]) -> torch.Tensor:
            return torch.cat([call(h, i, s) for h, i, s in batch])

        step_vectorized = _timed(
            lambda: one_call_each(lambda h, i, s: head([h], [i], [s], embeddings)[0]), target, repeats, warmup
        )
        step_fast = _timed(
            lambda: one_call_each(lambda h, i, s: fast_head(h, i, s, embeddings)), target, repeats, warmup
        )
        step = StepRow(STEP_RECORDS, statistics.median(step_vectorized), statistics.median(step_fast))
    return HeadBenchResult(
        device=device,
        dtype=dtype,
        machine=machine_name(target),
        torch_version=torch.__version__,
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        tokens=tokens,
        vocab_rows=vocab,
        config=config,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        load=load,
        rows=tuple(rows),
        step=step,
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_markdown(result: HeadBenchResult, command: str) -> str:
    c = result.config
    with_ref = any(row.vectorized_ref_diff is not None for row in result.rows)
    lines = [
        "# Joint schema head: batched forward, fast path and loop form",
        "",
        "| | |",
        "|---|---|",
        f"| machine | {result.machine} |",
        f"| device, dtype | {result.device}, {result.dtype} |",
        f"| torch | {result.torch_version} |",
        f"| date | {result.date} |",
        f"| command | `{command}` |",
        f"| head | hidden {c.hidden_size}, width {c.width}, routing layers {c.routing_layers}, "
        f"layers {c.layers}, heads {c.heads}, feedforward {c.feedforward}; "
        f"random weights (seed {result.seed}) |",
        f"| record | one record of {result.tokens} tokens, {result.vocab_rows} output-embedding rows |",
        f"| timing | median of {result.repeats} runs after {result.warmup} warm-up runs of the vectorized "
        f"and fast forms (on a GPU at least {SETTLE_S} s of warm-up for each form), perf_counter, device "
        "synchronized around each run |",
        f"| load | {result.load} |",
        "",
        "`vectorized` is `JointSchemaHead.forward`; `fast` is `clef_vllm.head_graphs.GraphedHead`, what the "
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
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
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
        lines.append("| " + " | ".join(cells) + " |")
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
            "| records | vectorized ms | fast ms |",
            "|---:|---:|---:|",
            f"| {step.records} | {step.vectorized_ms:.2f} | {step.fast_ms:.2f} |",
        ]
    return "\n".join(lines) + "\n"


def bench_command(
    device: str, dtype: str, repeats: int, warmup: int, out: Path, program: str = "clef-quant bench head"
) -> str:
    """The command line that reproduces a run, as recorded in the report."""
    return f"{program} --device {device} --dtype {dtype} --repeats {repeats} --warmup {warmup} --out {out}"


def _main() -> None:
    """Plain entry for machines that have torch but not the CLI's packages."""
    parser = argparse.ArgumentParser(prog="python -m clef_quant.bench.head", description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or Path(f"bench/results/head-{args.device}.md")
    result = run_head_bench(
        device=args.device, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup, on_step=print
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    command = bench_command(args.device, args.dtype, args.repeats, args.warmup, out, parser.prog)
    out.write_text(render_markdown(result, command), encoding="utf-8")
    print(out.read_text(encoding="utf-8"))


if __name__ == "__main__":
    _main()
