"""Rotary embeddings that an earlier engine of this process built on the meta device, dropped before the next one.

vLLM keeps one rotary embedding per shape in a process-wide cache (`get_rope`'s `_ROPE_DICT`), whatever device it
was built on. An engine with images off builds its vision tower on the meta device (`no_init_weights`), so the
tower's rotary embedding enters the cache with meta buffers; a later engine with images on in the same process would
take that one and fail on its first image ("Tensor on device meta is not on the expected device cpu"). Engines in
their own processes (the server's) never share the cache; offline engines in one process do.
"""

from __future__ import annotations


def drop_meta_rotary_embeddings() -> int:
    """Remove cached rotary embeddings whose buffers are on the meta device; how many were removed."""
    try:
        from vllm.model_executor.layers import rotary_embedding
    except ImportError:  # vLLM not installed: no cache to clean
        return 0
    cache = getattr(rotary_embedding, "_ROPE_DICT", None)
    if not isinstance(cache, dict):
        return 0
    stale = [key for key, module in cache.items() if any(buffer.is_meta for buffer in module.buffers())]
    for key in stale:
        del cache[key]
    return len(stale)
