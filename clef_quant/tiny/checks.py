"""What `make_tiny` refuses before building anything: a bad size, seed or device, a folder in the way, or too
little host memory, device memory or disk; every problem reported at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from clef_quant.checkpoint_names import disk_tensors
from clef_quant.devices import device_problem, is_cuda
from clef_quant.formatting import gib
from clef_quant.release_folder.errors import ReleaseFolderError
from clef_quant.release_folder.outputs import check_output
from clef_quant.tiny.backbone_config import backbone_config, meta_model, placeholder_ids
from clef_quant.tiny.sizes import SIZES, Size
from clef_quant.tiny.weights import plan_shards
from clef_vllm.errors import ClefError

# Room left besides the shard being written, in host memory and on disk.
_MARGIN_BYTES = 1 << 30


class TinyBuildError(ClefError):
    """A make-tiny request that cannot be carried out (bad size, device, existing folder, too little memory)."""


def check_request(out_dir: Path, size: str, seed: int, device: str, overwrite: bool) -> Size:
    """Everything that can be known to fail before the build, all reported at once."""
    problems: list[str] = []
    spec = SIZES.get(size)
    if spec is None:
        problems.append(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if not 0 <= seed < 2**63:
        problems.append(f"seed must be between 0 and 2**63 - 1, not {seed}")
    device_refusal = device_problem(device)
    if device_refusal is not None:
        problems.append(device_refusal)
    try:
        check_output(out_dir, "make-tiny", overwrite)
    except ReleaseFolderError as exc:
        problems.append(str(exc))
    if spec is not None and not problems:
        problems.extend(_resource_problems(out_dir, spec, device))
    if problems:
        raise TinyBuildError("; ".join(problems))
    assert spec is not None
    return spec


def _resource_problems(out_dir: Path, spec: Size, device: str) -> list[str]:
    model = meta_model(backbone_config(spec, placeholder_ids(spec)))
    shards = plan_shards(disk_tensors(model), spec.max_shard_bytes)
    total = sum(shard.num_bytes for shard in shards)
    largest = max(shard.num_bytes for shard in shards)
    problems = []
    # One shard lives on the device while it is drawn and again in host memory while it is written (safetensors
    # serializes it whole); on the CPU both copies are in host memory.
    host_needed = largest * (2 if device == "cpu" else 1) + _MARGIN_BYTES
    host_free = _available_host_memory()
    if host_free is not None and host_free < host_needed:
        hint = f" (build the {spec.name} size on a GPU: --device cuda)" if device == "cpu" else ""
        problems.append(
            f"size {spec.name} needs about {gib(host_needed)} of free memory on the host, "
            f"{gib(host_free)} is available{hint}"
        )
    if is_cuda(device):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if free < largest + _MARGIN_BYTES:
            problems.append(f"size {spec.name} needs about {gib(largest + _MARGIN_BYTES)} free on {device}")
    existing = out_dir.parent
    while not existing.exists():
        existing = existing.parent
    disk_free = shutil.disk_usage(existing).free
    if disk_free < total + _MARGIN_BYTES:
        problems.append(f"size {spec.name} writes {gib(total)}; {existing} has {gib(disk_free)} free")
    return problems


def _available_host_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
