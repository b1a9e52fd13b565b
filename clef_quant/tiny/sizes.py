"""The shapes of the random-weight checkpoints `clef-quant make-tiny` builds, as plain data, each tied to the
Clef model (`clef_quant.families`) whose architecture it has.

- `tiny`: the smallest Qwen3.5 that vLLM's CPU kernels accept (a few MB); for tests.
- `small`: tens of millions of parameters; for CPU benchmarks where the tiny model is all overhead.
- `flash`: exactly clef-flash's shapes (9.4 B parameters, vocab 248,320, Qwen3.5-9B vision tower); for
  GPU timings and memory of the real thing without downloading it. Build it on a GPU.
- `clef`: exactly the 27B's shapes (Cloudflare/clef); `clef-tiny`: its architecture at a few MB.
- `omni`: exactly Clef-Omni's (the Qwen3-Omni-30B-A3B thinker: MoE text model, audio and vision towers);
  `omni-tiny`: the same structure (routing, experts, both towers, deepstack) at a few MB.

Every size shares the small trained tokenizer; the backbone's vocabulary is padded past it with rows that no
token id reaches, as a real checkpoint's embedding is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TextShape:
    """The Qwen3.5 text model (`text_config`)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    # vLLM's CPU Gated DeltaNet kernel only takes 128 here ("Unexpected head dim size").
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4  # every n-th layer is full attention, the others Gated DeltaNet (Qwen3.5: 4)

    @property
    def layer_types(self) -> list[str]:
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]


@dataclass(frozen=True)
class MoeTextShape:
    """The Qwen3-Omni thinker's text model (`thinker_config.text_config`): attention, then a sparse MoE block
    (router `mlp.gate`, `num_experts` experts of `moe_intermediate_size`) in every layer."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    # The multimodal RoPE split (time, height, width) of head_dim // 2 rotary pairs.
    mrope_section: tuple[int, int, int]
    rope_theta: float = 1_000_000.0


@dataclass(frozen=True)
class AudioShape:
    """The Qwen3-Omni audio tower (`thinker_config.audio_config`); its output width is the text hidden size."""

    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    d_model: int
    downsample_hidden_size: int
    num_mel_bins: int = 128


@dataclass(frozen=True)
class VisionShape:
    """The Qwen3.5 vision tower (`vision_config`); its output width is always the text hidden size."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    # A perfect square: the learned position grid is resampled as a square image.
    num_position_embeddings: int
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    # Qwen3-Omni's vision tower feeds these blocks' outputs into the first text layers (none in Qwen3.5).
    deepstack_visual_indexes: tuple[int, ...] = ()


@dataclass(frozen=True)
class HeadShape:
    """The joint schema head's arguments besides `hidden_size` (which is the text hidden size)."""

    width: int
    routing_layers: int
    layers: int
    heads: int
    feedforward: int


@dataclass(frozen=True)
class Size:
    name: str
    text: TextShape | MoeTextShape
    vision: VisionShape
    head: HeadShape
    family: str = "clef-flash"  # a key of clef_quant.families.FAMILIES
    audio: AudioShape | None = None  # Omni only
    # Above this many bytes of weights the backbone is split into `model-0000i-of-0000n.safetensors` shards.
    max_shard_bytes: int = 5 * 10**9


_TINY = Size(
    name="tiny",
    text=TextShape(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    ),
    vision=VisionShape(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, num_position_embeddings=256),
    head=HeadShape(width=32, routing_layers=1, layers=1, heads=2, feedforward=64),
)


SIZES: dict[str, Size] = {
    "tiny": _TINY,
    # The tiny model widened and deepened, with the same attention layout.
    "small": replace(
        _TINY,
        name="small",
        text=replace(
            _TINY.text,
            vocab_size=8192,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=8,
            num_attention_heads=8,
        ),
        vision=VisionShape(depth=4, hidden_size=256, intermediate_size=1024, num_heads=4, num_position_embeddings=1024),
        head=HeadShape(width=128, routing_layers=2, layers=2, heads=4, feedforward=512),
    ),
    # clef-flash (see the Clef format): Qwen3.5-9B text and vision shapes, and its head.
    "flash": Size(
        name="flash",
        text=TextShape(
            vocab_size=248320,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=32,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
        ),
        vision=VisionShape(
            depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, num_position_embeddings=2304
        ),
        head=HeadShape(width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096),
    ),
}


