"""Which quantized mixture-of-experts releases vLLM can run, checked before an engine starts.

vLLM runs the experts of a MoE layer as one fused kernel of one scheme: it takes the scheme of the first expert's
projections (vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/
compressed_tensors_moe.py) and loads every expert's tensors as that scheme. A release that keeps some experts of a
layer bf16 (named in its `ignore` list) and quantizes the others is one no vLLM can load, on any device; it is
refused here with the layer named.

vLLM 0.32's CPU build has two kernels for quantized experts (vllm/model_executor/layers/fused_moe/experts/
cpu_moe.py), both only on x86 CPUs with AMX tiles: FP8 weights in 128x128 blocks with dynamic 128-wide activation
groups (`CPUExpertsFp8`; `clef-quant quantize --scheme fp8-block`), and 4-bit integer weights with bf16 activations
(`CPUExpertsInt4`, the WNA16 path; `--scheme w4a16`), which Arm CPUs run through their own kernel
(cpu_int4_moe.py). Any other expert scheme, or these on an x86 CPU without AMX, leaves vLLM without a backend, and
the engine dies in its worker ("Unsupported FP8 MoE backend: NONE", "No WNA16 MoE backend supports the deployment
configuration"). Experts all kept bf16 run anywhere. Dense models (clef-flash, the 27B) are not affected.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import QuantizationArgs, QuantizationGroup, read_release_config

CPU_EXPERT_SCHEMES = "fp8-block or w4a16 on x86 CPUs with AMX tiles, w4a16 on Arm"
INDEX_FILE = "model.safetensors.index.json"
# An expert's projection: `<layer>.mlp.experts.<expert>.<projection>` (one Linear per expert, as released).
_EXPERT = re.compile(r"(?P<layer>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<projection>[^.]+)")


def expert_layer(module: str) -> str | None:
    """The MoE layer (`....mlp.experts`) whose expert projection `module` is, or None for any other module."""
    found = _EXPERT.fullmatch(module)
    return found.group("layer") if found else None


def mixed_expert_layers(modules: Iterable[str], scheme: Callable[[str], str]) -> dict[str, dict[str, list[str]]]:
    """Per MoE layer whose expert projections do not all get one scheme: the projections of each scheme."""
    layers: dict[str, dict[str, list[str]]] = {}
    for module in modules:
        layer = expert_layer(module)
        if layer is not None:
            layers.setdefault(layer, {}).setdefault(scheme(module), []).append(module)
    return {layer: schemes for layer, schemes in layers.items() if len(schemes) > 1}


def check_cpu_experts(model: str | Path) -> None:
    """Refuse a MoE release that keeps some experts of a layer bf16 and quantizes the others (no vLLM loads it),
    and, on a machine without a GPU, one whose quantized experts vLLM's CPU build cannot run (with what to do)."""
    from clef_vllm.engine.invariance import uses_gpu

    folder = Path(model)
    try:
        config = read_release_config(folder)
    except CheckpointError:
        return  # not a local folder, or not readable: the engine reports it
    quantization = config.quantization_config
    if quantization is None or not config.has_routed_experts:
        return
    ignore = quantization.ignore
    experts = sorted(module for module in _stored_modules(folder) if expert_layer(module) is not None)
    mixed = mixed_expert_layers(experts, lambda module: "bf16" if _ignored(module, ignore) else "quantized")
    if mixed:
        raise CheckpointError(f"{model}: {_describe_mixed(mixed)}")
    if uses_gpu() or (experts and all(_ignored(module, ignore) for module in experts)):
        return
    for group in quantization.groups:
        if not _runs_on_cpu(group):
            raise CheckpointError(
                f"{model}: vLLM's CPU build cannot run this release's quantized experts "
                f"({_describe(group)}); on a CPU it runs MoE experts quantized as {CPU_EXPERT_SCHEMES}. "
                "Serve this release on a GPU, or quantize the bf16 release again with one of those schemes"
            )


def _describe_mixed(mixed: dict[str, dict[str, list[str]]]) -> str:
    layer, schemes = next(iter(mixed.items()))
    kept = schemes["bf16"]
    total = sum(len(modules) for modules in schemes.values())
    shown = ", ".join(module.removeprefix(layer.rsplit(".", 1)[0] + ".") for module in kept[:3])
    more = f" (and {len(mixed) - 1} more layer(s) alike)" if len(mixed) > 1 else ""
    return (
        f"{layer} keeps {len(kept)} of its {total} expert projections bf16 ({shown}{', ...' if len(kept) > 3 else ''})"
        f" and quantizes the rest{more}; vLLM runs a MoE layer's experts as one kernel of one scheme, so no vLLM "
        "can load this release. Quantize the bf16 release again with every expert of a layer quantized alike, or "
        "all of them kept bf16"
    )


def _stored_modules(folder: Path) -> set[str]:
    """The modules the folder stores tensors of (a tensor `<module>.<name>`), read from the weights index or from
    the safetensors headers; empty where neither can be read (vLLM reports that folder itself)."""
    try:
        names: Iterable[str] = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        names = _header_names(folder)
    return {name.rsplit(".", 1)[0] for name in names if "." in name}


def _header_names(folder: Path) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                names.extend(handle.keys())
        except (OSError, ValueError, RuntimeError):
            continue
    return names


def _ignored(module: str, ignore: list[str]) -> bool:
    """Whether compressed-tensors' `ignore` keeps `module` bf16, matched as vLLM matches it: the name itself, or a
    `re:` pattern matching from the name's start."""
    for entry in ignore:
        if not entry.startswith("re:"):
            if entry == module:
                return True
            continue
        try:
            if re.match(entry[3:], module):
                return True
        except re.error:
            continue  # a pattern vLLM cannot read either; it reports the folder itself
    return False


def _runs_on_cpu(group: QuantizationGroup) -> bool:
    weights = group.weights or QuantizationArgs()
    activations = group.input_activations
    if weights.type == "int" and weights.num_bits == 4 and activations is None:
        return _has_amx_tiles() or platform.machine().lower() in ("aarch64", "arm64")
    if weights.type == "float" and weights.num_bits == 8 and weights.strategy == "block":
        blocks_fit = weights.block_structure == [128, 128]
        dynamic = bool(activations and activations.dynamic)
        return blocks_fit and dynamic and _has_amx_tiles()
    return False


def _has_amx_tiles() -> bool:
    """What vLLM's x86 expert kernels ask of the CPU (their `_supports_current_device`)."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def _describe(group: QuantizationGroup) -> str:
    weights = group.weights or QuantizationArgs()
    weight = f"{weights.type}{weights.num_bits} {weights.strategy} weights"
    activations = group.input_activations
    if activations is None:
        return f"{weight}, bf16 activations"
    return f"{weight}, {activations.type}{activations.num_bits} {activations.strategy} activations"
