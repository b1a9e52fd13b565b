"""Benchmark of the joint schema head: the batched forward against the release's loop form.

Random weights at clef-flash's head sizes on one random record of 3,000 tokens; what matters is the cost of
the head's structure (memory attention per option, per-question reductions), not the values. Each shape is
timed as a median over repeats after warmups, and the two forms' logits are compared on the same inputs.

`run_head_bench` returns the numbers and `render_markdown` the report; `clef-quant bench head` renders both.
`python -m clef_quant.bench.head` does the same with only torch installed (for bare GPU machines).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from clef_quant.bench.environment import load_average, machine_name
from clef_quant.head_loop import loop_logits
from clef_vllm.head import HeadConfig, JointSchemaHead, RecordSchema

FLASH_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)
RECORD_TOKENS = 3000
VOCAB_ROWS = 16384  # only rows of option tokens are read, so the full 248,320 rows would change nothing
SETTLE_S = 0.5
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
    loop_ms: float
    max_abs_diff: float

    @property
    def speedup(self) -> float:
        return self.loop_ms / self.vectorized_ms


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
    """Time `JointSchemaHead.forward` and `loop_logits` on the same random head and records."""
    target = torch.device(device)
    torch_dtype = DTYPES[dtype]
    notify = on_step or (lambda _message: None)
    load = load_average()
    notify("building a random head")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = JointSchemaHead(config)
    head = head.to(device=target, dtype=torch_dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(vocab, config.hidden_size, generator=generator).to(target, torch_dtype)

    records = []
    for shape in shapes:
        hidden, ids, schema = bench_record(shape, tokens, config.hidden_size, vocab, generator)
        records.append((hidden.to(target, torch_dtype), ids.to(target), schema))
    diffs = []
    for shape, (hidden, ids, schema) in zip(shapes, records, strict=True):
        notify(f"{shape.name}: comparing the two forms")
        vectorized = head([hidden], [ids], [schema], embeddings)[0]
        looped = loop_logits(head, hidden, ids, schema, embeddings)
        diffs.append(float((vectorized.float() - looped.float()).abs().max()))

    rows = []
    for shape, (hidden, ids, schema), diff in zip(shapes, records, diffs, strict=True):
        notify(f"{shape.name}: timing the vectorized form")
        fast = _timed(lambda h=hidden, i=ids, s=schema: head([h], [i], [s], embeddings)[0], target, repeats, warmup)
        notify(f"{shape.name}: timing the loop form")
        slow = _timed(lambda h=hidden, i=ids, s=schema: loop_logits(head, h, i, s, embeddings), target, repeats, 0)
        rows.append(
            HeadBenchRow(
                shape=shape.name,
                questions=len(shape.types),
                options=sum(shape.options),
                vectorized_ms=statistics.median(fast),
                loop_ms=statistics.median(slow),
                max_abs_diff=diff,
            )
        )
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
    )


def render_markdown(result: HeadBenchResult, command: str) -> str:
    c = result.config
    lines = [
        "# Joint schema head: batched forward vs loop form",
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
        f"form (on a GPU at least {SETTLE_S} s of warm-up for each form), perf_counter, device synchronized "
        "around each run |",
        f"| load | {result.load} |",
        "",
        "`vectorized` is `JointSchemaHead.forward`; `loop` is `clef_quant.head_loop.loop_logits`, the "
        "release's loop form (one attention call over the whole memory per option and layer). "
        "The diff is the largest absolute difference between the two forms' logits on the same inputs.",
        "",
        "| shape | questions | options | vectorized ms | loop ms | loop / vectorized | max abs logit diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result.rows:
        lines.append(
            f"| {row.shape} | {row.questions} | {row.options} | {row.vectorized_ms:.2f} | {row.loop_ms:.2f} "
            f"| {row.speedup:.1f}x | {row.max_abs_diff:.2e} |"
        )
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
