"""Time per stage and peak memory of a `quantize` run, as its result and manifest report them."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    """Peak resident memory of this process so far.

    Linux's VmHWM belongs to this program alone; `ru_maxrss` survives exec, so a process started from a large
    one (a benchmark's parent, a test runner) would report its parent's size as its own peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_gpu_bytes(device: str) -> int | None:
    """Peak CUDA memory allocated so far on `device` (cuda:N counts GPU N, not the current one); None on the CPU."""
    if not is_cuda(device):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(torch.device(device)))
