"""The tensors a checkpoint of a transformers model stores, by name: what `make-tiny` writes and what the release
audit expects a folder's shards to hold.

transformers 5 holds a MoE layer's experts as two fused 3-D parameters, but checkpoints store one Linear per
expert, and vLLM loads those names (transformers' conversion_mapping.py maps qwen3_omni_moe to the qwen2_moe
rules: `experts.{e}.gate_proj`/`up_proj` stacked into `gate_up_proj`, `experts.{e}.down_proj` into `down_proj`).
quantize saves the same names (llm-compressor's linearized experts).
"""

from __future__ import annotations

import torch
from torch import nn

FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def disk_tensors(model: nn.Module) -> list[tuple[str, torch.Size]]:
    """The tensors a checkpoint of `model` stores, in model order: its parameters, with fused experts split into
    the per-expert Linear weights of the released format."""
    tensors: list[tuple[str, torch.Size]] = []
    for name, param in model.named_parameters():
        if name.endswith(FUSED_EXPERTS[0]):
            base = name.removesuffix(".gate_up_proj")
            experts, outputs, inputs = param.shape
            for e in range(experts):
                tensors.append((f"{base}.{e}.gate_proj.weight", torch.Size((outputs // 2, inputs))))
                tensors.append((f"{base}.{e}.up_proj.weight", torch.Size((outputs // 2, inputs))))
        elif name.endswith(FUSED_EXPERTS[1]):
            base = name.removesuffix(".down_proj")
            experts, outputs, inputs = param.shape
            tensors.extend((f"{base}.{e}.down_proj.weight", torch.Size((outputs, inputs))) for e in range(experts))
        else:
            tensors.append((name, param.shape))
    return tensors
