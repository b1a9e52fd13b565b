"""llm-compressor on a machine without an accelerator: turn off pinned host memory for the duration of a run.

AWQ (llm-compressor 0.14) pins its cached calibration activations before each grid search so that they copy to
the GPU without blocking. Pinning needs an accelerator; on a CPU-only machine it raises "Cannot access
accelerator device when none is available". There is nothing to copy to there, so leaving the tensors
unpinned changes no number. The switch is scoped like `fused_global_scales`: nothing installed is edited, and
the original method is back when the block ends, whatever happened inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_pinned_memory_without_accelerator() -> Iterator[bool]:
    """Make llm-compressor's intermediate cache skip pinning while no accelerator exists; yields whether it did."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        yield False
        return
    original = IntermediatesCache.__dict__["_pin_intermediate"]
    IntermediatesCache._pin_intermediate = classmethod(lambda cls, intermediate: None)  # type: ignore[assignment]
    try:
        yield True
    finally:
        IntermediatesCache._pin_intermediate = original  # type: ignore[assignment]


@contextmanager
def one_rank_is_not_distributed() -> Iterator[bool]:
    """Run llm-compressor single-process when this process holds a one-rank process group; yields whether it did.

    A process that started an in-process vLLM engine (as the Python API and the tests do) has initialized
    torch.distributed with one rank. llm-compressor then takes its distributed paths, and AWQ's all-reduce looks
    for an accelerator to reduce on, failing on a CPU-only machine. With one rank there is nothing to reduce, so
    the single-process path computes the same numbers. Runs under torchrun (several ranks) are left as they are.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() == 1):
        yield False
        return
    from compressed_tensors.offload.utils import as_single_threaded

    with as_single_threaded():
        yield True
