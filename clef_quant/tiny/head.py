"""The random joint schema head of a tiny release: `joint_head_config.json` and `joint_head.safetensors`."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from clef_quant.tiny.sizes import Size
from clef_quant.tiny.weights import DTYPE, tensor_seed
from clef_vllm.head.files import HeadConfig, save_head
from clef_vllm.head.model import JointSchemaHead


def head_config(spec: Size) -> HeadConfig:
    """The head's constructor arguments for `spec`, sized to its backbone's hidden size."""
    shape = spec.head
    return HeadConfig(
        hidden_size=spec.text.hidden_size,
        width=shape.width,
        routing_layers=shape.routing_layers,
        layers=shape.layers,
        heads=shape.heads,
        feedforward=shape.feedforward,
    )


def write_head(folder: Path, spec: Size, seed: int, device: torch.device) -> None:
    """The head's own `reset_parameters` draws its weights, in bf16 on the device, from a seeded RNG."""
    with torch.device("meta"):
        head = JointSchemaHead(head_config(spec))
    head = head.to(dtype=DTYPE).to_empty(device=device)
    for param in head.parameters():
        param.data.fill_(math.nan)  # so a parameter that reset_parameters skipped cannot go unnoticed
    # Seed only the generator the head's tensors draw from, and give the caller's RNG state back afterwards.
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        forked, generator = [index], torch.cuda.default_generators[index]
    else:
        forked, generator = [], torch.default_generator
    with torch.random.fork_rng(devices=forked, device_type="cuda"):
        generator.manual_seed(tensor_seed(seed, "joint_head"))
        head.reset_parameters()
    skipped = [name for name, param in head.named_parameters() if torch.isnan(param).any()]
    if skipped:
        raise RuntimeError(f"JointSchemaHead.reset_parameters left {', '.join(skipped)} unset")
    save_head(head, folder)
