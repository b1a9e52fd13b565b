"""Benchmark of the joint schema head: the batched forward and the graphed fast path against the loop form.

Random weights at clef-flash's head sizes on one random record of 3,000 tokens; what matters is the cost of
the head's structure (memory attention per option, per-question reductions), not the values. Each shape is
timed as a median over repeats after warmups, and the forms' logits are compared on the same inputs. On a GPU
the profiler also counts the device time of the fast path's kernels, the floor its wall time can approach, and
a pooler step is mimicked: 8 records, one head call each, one synchronization at the end.

`run_head_bench` returns the numbers and `head_report.render_markdown` the report; `clef-quant bench head` writes both.
On bare GPU machines that carry our packages on PYTHONPATH, `python -m clef_quant bench head ARGS` runs the same
command without the `clef-quant` script: it needs torch, safetensors, pydantic, pyyaml, regex, typer and rich, not
transformers, vLLM or llm-compressor.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence

import torch

from clef_quant.bench.environment import load_average, machine_name
from clef_quant.bench.head_report import HeadBenchResult, HeadBenchRow, StepRow
from clef_quant.bench.head_workload import (
    DTYPES,
    FLASH_HEAD,
    RECORD_TOKENS,
    SHAPES,
    STEP_RECORDS,
    VOCAB_ROWS,
    BenchShape,
    bench_record,
)
from clef_quant.bench.timing import kernel_ms, timed_ms
from clef_quant.formatting import utc_minute
from clef_quant.head_loop import loop_logits
from clef_quant.progress import Progress, Stages
from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.files import HeadConfig
from clef_vllm.head.graphs import GraphedHead
from clef_vllm.head.model import JointSchemaHead


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
    progress: Progress | None = None,
) -> HeadBenchResult:
    """Time `JointSchemaHead.forward`, `GraphedHead` and `loop_logits` on the same random head and records."""
    target = torch.device(device)
    torch_dtype = DTYPES[dtype]
    notify = Stages(progress)
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
        vectorized = timed_ms(
            lambda h=hidden, i=ids, s=schema: head([h], [i], [s], embeddings)[0], target, repeats, warmup
        )
        notify(f"{shape.name}: timing the fast path")
        fast_call = lambda h=hidden, i=ids, s=schema: fast_head(h, i, s, embeddings)  # noqa: E731
        fast = timed_ms(fast_call, target, repeats, warmup)
        kernel = kernel_ms(fast_call, target)
        notify(f"{shape.name}: timing the loop form")
        slow = timed_ms(lambda h=hidden, i=ids, s=schema: loop_logits(head, h, i, s, embeddings), target, repeats, 0)
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

        step_vectorized = timed_ms(
            lambda: one_call_each(lambda h, i, s: head([h], [i], [s], embeddings)[0]), target, repeats, warmup
        )
        step_fast = timed_ms(
            lambda: one_call_each(lambda h, i, s: fast_head(h, i, s, embeddings)), target, repeats, warmup
        )
        step = StepRow(STEP_RECORDS, statistics.median(step_vectorized), statistics.median(step_fast))
    notify.done()
    return HeadBenchResult(
        device=device,
        dtype=dtype,
        machine=machine_name(target),
        torch_version=torch.__version__,
        date=utc_minute(),
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