# Cloudflare/clef, the 27B. Hidden 5120, 64 layers, 24 attention heads, 4 KV heads, FFN 17408, vocab 248,320 and
# a head of hidden size 5120 are the release's facts. The rest is Qwen3.5's, from transformers
# (transformers/models/qwen3_5/configuration_qwen3_5.py, whose docstring checkpoint is Qwen/Qwen3.5-27B):
# head_dim 256, linear key/value head dims 128, 16 linear key heads, conv kernel 4, every 4th layer full
# attention (48 Gated DeltaNet + 16 full attention), and its vision tower (Qwen3_5VisionConfig: depth 27, hidden
# 1152, FFN 4304, 16 heads, 2304 positions) with out_hidden_size = the text hidden size. The 27B has 48 linear
# value heads where that file's 9B defaults have 32 (Qwen's published 27B config.json): with 48 the folder has
# 27.5 B parameters, 55 GB in bf16, the release's size; with 32 it would have 26.0 B. The head's width and depth
# are clef-flash's (the release gives the head as about 128 M parameters: flash's shape at hidden 5120 is 128.1 M).
_CLEF = Size(
    name="clef",
    family="clef",
    text=TextShape(
        vocab_size=248320,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=64,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
    ),
    vision=SIZES["flash"].vision,
    head=SIZES["flash"].head,
)

# Clef-Omni: the Qwen3-Omni-30B-A3B thinker. Text model: hidden 2048, 48 layers, 32 attention heads, 4 KV heads,
# head_dim 128, 128 experts of 768 with 8 per token, vocab 152,064 (Qwen3-Omni-30B-A3B's config.json, 30.5 B
# parameters in the thinker); multimodal RoPE theta 1e6 split [24, 20, 20]. Towers: transformers'
# transformers/models/qwen3_omni_moe/configuration_qwen3_omni_moe.py defaults, which are the 30B's
# (Qwen3OmniMoeAudioEncoderConfig: 32 layers, d_model 1280, 20 heads, FFN 5120, 128 mel bins, downsample 480;
# Qwen3OmniMoeVisionEncoderConfig: depth 27, hidden 1152, FFN 4304, 16 heads, 2304 positions, deepstack
# from blocks 8, 16, 24), their output width set to the text hidden size. The head's hidden size is the text's.
_OMNI = Size(
    name="omni",
    family="clef-omni",
    text=MoeTextShape(
        vocab_size=152064,
        hidden_size=2048,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        mrope_section=(24, 20, 20),
    ),
    vision=VisionShape(
        depth=27,
        hidden_size=1152,
        intermediate_size=4304,
        num_heads=16,
        num_position_embeddings=2304,
        deepstack_visual_indexes=(8, 16, 24),
    ),
    audio=AudioShape(
        encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, d_model=1280, downsample_hidden_size=480
    ),
    head=SIZES["flash"].head,
)

SIZES.update(
    {
        "clef": _CLEF,
        # The 27B's structure at test size: its 6:1 attention-head grouping and 3:1 DeltaNet value/key heads.
        "clef-tiny": replace(
            _TINY,
            name="clef-tiny",
            family="clef",
            text=replace(_TINY.text, num_attention_heads=6, num_key_value_heads=1, linear_num_value_heads=6),
        ),
        "omni": _OMNI,
        # Every part of the Omni thinker kept, each as small as it goes: 4 experts with 2 per token in both
        # layers, a 2-block vision tower with one deepstack block, a 2-layer audio tower. Every text linear is
        # a multiple of 128 wide: vLLM's CPU build runs quantized experts only with 128x128 FP8 blocks.
        "omni-tiny": Size(
            name="omni-tiny",
            family="clef-omni",
            text=MoeTextShape(
                vocab_size=2048,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=128,
                mrope_section=(12, 10, 10),
            ),
            vision=replace(_TINY.vision, deepstack_visual_indexes=(0,)),
            audio=AudioShape(
                encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, d_model=64, downsample_hidden_size=32
            ),
            head=_TINY.head,
        ),
    }
)
