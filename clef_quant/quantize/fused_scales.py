"""One weight global scale for each DeltaNet `in_proj_qkv` / `in_proj_z` pair, through llm-compressor's own groups.

vLLM fuses `in_proj_qkv` and `in_proj_z` into one GEMM (`in_proj_qkvz`), so under tensor-group schemes (NVFP4,
NVFP4A16) the two must share one weight global scale; with separate scales vLLM keeps the larger one and the
other half of the fused weight comes out mis-scaled. llm-compressor links the observers of the groups listed
in `llmcompressor.observers.helpers.FUSED_LAYER_NAMES` (q/k/v, gate/up, ...) when calibration starts and
reads that list at call time, so adding our pair for the duration of a run is enough: no installed file is
edited, and the list is restored afterwards even when the run fails.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

# The parent module must have both attributes (a `Qwen3_5GatedDeltaNet`); then the pair is fused.
QKVZ_GROUP: tuple[str, ...] = ("in_proj_qkv", "in_proj_z")


@contextmanager
def fused_global_scales(*groups: Sequence[str]) -> Iterator[list[tuple[str, ...]]]:
    """Add `groups` (default: the qkv/z pair) to llm-compressor's fused-layer groups while the block runs.

    Yields the live list. Restores the exact previous contents on exit, whatever happened inside.
    """
    from llmcompressor.observers import helpers

    wanted = [tuple(group) for group in (groups or (QKVZ_GROUP,))]
    fused = helpers.FUSED_LAYER_NAMES
    saved = list(fused)
    # Mutate in place: `fuse_weight_observers` reads the module global, and other modules may hold a reference.
    fused.extend(group for group in wanted if group not in fused)
    try:
        yield fused
    finally:
        fused[:] = saved


# The same pair for llm-compressor's model-free path, which finds fused weights by tensor name: a primary pattern
# whose shard job also loads the partners (so both share one global scale even across shards), and the set that
# is observed together.
_QKVZ_PRIMARY = r"^(?P<prefix>.+?)\.linear_attn\.in_proj_qkv\.weight$"
_QKVZ_PARTNERS = [r"{prefix}.linear_attn.in_proj_z.weight"]
_QKVZ_SET = [r"re:.*linear_attn\.in_proj_qkv\.weight$", r"re:.*linear_attn\.in_proj_z\.weight$"]


@contextmanager
def model_free_fused_global_scales() -> Iterator[None]:
    """Add the qkv/z pair to model-free PTQ's fused mappings while the block runs; restored on exit.

    `ModelFreePtqConverter` reads both tables at call time, so in-place changes reach it; nothing installed is
    edited."""
    from llmcompressor.entrypoints.model_free import microscale

    mappings, sets = microscale.DEFAULT_FUSED_MAPPINGS, microscale._DEFAULT_FUSED_MAPPINGS_LIST
    saved_mappings, saved_sets = dict(mappings), list(sets)
    mappings.setdefault(_QKVZ_PRIMARY, list(_QKVZ_PARTNERS))
    if _QKVZ_SET not in sets:
        sets.append(list(_QKVZ_SET))
    try:
        yield
    finally:
        mappings.clear()
        mappings.update(saved_mappings)
        sets[:] = saved_sets
