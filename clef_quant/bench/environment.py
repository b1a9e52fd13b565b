"""What a benchmark report says about the machine it ran on (the table it opens with is `formatting.facts_table`)."""

from __future__ import annotations

import os
import platform

import torch


def engine_device() -> torch.device:
    """Where vLLM's engines run: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def load_average() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores, at the start"
