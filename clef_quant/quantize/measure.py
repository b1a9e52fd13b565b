"""Time per stage and peak memory of a `quantize` run, as its result and manifest report them."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager

from clef_quant.devices import is_cuda


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Store the block's wall time in `timings[name]`, also when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - start


def peak_host_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_gpu_bytes(device: str) -> int | None:
    """Peak CUDA memory allocated so far on `device` (cuda:N counts GPU N, not the current one); None on the CPU."""
    if not is_cuda(device):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(torch.device(device)))
