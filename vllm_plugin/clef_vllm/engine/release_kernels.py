"""Whether vLLM has kernels here for every quantized layer of a release, checked before an engine starts (by
`clef-systemone`, `ClefEngine` and `clef-quant eval`), so a release that cannot run is refused in one line instead
of an engine that dies while loading it.

The experts of a MoE release are checked in `cpu_experts`. Dense layers: vLLM 0.32 runs weight-only FP4
(NVFP4A16: FP4 weights in blocks of 16, bf16 activations) only through GPU kernels (Marlin, FlashInfer's CuTe DSL,
Humming; vllm/model_executor/kernels/linear/__init__.py), so on a CPU the engine stops while loading the model
("Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available"). NVFP4 with FP4
activations runs on a CPU through the emulation kernel the plugin registers (`plugin.py`), and W4A16 (INT4 weights)
through vLLM's own.
"""

from __future__ import annotations

from pathlib import Path

from clef_vllm.engine.cpu.experts import check_cpu_experts
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import QuantizationGroup, read_release_config

CPU_FP4_SCHEMES = "nvfp4 (FP4 activations too) or w4a16 (INT4 weights)"


def check_release_kernels(model: str | Path) -> None:
    """`CheckpointError` (one line, with what to do) for a release this machine's vLLM cannot run."""
    check_cpu_experts(model)
    check_cpu_dense(model)


def check_cpu_dense(model: str | Path) -> None:
    """On a machine without a GPU, refuse a release storing weight-only FP4 layers, which vLLM's CPU build has no
    kernel for."""
    from clef_vllm.engine.invariance import uses_gpu

    if uses_gpu():
        return
    for group in _config_groups(Path(model)):
        if group.stores_fp4_weights and group.weight_only:
            raise CheckpointError(
                f"{model}: vLLM's CPU build has no kernel for weight-only FP4 (NVFP4A16: FP4 weights, bf16 "
                f"activations), which this release stores; on a CPU serve one quantized as {CPU_FP4_SCHEMES} "
                "(clef-quant quantize --scheme), or serve this one on a GPU"
            )


def _config_groups(folder: Path) -> list[QuantizationGroup]:
    try:
        quantization = read_release_config(folder).quantization_config
    except CheckpointError:
        return []  # a Hub id, or a folder vLLM will report itself
    return quantization.groups if quantization is not None else []
