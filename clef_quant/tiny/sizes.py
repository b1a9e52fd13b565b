"""The shapes of the random-weight checkpoints `clef-quant make-tiny` builds, as plain data.

- `tiny`: the smallest Qwen3.5 that vLLM's CPU kernels accept (a few MB); for tests.
- `small`: tens of millions of parameters; for CPU benchmarks where the tiny model is all overhead.
- `flash`: exactly clef-flash's shapes (9.4 B parameters, vocab 248,320, Qwen3.5-9B vision tower); for
  GPU timings and memory of the real thing without downloading it. Build it on a GPU.

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
    text: TextShape
    vision: VisionShape
    head: HeadShape
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
