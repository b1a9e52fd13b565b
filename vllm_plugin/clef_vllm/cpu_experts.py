"""Which quantized mixture-of-experts releases vLLM's CPU build can run, checked before an engine starts.

vLLM 0.32's CPU build has two kernels for quantized experts (vllm/model_executor/layers/fused_moe/experts/
cpu_moe.py): FP8 weights in 128x128 blocks with dynamic 128-wide activation groups (`CPUExpertsFp8`, which needs
AMX tiles; `clef-quant quantize --scheme fp8-block`), and 4-bit integer weights with bf16 activations (the
WNA16 path; `--scheme w4a16`). Any other expert scheme leaves vLLM without a backend, and the engine dies in its
worker with "Unsupported FP8 MoE backend: NONE". Dense models (clef-flash, the 27B) are not affected.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clef_vllm.errors import CheckpointError

CPU_EXPERT_SCHEMES = "fp8-block (on CPUs with AMX) or w4a16"


def check_cpu_experts(model: str | Path) -> None:
    """On a machine without a GPU, refuse (with what to do instead) a MoE release whose quantized experts vLLM's
    CPU build cannot run."""
    from clef_vllm.invariance import uses_gpu

    if uses_gpu():
        return
    config = _read_config(Path(model))
    if config is None or not _has_experts(config):
        return
    quantization = config.get("quantization_config") or {}
    if not quantization or _experts_ignored(quantization.get("ignore") or []):
        return
    for group in (quantization.get("config_groups") or {}).values():
        if isinstance(group, dict) and not _runs_on_cpu(group):
            raise CheckpointError(
                f"{model}: vLLM's CPU build cannot run this release's quantized experts "
                f"({_describe(group)}); on a CPU it runs MoE experts quantized as {CPU_EXPERT_SCHEMES}. "
                "Serve this release on a GPU, or quantize the bf16 release again with one of those schemes"
            )


def _read_config(folder: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not a local folder, or not readable: the engine reports it
    return config if isinstance(config, dict) else None


def _has_experts(config: dict[str, Any]) -> bool:
    """Whether any (nested) model config has routed experts (Omni keeps them in thinker_config.text_config)."""
    if (config.get("num_experts") or 0) > 0:
        return True
    return any(isinstance(value, dict) and _has_experts(value) for value in config.values())


def _experts_ignored(ignore: list[str]) -> bool:
    expert = "model.layers.0.mlp.experts.0.gate_proj"
    for entry in ignore:
        if entry.startswith("re:"):
            if re.search(entry[3:], expert):
                return True
        elif ".mlp.experts." in entry:
            return True
    return False


def _runs_on_cpu(group: dict[str, Any]) -> bool:
    weights = group.get("weights") or {}
    activations = group.get("input_activations")
    if weights.get("type") == "int" and weights.get("num_bits") == 4 and activations is None:
        return True
    if weights.get("type") == "float" and weights.get("num_bits") == 8 and weights.get("strategy") == "block":
        import torch

        blocks_fit = list(weights.get("block_structure") or []) == [128, 128]
        dynamic = bool(activations and activations.get("dynamic"))
        return blocks_fit and dynamic and torch.cpu._is_amx_tile_supported()
    return False


def _describe(group: dict[str, Any]) -> str:
    weights = group.get("weights") or {}
    activations = group.get("input_activations") or {}
    weight = f"{weights.get('type')}{weights.get('num_bits')} {weights.get('strategy')} weights"
    if not activations:
        return f"{weight}, bf16 activations"
    return f"{weight}, {activations.get('type')}{activations.get('num_bits')} {activations.get('strategy')} activations"
