"""The joint schema head: one logit per allowed option of every question, from one prefill's hidden states.

The module's parameter names are the keys of a release's `joint_head.safetensors`, so a release head loads
into it unchanged. The math is the release's (see docs of the Clef format, "The head"); the release runs it
with Python loops over records, questions and options, which costs one attention call over the whole
prompt per option and layer. Here every record of a batch is answered in a fixed number of tensor calls:
spans are gathered with index tensors, per-question reductions are segment operations, and the memory
keys and values are projected once per record and layer. `clef_quant.head_loop` keeps the loop form as
ground truth; the tests hold the two together.

Inputs are read by position, so the caller must hand over exactly the record's real tokens (no padding).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from clef_vllm.format.schema import NUM_QUESTION_TYPES, RecordSchema
from clef_vllm.head.ops import decoder_layer, option_logits, routed_options, segment_softmax

if TYPE_CHECKING:  # the config lives with the files that store it, which load into this module
    from clef_vllm.head.files import HeadConfig


class EvidenceLayer(nn.Module):
    """Options read the prompt: cross-attention from each option to the record's memory, then feedforward."""

    def __init__(self, width: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.feedforward_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=0.0, batch_first=True)
        # Dropout keeps the release's indices (feedforward.0 / feedforward.3); it is inert at 0.0.
        self.feedforward = nn.Sequential(
            nn.Linear(width, feedforward), nn.GELU(), nn.Dropout(0.0), nn.Linear(feedforward, width)
        )


class JointSchemaHead(nn.Module):
    """The release's joint schema head, batched over records, questions and options."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h, w = config.hidden_size, config.width
        self.hidden_norm = nn.LayerNorm(h)
        self.memory_projection = nn.Linear(h, w, bias=False)
        self.question_projection = nn.Linear(h, w, bias=False)
        self.option_question_projection = nn.Linear(h, w, bias=False)
        self.global_projection = nn.Linear(h, w, bias=False)
        self.option_context_projection = nn.Linear(h, w, bias=False)
        self.option_lexical_projection = nn.Linear(h, w, bias=False)
        self.type_embedding = nn.Embedding(NUM_QUESTION_TYPES, w)
        self.evidence_layers = nn.ModuleList(
            EvidenceLayer(w, config.heads, config.feedforward) for _ in range(config.routing_layers)
        )
        self.option_summary_norm = nn.LayerNorm(w)
        self.field_norm = nn.LayerNorm(w)
        self.option_norm = nn.LayerNorm(w)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=w,
                nhead=config.heads,
                dim_feedforward=config.feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.layers)
        )
        self.residual_scorer = nn.Sequential(nn.Linear(4 * w, w), nn.GELU(), nn.Dropout(0.0), nn.Linear(w, 1))
        self.prior_logit_scale = nn.Parameter(torch.tensor(0.0))
        self.joint_logit_scale = nn.Parameter(torch.tensor(0.0))
        self.residual_gate = nn.Parameter(torch.tensor(0.0))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random weights drawn in a fixed order from torch's RNG, so a seed gives the same head everywhere.

        Every parameter gets a non-trivial value (biases and norms too), so that a test comparing two forms
        of the math would notice any parameter that one of them forgets.
        """
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.02)
                module.bias.normal_(0.0, 0.02)
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.02)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0)
            elif isinstance(module, nn.MultiheadAttention):
                module.in_proj_weight.normal_(0.0, module.embed_dim**-0.5)
                module.in_proj_bias.normal_(0.0, 0.02)
        self.prior_logit_scale.fill_(math.log(10.0))
        self.joint_logit_scale.fill_(math.log(10.0))
        self.residual_gate.fill_(0.0)

    @property
    def dtype(self) -> torch.dtype:
        return self.hidden_norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.hidden_norm.weight.device

    def forward(
        self,
        hidden_states: Sequence[Tensor],
        input_ids: Sequence[Tensor],
        schemas: Sequence[RecordSchema],
        output_embeddings: Tensor,
    ) -> list[Tensor]:
        """Option logits of each record: questions in order, each question's options in model order.

        `hidden_states[i]` are record i's final normed backbone states over its real tokens, `input_ids[i]`
        its ids, `output_embeddings` the `lm_head` weight (only the rows of option tokens are read).
        """
        if not len(hidden_states) == len(input_ids) == len(schemas):
            raise ValueError("hidden_states, input_ids and schemas must have one entry per record")
        if not schemas:
            return []
        dtype, device = self.dtype, self.device
        lengths = [int(h.shape[0]) for h in hidden_states]
        for h, ids in zip(hidden_states, input_ids, strict=True):
            if h.ndim != 2 or h.shape[1] != self.config.hidden_size or ids.shape != h.shape[:1]:
                raise ValueError(
                    f"expected hidden states [L, {self.config.hidden_size}] and ids [L], "
                    f"got {tuple(h.shape)} and {tuple(ids.shape)}"
                )
        plan = _Plan.build(lengths, schemas, device)

        hidden = _cat([h.to(device=device, dtype=dtype) for h in hidden_states])
        ids = _cat([i.to(device=device) for i in input_ids])
        normed = self.hidden_norm(hidden)  # [T, h] for all records' tokens
        memory = self.memory_projection(normed)  # [T, w]
        last = normed[plan.last_token]  # [B, h]: the global vector g of each record

        # Segment means (question spans first, then option spans), accumulated in fp32.
        span_states = normed[plan.span_token].float()
        sums = span_states.new_zeros(plan.num_segments, normed.shape[1])
        sums.index_add_(0, plan.span_segment, span_states)
        means = (sums / plan.span_length[:, None]).to(dtype)
        question, context = means[: plan.num_questions], means[plan.num_questions :]
        lexical_rows = output_embeddings[ids[plan.option_token]].float()
        lexical = lexical_rows.new_zeros(plan.num_options, lexical_rows.shape[1])
        lexical.index_add_(0, plan.option_token_segment, lexical_rows)
        lexical = (lexical / plan.span_length[plan.num_questions :, None]).to(dtype)

        oq = plan.option_question
        options = routed_options(self, context, lexical, question, oq, memory, plan)

        # Per question: a softmax over its options' agreement with the question picks the option summary.
        field_query = self.question_projection(question)  # [Q, w]
        scores = (options.float() * field_query.float()[oq]).sum(-1) / math.sqrt(self.config.width)
        weights = segment_softmax(scores, oq, plan.num_questions)
        summary = options.new_zeros(plan.num_questions, options.shape[1], dtype=torch.float32)
        summary.index_add_(0, oq, weights[:, None] * options.float())
        qr = plan.question_record
        fields_ = (
            field_query
            + self.option_summary_norm(summary.to(dtype))
            + self.global_projection(last)[qr]
            + self.type_embedding(plan.question_type)
        )

        padded = plan.pad_questions(fields_)
        for layer in self.layers:
            padded = decoder_layer(layer, padded, plan.pad_tokens, memory, plan.field_mask, plan.memory_mask)
        fields_ = self.field_norm(plan.unpad_questions(padded))

        logits = option_logits(self, fields_, options, lexical, question + last[qr], oq)
        return list(logits.split(plan.options_per_record))


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


