"""The head's fixed-shape fast path: the same logits as the batched forward and the loop form, padding that
cannot reach a real logit, and (on CUDA) graph replays that equal the eager math."""

from __future__ import annotations

import pytest
import torch
from test_head import CONFIG, TOLERANCE, VOCAB, make_head, make_record

from clef_quant.head_loop import loop_logits
from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.graphs import (
    MIN_TOKENS,
    Bucket,
    GraphedHead,
    _padded_forward,
    bucket_for,
    padded_logits,
    record_meta,
)
from clef_vllm.head.model import JointSchemaHead

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# (seed, options per question, longest span, state tokens before the schema): 1 to 64 questions, 2 to 256
# options, records from 16 to about 17,000 tokens (past the graphs' limit), counts on and just past powers of two.
SHAPES = [
    (0, [2], 1, 5),  # 16 tokens
    (1, [4, 2, 5], 5, 900),
    (2, [3, 1, 2, 7, 2, 1, 9], 3, 250),  # 360 tokens in a bucket of 512
    (3, [2] * 33, 4, 40),
    (4, [2] * 64, 2, 3000),
    (5, [256], 3, 15_000),  # 1 x 256 options, about 16,000 tokens
    (6, [5] * 13 + [129], 6, 16_000),  # the longest, options past a power of two
]


def test_buckets_pad_little_and_stay_aligned() -> None:
    for length in [1, 16, 255, 256, 257, 1000, 3000, 4096, 4097, 16_384, 20_000]:
        bucket = bucket_for(length, 3, 11)
        assert bucket.tokens >= length and bucket.tokens % MIN_TOKENS == 0
        assert bucket.tokens < length + MIN_TOKENS or bucket.tokens <= 1.25 * length
    assert bucket_for(3000, 49, 98) == Bucket(3072, 64, 128)
    assert bucket_for(3000, 1, 77) == Bucket(3072, 1, 128)
    assert bucket_for(16, 1, 1) == Bucket(256, 1, 2)


@pytest.mark.parametrize(("seed", "options", "max_span", "state"), SHAPES)
def test_padded_math_matches_forward_and_loop(
    head: JointSchemaHead, embeddings: torch.Tensor, seed: int, options: list[int], max_span: int, state: int
) -> None:
    hidden, ids, schema = make_record(seed, options, max_span=max_span, state=state)
    with torch.inference_mode():
        fast = padded_logits(head, hidden, ids, schema, embeddings)
        batched = head([hidden], [ids], [schema], embeddings)[0]
        slow = loop_logits(head, hidden, ids, schema, embeddings)
    assert fast.shape == (sum(options),)
    assert float((fast - batched).abs().max()) <= TOLERANCE
    assert float((fast - slow).abs().max()) <= TOLERANCE
    assert float(fast.std()) > 0.1


