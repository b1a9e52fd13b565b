"""Time per stage and peak memory of a `quantize` run, as its result and manifest report them."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_quant.devices import is_cuda
from clef_quant.formatting import gib
from clef_quant.quantize.errors import QuantizeError


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


@contextmanager
def device_memory_errors(device: str, model_bytes: int, streaming: bool) -> Iterator[None]:
    """A device that runs out of memory ends the run as bad input does: one line that says what did not fit and
    what to try, instead of torch's traceback (the staged output folder is removed either way)."""
    try:
        yield
    except Exception as exc:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(exc, torch.OutOfMemoryError):
            raise
        detail = str(exc).split(". Including")[0].strip()
        held = "one shard at a time" if streaming else f"the whole model ({gib(model_bytes)} in bf16) at once"
        raise QuantizeError(
            f"{device} ran out of memory while quantizing ({detail}); this scheme holds {held} there: quantize "
            "on a device with more memory, or with --device cpu (slower; the model must fit in host memory)"
        ) from exc
