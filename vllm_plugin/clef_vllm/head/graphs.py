"""One prompt's head forward on a GPU at the speed of its kernels: fixed shapes, then one CUDA graph per shape.

`JointSchemaHead.forward` issues a few hundred small kernels per prompt, and on a fast GPU launching them costs
several times what running them does. Here one record is laid out in fixed shapes (a `Bucket`: tokens, questions
and options each rounded up) so that the whole forward can be captured once per bucket and replayed with one
launch. The padding cannot reach a real logit:

- padded tokens are zero rows (what a longer record left there is cleared) that every attention over the memory
  masks with -inf (weight exactly 0) and that every span mean skips (its averaging row holds 0 there);
- padded options are rows that no question owns: options never see each other before the per-question summary,
  and that summary's softmax runs over the owning question's options only;
- padded questions are masked as keys in the fields' self-attention; their own rows are dropped.

The segment work is dense rather than scattered: a [spans, tokens] indicator matrix times the token states gives
every span's sum in one matrix product (fp32 accumulation, like the batched forward's index_add), and the
per-question softmax is a masked [questions, options] softmax. Both are deterministic, where atomics are not.

A record's bucket depends on the record alone and each call runs one record, so a request's answer does not
depend on what else is in flight.

`padded_logits` is that math run eagerly on any device (the tests hold it to the batched forward and the loop
form on the CPU); `GraphedHead` captures and replays it on CUDA and hands anything else to the batched forward.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import chain

import torch
from torch import Tensor

from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.model import JointSchemaHead
from clef_vllm.head.ops import decoder_layer, option_logits, routed_options

MIN_TOKENS = 256
# Longer prompts run the batched forward: their prefill dwarfs the head's launch overhead, and graphs that size
# would hold a few hundred MB each of input buffers and intermediates outside vLLM's memory budget.
MAX_TOKENS = 16384
MAX_GRAPHS = 48  # least recently used graphs beyond this are dropped (a capture takes about 0.1 s)


@dataclass(frozen=True, order=True)
class Bucket:
    """Padded sizes of one record: tokens, questions, options."""

    tokens: int
    questions: int
    options: int

    @property
    def spans(self) -> int:
        return self.questions + self.options

    @property
    def meta_size(self) -> int:
        # [length, questions] + span starts + span ends + each option's question + each question's type
        return 2 + 2 * self.spans + self.options + self.questions


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def bucket_for(length: int, questions: int, options: int) -> Bucket:
    """Four token buckets per octave (at most 25% padded tokens), powers of two for questions and options."""
    granule = max(MIN_TOKENS, 1 << max(0, (length - 1).bit_length() - 3))
    return Bucket(
        tokens=-(-length // granule) * granule,
        questions=_next_power_of_two(questions),
        options=max(2, _next_power_of_two(options)),
    )


def record_meta(length: int, schema: RecordSchema, bucket: Bucket) -> array:
    """The record's integers in the bucket's layout (see `Bucket.meta_size`); padding spans are empty.

    An int64 array: `torch.frombuffer` makes it a tensor several times faster than `torch.tensor` would.
    """
    q_pad = [0] * (bucket.questions - len(schema.question_types))
    o_pad = [0] * (bucket.options - schema.num_options)
    option_spans = list(chain.from_iterable(schema.option_spans))
    meta = array("q", (length, len(schema.question_types)))
    meta.extend([s for s, _ in schema.question_spans] + q_pad + [s for s, _ in option_spans] + o_pad)
    meta.extend([e for _, e in schema.question_spans] + q_pad + [e for _, e in option_spans] + o_pad)
    # Padded options belong to the question number `bucket.questions`, which does not exist.
    meta.extend(chain.from_iterable([q] * n for q, n in enumerate(schema.option_counts)))
    meta.extend([bucket.questions] * len(o_pad))
    meta.extend(schema.question_types)
    meta.extend(q_pad)
    return meta


def _meta_tensor(meta: array) -> Tensor:
    return torch.frombuffer(meta, dtype=torch.long)


def _span_sums(indicator: Tensor, rows: Tensor) -> Tensor:
    """indicator @ rows in fp32 (0/1 weights are exact in any dtype; only the accumulation needs fp32)."""
    if rows.dtype != torch.float32 and rows.is_cuda:
        try:
            return torch.mm(indicator.to(rows.dtype), rows, out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # a torch without the fp32-output matrix product
            pass
    return indicator.float() @ rows.float()


def _key_bias(valid: Tensor, keys: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[1, 1, 1, keys] additive mask: 0 for the first `valid` keys, -inf after (storage padded to 16 keys)."""
    stored = -(-keys // 16) * 16
    bias = torch.zeros(stored, dtype=dtype, device=device)
    bias.masked_fill_(torch.arange(stored, device=device) >= valid, -math.inf)
    return bias.view(1, 1, 1, stored)[..., :keys]


def _padded_forward(head: JointSchemaHead, hidden: Tensor, rows: Tensor, meta: Tensor, bucket: Bucket) -> Tensor:
    """Logits of every option slot of the bucket ([options]); only the record's own slots are meaningful.

    `hidden` [tokens, h] are the record's states then zero rows, `rows` the output-embedding row of each token,
    `meta` the ints of `record_meta` on the device. No shape depends on a value, so this can be captured.
    """
    dtype, device = head.dtype, hidden.device
    n_q, n_o, n_s = bucket.questions, bucket.options, bucket.spans
    length, questions = meta[0], meta[1]
    starts, ends, owners, types = meta[2:].split([n_s, n_s, n_o, n_q])
    owner_index = owners.clamp(max=n_q - 1)  # padded options read some question's rows and are dropped later

    normed = head.hidden_norm(hidden)
    memory = head.memory_projection(normed)
    last = normed.index_select(0, (length - 1).view(1))  # [1, h]
    memory_bias = _key_bias(length, bucket.tokens, dtype, device)

    positions = torch.arange(bucket.tokens, device=device)
    indicator = (positions >= starts[:, None]) & (positions < ends[:, None])  # [spans, tokens]
    counts = (ends - starts).clamp(min=1).float()[:, None]
    means = (_span_sums(indicator, normed) / counts).to(dtype)
    question, context = means[:n_q], means[n_q:]
    lexical = (_span_sums(indicator[n_q:], rows) / counts[n_q:]).to(dtype)

    options = routed_options(head, context, lexical, question, owner_index, memory, _OneRecord(memory_bias))

    field_query = head.question_projection(question)
    scores = (options.float() * field_query.float()[owner_index]).sum(-1) / math.sqrt(head.config.width)
    owned = owners[None, :] == torch.arange(n_q, device=device)[:, None]  # [questions, options]
    masked = scores[None].masked_fill(~owned, -math.inf)
    # A question slot with no options has peak -inf; the clamp keeps its row at 0 instead of NaN.
    peak = masked.amax(1, keepdim=True).clamp(min=torch.finfo(torch.float32).min)
    exps = (masked - peak).exp()
    weights = exps / exps.sum(1, keepdim=True).clamp(min=1.0)  # a real row's sum is >= 1 (its peak gives 1)
    summary = weights @ options.float()
    fields_ = (
        field_query
        + head.option_summary_norm(summary.to(dtype))
        + head.global_projection(last)
        + head.type_embedding(types)
    )

    field_bias = _key_bias(questions, n_q, dtype, device)
    padded = fields_[None]
    for layer in head.layers:
        padded = decoder_layer(layer, padded, lambda t: t[None], memory, field_bias, memory_bias)
    fields_ = head.field_norm(padded[0])

    return option_logits(head, fields_, options, lexical, question + last, owner_index)


@dataclass(frozen=True)
class _OneRecord:
    """The graphed forward's layout: one record, already padded to its bucket, as a batch of one."""

    memory_mask: Tensor

    def pad_options(self, flat: Tensor) -> Tensor:
        return flat[None]

    def pad_tokens(self, flat: Tensor) -> Tensor:
        return flat[None]

    def unpad_options(self, padded: Tensor) -> Tensor:
        return padded[0]


def _check_record(head: JointSchemaHead, hidden: Tensor, input_ids: Tensor, schema: RecordSchema) -> None:
    """The batched forward's input checks, for one record."""
    if hidden.ndim != 2 or hidden.shape[1] != head.config.hidden_size or input_ids.shape != hidden.shape[:1]:
        raise ValueError(
            f"expected hidden states [L, {head.config.hidden_size}] and ids [L], "
            f"got {tuple(hidden.shape)} and {tuple(input_ids.shape)}"
        )
    length = hidden.shape[0]
    spans = chain(schema.question_spans, chain.from_iterable(schema.option_spans))
    if max(end for _, end in spans) > length:
        raise ValueError(f"record 0 has a span past its {length} tokens")


def padded_logits(
    head: JointSchemaHead,
    hidden: Tensor,
    input_ids: Tensor,
    schema: RecordSchema,
    output_embeddings: Tensor,
    bucket: Bucket | None = None,
) -> Tensor:
    """One record's option logits through the fixed-shape math, run eagerly (default bucket: `bucket_for`)."""
    _check_record(head, hidden, input_ids, schema)
    length = hidden.shape[0]
    bucket = bucket or bucket_for(length, len(schema.question_types), schema.num_options)
    if bucket.tokens < length or bucket.questions < len(schema.question_types) or bucket.options < schema.num_options:
        raise ValueError(f"{bucket} is too small for a record of {length} tokens and {schema.option_counts} options")
    device, dtype = head.device, head.dtype
    padded_hidden = torch.zeros(bucket.tokens, hidden.shape[1], dtype=dtype, device=device)
    padded_hidden[:length] = hidden
    rows = torch.zeros(bucket.tokens, output_embeddings.shape[1], dtype=dtype, device=device)
    rows[:length] = output_embeddings.to(device)[input_ids.to(device)]
    meta = _meta_tensor(record_meta(length, schema, bucket)).to(device)
    return _padded_forward(head, padded_hidden, rows, meta, bucket)[: schema.num_options]


@dataclass
class _TokenBuffers:
    """Static inputs shared by every graph of one token bucket; `filled` rows may hold a past record."""

    hidden: Tensor
    rows: Tensor
    filled: int = 0


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    buffers: _TokenBuffers
    meta: Tensor
    host_meta: Tensor  # pinned staging for `meta`
    staged: torch.cuda.Event  # recorded after each copy out of `host_meta`
    logits: Tensor


class GraphedHead:
    """Runs one record's head forward: a replayed CUDA graph per bucket on CUDA, the batched forward elsewhere.

    Graphs read the head's parameters in place, so weights loaded later with `load_state_dict` are seen; moving
    the head to another device or dtype drops the graphs. Replays are serialized on the current stream.
    """

    def __init__(self, head: JointSchemaHead, *, max_tokens: int = MAX_TOKENS, max_graphs: int = MAX_GRAPHS) -> None:
        self.head = head
        self.max_tokens = max_tokens
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Bucket, _Captured] = OrderedDict()
        self._buffers: dict[int, _TokenBuffers] = {}
        self._pool: tuple[int, int] | None = None
        self._placement: tuple[torch.device, torch.dtype, int] | None = None

    @property
    def buckets(self) -> list[Bucket]:
        """Buckets with a captured graph, least recently used first."""
        return list(self._graphs)

    def clear(self) -> None:
        """Drop every graph and buffer (the memory returns to torch's caching allocator)."""
        self._graphs.clear()
        self._buffers.clear()
        self._pool = None

    def uses_graph(self, length: int) -> bool:
        """Whether a record of `length` tokens runs as a graph replay."""
        return self.head.device.type == "cuda" and length <= self.max_tokens and self.max_graphs > 0

    @torch.inference_mode()
    def __call__(self, hidden: Tensor, input_ids: Tensor, schema: RecordSchema, output_embeddings: Tensor) -> Tensor:
        """Option logits of one record, in the head's dtype (same contract as `JointSchemaHead.forward`)."""
        head = self.head
        length = int(hidden.shape[0])
        if not self.uses_graph(length):
            return head([hidden], [input_ids], [schema], output_embeddings)[0]
        _check_record(head, hidden, input_ids, schema)
        self._check_placement()
        bucket = bucket_for(length, len(schema.question_types), schema.num_options)
        meta = _meta_tensor(record_meta(length, schema, bucket))  # host work first, then the launches
        captured = self._graphs.get(bucket)
        if captured is None:
            captured = self._capture(bucket)
        else:
            self._graphs.move_to_end(bucket)

        buffers = captured.buffers
        device = head.device
        buffers.hidden[:length].copy_(hidden, non_blocking=True)
        ids = input_ids.to(device, non_blocking=True)
        table = output_embeddings.to(device, non_blocking=True)
        if table.dtype == buffers.rows.dtype:
            torch.index_select(table, 0, ids, out=buffers.rows[:length])
        else:
            buffers.rows[:length].copy_(table.index_select(0, ids))
        if buffers.filled > length:
            # Rows left by a longer record are masked, but 0 * inf would still be NaN: keep them zero.
            buffers.hidden[length : buffers.filled].zero_()
            buffers.rows[length : buffers.filled].zero_()
        buffers.filled = length
        # Through pinned memory, so the copy waits for nothing queued before it; the event guards the staging
        # buffer against being rewritten before the previous call's copy has read it.
        captured.staged.synchronize()
        captured.host_meta.copy_(meta)
        captured.meta.copy_(captured.host_meta, non_blocking=True)
        captured.staged.record()
        captured.graph.replay()
        return captured.logits[: schema.num_options].clone()

    def _check_placement(self) -> None:
        weight = self.head.hidden_norm.weight
        placement = (weight.device, weight.dtype, weight.data_ptr())
        if placement != self._placement:
            self.clear()
            self._placement = placement

    def _token_buffers(self, tokens: int) -> _TokenBuffers:
        buffers = self._buffers.get(tokens)
        if buffers is None:
            h, device, dtype = self.head.config.hidden_size, self.head.device, self.head.dtype
            buffers = _TokenBuffers(
                hidden=torch.zeros(tokens, h, dtype=dtype, device=device),
                rows=torch.zeros(tokens, h, dtype=dtype, device=device),
            )
            self._buffers[tokens] = buffers
        return buffers

    def _capture(self, bucket: Bucket) -> _Captured:
        while len(self._graphs) >= self.max_graphs:
            evicted, _ = self._graphs.popitem(last=False)
            if all(b.tokens != evicted.tokens for b in self._graphs):
                self._buffers.pop(evicted.tokens, None)
        head, device = self.head, self.head.device
        buffers = self._token_buffers(bucket.tokens)
        # Any valid record of the bucket will do for the warm-up and the capture: only the shapes are recorded.
        dummy = RecordSchema((0,), ((0, 1),), (((0, 1),),))
        meta = _meta_tensor(record_meta(1, dummy, bucket)).to(device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.device(device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # first runs off the capture: lazy library set-up, autotuning
                for _ in range(2):
                    _padded_forward(head, buffers.hidden, buffers.rows, meta, bucket)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = _padded_forward(head, buffers.hidden, buffers.rows, meta, bucket)
        captured = _Captured(
            graph=graph,
            buffers=buffers,
            meta=meta,
            host_meta=torch.empty(bucket.meta_size, dtype=torch.long, pin_memory=True),
            staged=torch.cuda.Event(),
            logits=logits,
        )
        self._graphs[bucket] = captured
        return captured
