"""An offline engine with images off must not leave the next engine of its process a vision tower on the meta device.

vLLM caches rotary embeddings by shape in one process-wide dict; a text-only engine builds its vision tower (and so
its rotary embedding) on the meta device. Every engine start clears such entries first (`prepare_engine_process`).
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers import rotary_embedding
from vllm.model_executor.layers.rotary_embedding import get_rope

from clef_vllm.engine.settings import prepare_engine_process

SHAPE = {"head_size": 24, "max_position": 8192, "is_neox_style": True, "dtype": torch.bfloat16}


def test_an_engine_start_drops_the_rotary_embedding_a_text_only_engine_left_on_meta(tiny_dir) -> None:
    with set_current_vllm_config(VllmConfig()):  # as during a model's construction
        with torch.device("meta"):  # how vLLM builds the vision tower of an engine with images off
            left = get_rope(**SHAPE)
        assert left.cos_sin_cache.is_meta and get_rope(**SHAPE) is left  # what a later engine would have been given
        kept = get_rope(**{**SHAPE, "head_size": 32})  # built on the CPU: stays cached
        prepare_engine_process(False, tiny_dir, {})
        rebuilt = get_rope(**SHAPE)
    assert rebuilt is not left and rebuilt.cos_sin_cache.device.type == "cpu"
    assert get_rope(**{**SHAPE, "head_size": 32}) is kept
    assert not any(b.is_meta for m in rotary_embedding._ROPE_DICT.values() for b in m.buffers())