def test_more_padding_changes_nothing(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    hidden, ids, schema = make_record(8, [3, 2, 4], state=30)
    with torch.inference_mode():
        tight = padded_logits(head, hidden, ids, schema, embeddings)
        loose = padded_logits(head, hidden, ids, schema, embeddings, Bucket(hidden.shape[0] + 500, 64, 256))
    assert float((tight - loose).abs().max()) <= TOLERANCE
    with pytest.raises(ValueError, match="too small"):
        padded_logits(head, hidden, ids, schema, embeddings, Bucket(hidden.shape[0], 2, 256))


def test_padding_content_cannot_reach_a_logit(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    """Whatever the padded token rows hold (here large random values), the record's logits are the same."""
    hidden, ids, schema = make_record(9, [4, 2, 5], state=20)
    length = hidden.shape[0]
    bucket = bucket_for(length, 3, 11)
    meta = torch.tensor(record_meta(length, schema, bucket).tolist())
    padded_hidden = torch.zeros(bucket.tokens, CONFIG.hidden_size)
    padded_hidden[:length] = hidden
    rows = torch.zeros(bucket.tokens, CONFIG.hidden_size)
    rows[:length] = embeddings[ids]
    with torch.inference_mode():
        clean = _padded_forward(head, padded_hidden, rows, meta, bucket)[: schema.num_options]
        padded_hidden[length:] = 1e4 * torch.randn(bucket.tokens - length, CONFIG.hidden_size)
        rows[length:] = 1e4 * torch.randn(bucket.tokens - length, CONFIG.hidden_size)
        dirty = _padded_forward(head, padded_hidden, rows, meta, bucket)[: schema.num_options]
    assert torch.isfinite(dirty).all()
    assert float((clean - dirty).abs().max()) <= 1e-6


def test_bfloat16_stays_within_bfloat16_rounding(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    """In bf16 the fast math is as far from fp32 as the batched forward is, and close to that forward."""
    half = make_head().to(torch.bfloat16)
    worst_batched = worst_fast = worst_between = 0.0
    with torch.inference_mode():
        for seed, options in [(20, [4, 2, 5]), (21, [2] * 9), (22, [40])]:
            hidden, ids, schema = make_record(seed, options, state=300)
            exact = head([hidden], [ids], [schema], embeddings)[0]
            batched = half([hidden.bfloat16()], [ids], [schema], embeddings.bfloat16())[0].float()
            fast = padded_logits(half, hidden.bfloat16(), ids, schema, embeddings.bfloat16()).float()
            worst_batched = max(worst_batched, float((batched - exact).abs().max()))
            worst_fast = max(worst_fast, float((fast - exact).abs().max()))
            worst_between = max(worst_between, float((fast - batched).abs().max()))
    assert 0 < worst_batched < 0.5
    assert worst_fast <= 2 * worst_batched
    assert worst_between <= 2 * worst_batched


def test_graphed_head_off_cuda_is_the_batched_forward(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    hidden, ids, schema = make_record(11, [3, 3], state=10)
    runner = GraphedHead(head)
    with torch.inference_mode():
        assert torch.equal(runner(hidden, ids, schema, embeddings), head([hidden], [ids], [schema], embeddings)[0])
    assert runner.buckets == []
    with pytest.raises(ValueError, match="span past its"):
        runner(hidden[:-4], ids[:-4], schema, embeddings)


def test_bad_records_are_refused(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    hidden, ids, schema = make_record(7, [2])
    with pytest.raises(ValueError, match="span past its"):
        padded_logits(head, hidden[:-4], ids[:-4], schema, embeddings)
    with pytest.raises(ValueError, match="expected hidden states"):
        padded_logits(head, hidden[:, :-1], ids, schema, embeddings)


# --- CUDA: graphs ---------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize(("seed", "options", "max_span", "state"), SHAPES)
def test_graphs_match_forward_and_loop_on_cuda(
    embeddings: torch.Tensor, seed: int, options: list[int], max_span: int, state: int
) -> None:
    gpu = make_head().cuda()
    table = embeddings.cuda()
    runner = GraphedHead(gpu)
    hidden, ids, schema = make_record(seed, options, max_span=max_span, state=state)
    hidden, ids = hidden.cuda(), ids.cuda()
    with torch.inference_mode():
        first = runner(hidden, ids, schema, table)
        again = runner(hidden, ids, schema, table)  # a replay of the graph the first call captured
        batched = gpu([hidden], [ids], [schema], table)[0]
        slow = loop_logits(gpu, hidden, ids, schema, table)
    graphed = hidden.shape[0] <= runner.max_tokens  # longer records take the batched forward
    assert runner.buckets == ([bucket_for(hidden.shape[0], len(options), sum(options))] if graphed else [])
    assert torch.equal(first, again) or not graphed  # a replay repeats itself bit for bit
    assert float((first - batched).abs().max()) <= TOLERANCE
    assert float((first - slow).abs().max()) <= TOLERANCE


@needs_cuda
def test_graph_replays_forget_the_previous_record(embeddings: torch.Tensor) -> None:
    """A longer record left in the bucket's buffers (even a non-finite one) never reaches a shorter one."""
    gpu = make_head().cuda()
    table = embeddings.cuda()
    runner = GraphedHead(gpu)
    short = make_record(40, [2, 2], state=40)
    long = make_record(41, [2, 2], state=150)
    assert short[0].shape[0] < long[0].shape[0]
    assert bucket_for(short[0].shape[0], 2, 4) == bucket_for(long[0].shape[0], 2, 4)
    poisoned = long[0].clone()
    poisoned[-30:] = float("nan")
    with torch.inference_mode():
        alone = runner(short[0].cuda(), short[1].cuda(), short[2], table)
        assert torch.isnan(runner(poisoned.cuda(), long[1].cuda(), long[2], table)).any()
        after = runner(short[0].cuda(), short[1].cuda(), short[2], table)
    assert torch.equal(alone, after)


@needs_cuda
def test_graphs_read_weights_loaded_after_capture(embeddings: torch.Tensor) -> None:
    gpu = make_head(seed=1).cuda()
    table = embeddings.cuda()
    runner = GraphedHead(gpu)
    hidden, ids, schema = (t.cuda() if isinstance(t, torch.Tensor) else t for t in make_record(42, [4, 2]))
    with torch.inference_mode():
        runner(hidden, ids, schema, table)
        gpu.load_state_dict(make_head(seed=0).state_dict())
        graphed = runner(hidden, ids, schema, table)
        batched = gpu([hidden], [ids], [schema], table)[0]
    assert float((graphed - batched).abs().max()) <= TOLERANCE


@needs_cuda
def test_graphs_in_bfloat16_stay_within_rounding(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    half = make_head().cuda().to(torch.bfloat16)
    runner = GraphedHead(half)
    table = embeddings.cuda().bfloat16()
    with torch.inference_mode():
        for seed, options in [(50, [4, 2, 5]), (51, [2] * 20), (52, [77])]:
            hidden, ids, schema = make_record(seed, options, state=2000)
            exact = head([hidden], [ids], [schema], embeddings)[0]
            low = hidden.cuda().bfloat16()
            batched = half([low], [ids.cuda()], [schema], table)[0].float().cpu()
            graphed = runner(low, ids.cuda(), schema, table).float().cpu()
            noise = float((batched - exact).abs().max())
            assert float((graphed - exact).abs().max()) <= 2 * noise + 1e-3
            assert float((graphed - batched).abs().max()) <= 2 * noise + 1e-3


def test_record_meta_layout() -> None:
    schema = RecordSchema((1, 0), ((2, 4), (9, 10)), (((5, 6), (6, 8)), ((11, 12),)))
    bucket = Bucket(256, 4, 4)
    meta = record_meta(20, schema, bucket)
    assert len(meta) == bucket.meta_size
    assert meta.tolist() == [20, 2, 2, 9, 0, 0, 5, 6, 11, 0, 4, 10, 0, 0, 6, 8, 12, 0, 0, 0, 1, 4, 1, 0, 0, 0]


def test_bench_head_reports_the_fast_path() -> None:
    """`bench head` times the fast path beside the other forms and compares all three on the same inputs."""
    from clef_quant.bench.head import run_head_bench
    from clef_quant.bench.head_report import render_markdown
    from clef_quant.bench.head_workload import BenchShape

    shapes = [BenchShape("2 questions", (1, 0), (3, 2))]
    for dtype in ("float32", "bfloat16"):
        result = run_head_bench(dtype=dtype, repeats=1, warmup=0, tokens=300, vocab=VOCAB, config=CONFIG, shapes=shapes)
        (row,) = result.rows
        assert row.fast_ms > 0 and row.kernel_ms is None and result.step is None  # no GPU here
        report = render_markdown(result, "clef-quant bench head")
        assert "| fast ms | GPU kernel ms |" in report and "| 2 questions | 2 | 5 |" in report
        if dtype == "float32":
            assert max(row.max_abs_diff, row.fast_diff, row.fast_loop_diff) <= TOLERANCE
            assert row.vectorized_ref_diff is None and "diff fast-fp32" not in report
        else:
            assert 0 < row.vectorized_ref_diff < 0.5 and "diff fast-fp32" in report
