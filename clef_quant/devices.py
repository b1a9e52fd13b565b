"""The devices the tools run on, named as torch names them: `cpu`, `cuda` (the current GPU) or `cuda:N`.

Checked in one place, so that every command and library entry point accepts and refuses the same names with
the same words. torch is imported only when a CUDA device is named.
"""

from __future__ import annotations

import re

DEVICE_HELP = "cpu, cuda or cuda:N"
_DEVICE_NAME = re.compile(r"cpu|cuda(?::(?P<index>\d+))?")


def device_problem(device: str) -> str | None:
    """Why `device` cannot be used on this machine, or None when it can."""
    match = _DEVICE_NAME.fullmatch(device)
    if match is None:
        return f"--device must be cpu or cuda[:N], not {device!r}"
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return f"--device {device} was given, but no CUDA device is available"
    index = match.group("index")
    if index is not None and int(index) >= torch.cuda.device_count():
        return f"--device {device} was given, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def is_cuda(device: str) -> bool:
    """A well-formed CUDA device name (whether or not this machine has it)."""
    return device != "cpu" and _DEVICE_NAME.fullmatch(device) is not None
