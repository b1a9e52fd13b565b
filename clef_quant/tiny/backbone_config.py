"""The configs of a random-weight Clef backbone: `config.json` and `generation_config.json` for a size.

Qwen3.5 sizes (clef-flash, clef) get a `Qwen3_5Config`; Omni sizes a `Qwen3OmniMoeConfig` holding only the
thinker (`enable_audio_output` false: Clef-Omni has no talker or code2wav, and vLLM's thinker class drops their
weights anyway).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import transformers
from torch import nn
from transformers import GenerationConfig, PretrainedConfig, Qwen3_5Config, Qwen3OmniMoeConfig

from clef_quant.families import FAMILIES, QWEN3_OMNI
from clef_quant.tiny.sizes import AudioShape, MoeTextShape, Size
from clef_quant.tiny.tokenizer import EOS_TOKEN, PAD_TOKEN

ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY_FACTOR = 0.25
MAX_POSITION_EMBEDDINGS = 262144


def backbone_config(spec: Size, ids: dict[str, int]) -> PretrainedConfig:
    """The backbone config of `spec` (its family's architecture), wired to the tokenizer's control-token ids."""
    if FAMILIES[spec.family].architecture == QWEN3_OMNI:
        return omni_config(spec, ids)
    text = spec.text
    assert not isinstance(text, MoeTextShape)
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
        vision_config={**vision_fields(spec), "dtype": "bfloat16"},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.dtype = "bfloat16"
    return config


def vision_fields(spec: Size) -> dict[str, Any]:
    """The vision tower's shape as both families' configs spell it; its output width is the text hidden size."""
    vision = spec.vision
    return {
        "depth": vision.depth,
        "hidden_size": vision.hidden_size,
        "intermediate_size": vision.intermediate_size,
        "num_heads": vision.num_heads,
        "patch_size": vision.patch_size,
        "spatial_merge_size": vision.spatial_merge_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "out_hidden_size": spec.text.hidden_size,
        "num_position_embeddings": vision.num_position_embeddings,
    }


def omni_config(spec: Size, ids: dict[str, int]) -> Qwen3OmniMoeConfig:
    """The `Qwen3OmniMoeForConditionalGeneration` config of an Omni size: the thinker's text, audio and vision
    configs (transformers' configuration_qwen3_omni_moe.py), wired to the tokenizer's ids. vLLM's thinker reads
    `audio_start_token_id`, `audio_end_token_id` and `vision_start_token_id` from `thinker_config`
    (qwen3_omni_moe_thinker.py, its multimodal RoPE positions)."""
    text, vision, audio = spec.text, spec.vision, spec.audio
    assert isinstance(text, MoeTextShape) and isinstance(audio, AudioShape)
    thinker = {
        "text_config": {
            "vocab_size": text.vocab_size,
            "hidden_size": text.hidden_size,
            # Unused: every layer is sparse (decoder_sparse_step 1, no mlp_only_layers), as in the 30B.
            "intermediate_size": text.moe_intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "head_dim": text.head_dim,
            "num_experts": text.num_experts,
            "num_experts_per_tok": text.num_experts_per_tok,
            "moe_intermediate_size": text.moe_intermediate_size,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "max_position_embeddings": 65536,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": text.rope_theta,
                "mrope_section": list(text.mrope_section),
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
        },
        "vision_config": {
            **vision_fields(spec),
            "deepstack_visual_indexes": list(vision.deepstack_visual_indexes),
            # vLLM's Qwen3Omni_VisionTransformer (qwen3_omni_moe_thinker.py) reads these two, which transformers'
            # config lacks: the position grid is image_size / patch_size a side (the 30B: 768 / 16 = 48, 2304
            # positions), learned absolute positions.
            "image_size": math.isqrt(vision.num_position_embeddings) * vision.patch_size,
            "apply_vit_abs_pos_embed": True,
            "dtype": "bfloat16",
        },
        "audio_config": {
            "encoder_layers": audio.encoder_layers,
            "encoder_attention_heads": audio.encoder_attention_heads,
            "encoder_ffn_dim": audio.encoder_ffn_dim,
            "d_model": audio.d_model,
            "downsample_hidden_size": audio.downsample_hidden_size,
            "num_mel_bins": audio.num_mel_bins,
            "output_dim": text.hidden_size,
            "dtype": "bfloat16",
        },
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker,
        enable_audio_output=False,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
    )
    config.architectures = [QWEN3_OMNI]
    config.dtype = "bfloat16"
    return config


def placeholder_ids(spec: Size) -> dict[str, int]:
    """Control-token ids for a config that only serves to count parameters (no tokenizer needed)."""
    names = (
        "<|image_pad|>",
        "<|video_pad|>",
        "<|vision_start|>",
        "<|vision_end|>",
        PAD_TOKEN,
        EOS_TOKEN,
        "<|im_start|>",
        "<|audio_pad|>",
        "<|audio_start|>",
        "<|audio_end|>",
    )
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


def meta_model(config: PretrainedConfig) -> nn.Module:
    """The model of `config` (the transformers class its `architectures` names) on the meta device: its parameter
    names and shapes, no storage."""
    model_class = getattr(transformers, config.architectures[0])
    with torch.device("meta"):
        return model_class(config)
