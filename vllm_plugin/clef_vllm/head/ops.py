"""The head's tensor operations shared by the batched forward (`head`) and the graphed fast path (`head_graphs`).

Both run the same math on differently laid-out inputs; keeping these steps in one place keeps them equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:  # head.py imports this module
    from clef_vllm.head.model import JointSchemaHead

MAX_LOGIT_SCALE = math.log(100.0)  # the release caps both learned temperatures at 100


def capped_scale(log_scale: Tensor) -> Tensor:
    return log_scale.clamp(max=MAX_LOGIT_SCALE).exp()


def segment_softmax(scores: Tensor, segment: Tensor, num_segments: int) -> Tensor:
    """Softmax of `scores` within each segment (fp32), without padding the segments to one length."""
    peak = scores.new_full((num_segments,), -math.inf)
    peak.scatter_reduce_(0, segment, scores, reduce="amax", include_self=True)
    exps = (scores - peak[segment]).exp()
    total = exps.new_zeros(num_segments).index_add_(0, segment, exps)
    return exps / total[segment]


def project_kv(attention: nn.MultiheadAttention, memory: Tensor) -> Tensor:
    """Keys and values of the memory side by side ([..., 2w]); done once per record and layer."""
    w = attention.embed_dim
    return F.linear(memory, attention.in_proj_weight[w:], attention.in_proj_bias[w:])


def attend(attention: nn.MultiheadAttention, query: Tensor, keys_values: Tensor, mask: Tensor | None) -> Tensor:
    """`attention(query, kv, kv)` with the keys and values already projected; `mask` marks real keys.

    Same math as nn.MultiheadAttention (scale 1/sqrt(head dim)), through scaled_dot_product_attention.
    """
    batch, length, w = query.shape
    heads = attention.num_heads
    q = F.linear(query, attention.in_proj_weight[:w], attention.in_proj_bias[:w])
    q = q.view(batch, length, heads, w // heads).transpose(1, 2)
    split = keys_values.view(batch, keys_values.shape[1], 2, heads, w // heads)
    k, v = split.permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attention.out_proj(out.transpose(1, 2).reshape(batch, length, w))


def decoder_layer(
    layer: nn.TransformerDecoderLayer,
    x: Tensor,
    pad_tokens: Callable[[Tensor], Tensor],
    memory: Tensor,
    field_mask: Tensor | None,
    memory_mask: Tensor | None,
) -> Tensor:
    """A norm-first TransformerDecoderLayer step on padded fields, memory K/V projected without padding."""
    normed = layer.norm1(x)
    x = x + attend(layer.self_attn, normed, project_kv(layer.self_attn, normed), field_mask)
    memory_kv = pad_tokens(project_kv(layer.multihead_attn, memory))
    x = x + attend(layer.multihead_attn, layer.norm2(x), memory_kv, memory_mask)
    return x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))


class OptionLayout(Protocol):
    """How a caller lays out options and memory tokens for attention, and which memory keys are real."""

    memory_mask: Tensor | None

    def pad_options(self, flat: Tensor) -> Tensor: ...

    def pad_tokens(self, flat: Tensor) -> Tensor: ...

    def unpad_options(self, padded: Tensor) -> Tensor: ...


def routed_options(
    head: JointSchemaHead,
    context: Tensor,
    lexical: Tensor,
    question: Tensor,
    owner: Tensor,
    memory: Tensor,
    layout: OptionLayout,
) -> Tensor:
    """Each option's state ([options, w]) after the evidence layers read the memory.

    `owner` is each option's question row; `layout` batches options and memory as the caller lays them out.
    """
    options = (
        head.option_context_projection(context)
        + head.option_lexical_projection(lexical)
        + head.option_question_projection(question)[owner]
    )
    for layer in head.evidence_layers:
        keys_values = project_kv(layer.attention, layer.memory_norm(memory))
        query = layout.pad_options(layer.query_norm(options))
        attended = attend(layer.attention, query, layout.pad_tokens(keys_values), layout.memory_mask)
        options = options + layout.unpad_options(attended)
        options = options + layer.feedforward(layer.feedforward_norm(options))
    return options


def option_logits(
    head: JointSchemaHead,
    fields: Tensor,
    options: Tensor,
    lexical: Tensor,
    question_global: Tensor,
    owner: Tensor,
) -> Tensor:
    """The final logit of every option: the prior from its tokens plus the gated joint score with its field.

    `fields` are the decoded question fields, `question_global` each question's mean plus its record's last
    state, both per question; `owner` maps options to questions.
    """
    field = fields[owner]
    option = head.option_norm(options)
    joint = capped_scale(head.joint_logit_scale) * F.cosine_similarity(field, option, dim=-1)
    pair = torch.cat([field, option, field * option, (field - option).abs()], dim=-1)
    joint = joint + head.residual_scorer(pair).squeeze(-1)
    prior = capped_scale(head.prior_logit_scale) * F.cosine_similarity(lexical, question_global[owner], dim=-1)
    return prior + torch.sigmoid(head.residual_gate) * joint
