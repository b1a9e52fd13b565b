"""Wall time of a call on CPU or GPU, and the device time of its kernels from the profiler."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

SETTLE_S = 0.5
PROFILED_RUNS = 10


def timed_ms(func: Callable[[], torch.Tensor], device: torch.device, runs: int, warmup: int) -> list[float]:
    """Milliseconds of each run; the device is synchronized around every run so queued work is counted.

    On a GPU the warm-up also lasts at least SETTLE_S: an idle card starts at a low clock, and a forward of a
    few milliseconds would otherwise be timed while the clock ramps up.
    """
    start = time.perf_counter()
    done = 0
    while done < warmup or (device.type == "cuda" and time.perf_counter() - start < SETTLE_S):
        func()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        done += 1
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        func()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def kernel_ms(func: Callable[[], torch.Tensor], device: torch.device, runs: int = PROFILED_RUNS) -> float | None:
    """Device time of the kernels (and device copies) one call runs, from the profiler; None off the GPU."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(runs):
            func()
        torch.cuda.synchronize(device)
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return total_us / runs / 1e3 if total_us else None
