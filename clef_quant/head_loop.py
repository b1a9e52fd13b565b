"""The joint schema head in its plain loop form: one record, Python loops over questions and options.

This is the math as the release runs it (one attention call with the whole memory per option and layer,
the fields through torch's own TransformerDecoderLayer), kept only as ground truth: the tests and the head
benchmark compare `JointSchemaHead.forward` with it. It reads the weights of the very same module, so any
difference is a difference in the computation, never in the parameters. Slow by design; do not serve with it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.model import JointSchemaHead
from clef_vllm.head.ops import MAX_LOGIT_SCALE


def loop_logits(
    head: JointSchemaHead,
    hidden_states: Tensor,
    input_ids: Tensor,
    schema: RecordSchema,
    output_embeddings: Tensor,
) -> Tensor:
    """Option logits of one record (questions in order, options in order), computed option by option."""
    dtype, device = head.dtype, head.device
    hidden = hidden_states.to(device=device, dtype=dtype)
    ids = input_ids.to(device)
    normed = head.hidden_norm(hidden)
    memory = head.memory_projection(normed)
    last = normed[-1]
    width = head.config.width

    questions: list[Tensor] = []
    lexicals: list[list[Tensor]] = []
    options: list[list[Tensor]] = []
    for (q_start, q_end), spans in zip(schema.question_spans, schema.option_spans, strict=True):
        question = normed[q_start:q_end].mean(0)
        questions.append(question)
        lexicals.append([])
        options.append([])
        for start, end in spans:
            context = normed[start:end].mean(0)
            lexical = output_embeddings[ids[start:end]].to(dtype).mean(0)
            option = (
                head.option_context_projection(context)
                + head.option_lexical_projection(lexical)
                + head.option_question_projection(question)
            )
            lexicals[-1].append(lexical)
            options[-1].append(option)

    for layer in head.evidence_layers:
        memory_normed = layer.memory_norm(memory)[None]
        for per_question in options:
            for j, option in enumerate(per_question):
                query = layer.query_norm(option)[None, None]
                attended, _ = layer.attention(query, memory_normed, memory_normed, need_weights=False)
                option = option + attended[0, 0]
                per_question[j] = option + layer.feedforward(layer.feedforward_norm(option))

    fields = []
    for question, type_id, per_question in zip(questions, schema.question_types, options, strict=True):
        field_query = head.question_projection(question)
        stacked = torch.stack(per_question)
        weights = torch.softmax(stacked.float() @ field_query.float() / math.sqrt(width), dim=0)
        summary = (weights[:, None] * stacked.float()).sum(0).to(dtype)
        fields.append(
            field_query
            + head.option_summary_norm(summary)
            + head.global_projection(last)
            + head.type_embedding.weight[type_id]
        )
    field_seq = torch.stack(fields)[None]
    for decoder in head.layers:
        field_seq = decoder(field_seq, memory[None])
    fields = list(head.field_norm(field_seq[0]))

    prior_scale = head.prior_logit_scale.clamp(max=MAX_LOGIT_SCALE).exp()
    joint_scale = head.joint_logit_scale.clamp(max=MAX_LOGIT_SCALE).exp()
    gate = torch.sigmoid(head.residual_gate)
    logits = []
    for question, field, per_question, per_lexical in zip(questions, fields, options, lexicals, strict=True):
        for option, lexical in zip(per_question, per_lexical, strict=True):
            prior = prior_scale * F.cosine_similarity(lexical, question + last, dim=0)
            option = head.option_norm(option)
            pair = torch.cat([field, option, field * option, (field - option).abs()])
            joint = joint_scale * F.cosine_similarity(field, option, dim=0) + head.residual_scorer(pair)[0]
            logits.append(prior + gate * joint)
    return torch.stack(logits)