@dataclass
class _Plan:
    """Index tensors for one batch of records, built on the CPU and moved to the device in one copy.

    Tokens of all records are concatenated ("flat"); questions and options are numbered across the batch.
    Sizes stay Python ints, so the forward never waits on the device to learn a shape.
    """

    num_records: int
    num_questions: int
    num_options: int
    options_per_record: list[int]
    questions_per_record: list[int]
    lengths: list[int]
    span_token: Tensor  # flat token positions of every span, question spans first
    span_segment: Tensor  # which span (question i, or num_questions + option j) each position belongs to
    span_length: Tensor  # float, tokens per span
    option_token: Tensor  # the option part of span_token
    option_token_segment: Tensor  # option number of each of those positions
    last_token: Tensor  # [B] flat position of each record's last token
    question_record: Tensor  # [Q]
    question_type: Tensor  # [Q]
    option_question: Tensor  # [S]
    # Padding (only when the batch holds more than one record): (record, slot) of tokens, options, questions.
    token_index: tuple[Tensor, Tensor] | None
    option_index: tuple[Tensor, Tensor] | None
    question_index: tuple[Tensor, Tensor] | None
    memory_mask: Tensor | None  # [B, 1, 1, max L], True for real tokens
    field_mask: Tensor | None  # [B, 1, 1, max Q], True for real questions

    @property
    def num_segments(self) -> int:
        return self.num_questions + self.num_options

    @classmethod
    def build(cls, lengths: list[int], schemas: Sequence[RecordSchema], device: torch.device) -> _Plan:
        # Bookkeeping only: flatten every schema into one list of ints, converted to a tensor in one call.
        spans: list[int] = []  # start, end pairs: all question spans, then all option spans
        option_spans: list[int] = []
        types: list[int] = []
        option_counts: list[int] = []
        for schema in schemas:
            spans.extend(chain.from_iterable(schema.question_spans))
            option_spans.extend(chain.from_iterable(chain.from_iterable(schema.option_spans)))
            types.extend(schema.question_types)
            option_counts.extend(schema.option_counts)
        questions_per_record = [len(s.question_types) for s in schemas]
        options_per_record = [s.num_options for s in schemas]
        batch, num_questions, num_options = len(schemas), len(types), len(option_spans) // 2
        ints = lengths + questions_per_record + options_per_record + option_counts + types + spans + option_spans
        values = torch.frombuffer(array("q", ints), dtype=torch.long)  # several times faster than torch.tensor
        length, per_record_q, per_record_o, count, type_id, span_pairs = values.split(
            [batch, batch, batch, num_questions, num_questions, len(spans) + len(option_spans)]
        )
        records = torch.arange(batch)
        offset = length.cumsum(0) - length
        question_record = records.repeat_interleave(per_record_q, output_size=num_questions)
        option_question = torch.arange(num_questions).repeat_interleave(count, output_size=num_options)
        option_record = question_record[option_question]

        pairs = span_pairs.view(-1, 2)
        span_record = torch.cat([question_record, option_record])
        past = pairs[:, 1] > length[span_record]
        if bool(past.any()):
            bad = int(span_record[past][0])
            raise ValueError(f"record {bad} has a span past its {lengths[bad]} tokens")
        starts = pairs[:, 0] + offset[span_record]
        span_length = pairs[:, 1] - pairs[:, 0]
        span_tokens = int(span_length.sum())
        span_segment = torch.arange(len(pairs)).repeat_interleave(span_length, output_size=span_tokens)
        first = span_length.cumsum(0) - span_length
        span_token = torch.arange(span_tokens) + (starts - first).repeat_interleave(
            span_length, output_size=span_tokens
        )
        question_tokens = int(span_length[:num_questions].sum())

        parts: dict[str, Tensor] = {
            "span_token": span_token,
            "span_segment": span_segment,
            "span_length": span_length,
            "last_token": offset + length - 1,
            "question_record": question_record,
            "question_type": type_id,
            "option_question": option_question,
        }
        padded = batch > 1
        if padded:
            token_record = records.repeat_interleave(length, output_size=sum(lengths))
            parts["token_record"] = token_record
            parts["token_slot"] = torch.arange(len(token_record)) - offset[token_record]
            first_question = per_record_q.cumsum(0) - per_record_q
            first_option = per_record_o.cumsum(0) - per_record_o
            parts["question_slot"] = torch.arange(num_questions) - first_question[question_record]
            parts["option_record"] = option_record
            parts["option_slot"] = torch.arange(num_options) - first_option[option_record]
            parts["length"] = length
            parts["questions"] = per_record_q

        flat = torch.cat([p.reshape(-1) for p in parts.values()])
        # Pinned on CUDA, so the copy does not wait for work already queued on the device.
        pinned = device.type == "cuda"
        flat = (flat.pin_memory() if pinned else flat).to(device, non_blocking=pinned)
        moved = dict(zip(parts, flat.split([p.numel() for p in parts.values()]), strict=True))
        span_segment_dev = moved["span_segment"]

        def pair(a: str, b: str) -> tuple[Tensor, Tensor] | None:
            return (moved[a], moved[b]) if padded else None

        def mask(name: str, longest: int) -> Tensor | None:
            if not padded:
                return None
            return (torch.arange(longest, device=device) < moved[name][:, None]).view(batch, 1, 1, longest)

        return cls(
            num_records=batch,
            num_questions=num_questions,
            num_options=num_options,
            options_per_record=options_per_record,
            questions_per_record=questions_per_record,
            lengths=lengths,
            span_token=moved["span_token"],
            span_segment=span_segment_dev,
            span_length=moved["span_length"].float(),
            option_token=moved["span_token"][question_tokens:],
            option_token_segment=span_segment_dev[question_tokens:] - num_questions,
            last_token=moved["last_token"],
            question_record=moved["question_record"],
            question_type=moved["question_type"],
            option_question=moved["option_question"],
            token_index=pair("token_record", "token_slot"),
            option_index=pair("option_record", "option_slot"),
            question_index=pair("question_record", "question_slot"),
            memory_mask=mask("length", max(lengths)),
            field_mask=mask("questions", max(questions_per_record)),
        )

    @staticmethod
    def _pad(flat: Tensor, index: tuple[Tensor, Tensor] | None, batch: int, longest: int) -> Tensor:
        if index is None:
            return flat[None]
        padded = flat.new_zeros(batch, longest, *flat.shape[1:])
        padded[index] = flat
        return padded

    def pad_tokens(self, flat: Tensor) -> Tensor:
        return self._pad(flat, self.token_index, self.num_records, max(self.lengths))

    def pad_options(self, flat: Tensor) -> Tensor:
        return self._pad(flat, self.option_index, self.num_records, max(self.options_per_record))

    def pad_questions(self, flat: Tensor) -> Tensor:
        return self._pad(flat, self.question_index, self.num_records, max(self.questions_per_record))

    def unpad_options(self, padded: Tensor) -> Tensor:
        return padded[0] if self.option_index is None else padded[self.option_index]

    def unpad_questions(self, padded: Tensor) -> Tensor:
        return padded[0] if self.question_index is None else padded[self.question_index]
