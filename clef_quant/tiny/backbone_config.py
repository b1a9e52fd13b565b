"""The configs of a random-weight Clef backbone: `config.json` and `generation_config.json` for a size."""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration

from clef_quant.tiny.sizes import Size
from clef_quant.tiny.tokenizer import EOS_TOKEN, PAD_TOKEN

ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY_FACTOR = 0.25
MAX_POSITION_EMBEDDINGS = 262144


def backbone_config(spec: Size, ids: dict[str, int]) -> Qwen3_5Config:
    """The `Qwen3_5ForConditionalGeneration` config of `spec`, wired to the tokenizer's control-token ids."""
    text, vision = spec.text, spec.vision
    rotary_pairs = int(text.head_dim * PARTIAL_ROTARY_FACTOR) // 2
    # Multimodal RoPE splits the rotary frequencies between time, height and width, the remainder going to
    # the first sections (Qwen3.5-9B: 32 -> [11, 11, 10]; head dim 64: 8 -> [3, 3, 2]).
    mrope_section = [rotary_pairs // 3 + (1 if i < rotary_pairs % 3 else 0) for i in range(3)]
    config = Qwen3_5Config(
        text_config={
            "vocab_size": text.vocab_size,
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "layer_types": text.layer_types,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "head_dim": text.head_dim,
            "linear_num_key_heads": text.linear_num_key_heads,
            "linear_num_value_heads": text.linear_num_value_heads,
            "linear_key_head_dim": text.linear_key_head_dim,
            "linear_value_head_dim": text.linear_value_head_dim,
            "linear_conv_kernel_dim": text.linear_conv_kernel_dim,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": ROPE_THETA,
                "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
                "mrope_section": mrope_section,
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": False,
            "eos_token_id": ids[PAD_TOKEN],  # as Qwen3.5's text config: <|endoftext|>
            "dtype": "bfloat16",
        },
        vision_config={
            "depth": vision.depth,
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_heads": vision.num_heads,
            "patch_size": vision.patch_size,
            "spatial_merge_size": vision.spatial_merge_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "out_hidden_size": text.hidden_size,
            "num_position_embeddings": vision.num_position_embeddings,
            "dtype": "bfloat16",
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.dtype = "bfloat16"
    return config


def placeholder_ids(spec: Size) -> dict[str, int]:
    """Control-token ids for a config that only serves to count parameters (no tokenizer needed)."""
    names = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", PAD_TOKEN, EOS_TOKEN)
    return {name: spec.text.vocab_size - 1 - i for i, name in enumerate(names)}


def generation_config(ids: dict[str, int]) -> GenerationConfig:
    """The `generation_config.json` of a release, wired to the tokenizer's end tokens."""
    # Qwen3.5's defaults; Clef never generates, but a release carries the file unchanged.
    return GenerationConfig(
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
        eos_token_id=[ids[EOS_TOKEN], ids[PAD_TOKEN]],
        pad_token_id=ids[PAD_TOKEN],
    )


def meta_model(config: Qwen3_5Config) -> nn.Module:
    """The model of `config` on the meta device: its parameter names and shapes, no storage."""
    with torch.device("meta"):
        return Qwen3_5ForConditionalGeneration(config)
