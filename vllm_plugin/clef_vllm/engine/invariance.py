"""How a request's probabilities are kept independent of what else is in flight, per platform.

A row of the engine's output can change with the rest of its step in three ways:
1. a prompt split across steps (chunked prefill) runs its second part against cached state: other roundings;
2. a kernel whose reduction order depends on the step's size (split-K GEMMs, split-KV attention, reductions
   that tile by the row count);
3. a padded batch in the head (the pooler runs the head one prompt at a time, so this never happens here).

On a GPU every method turns chunked prefill off and lets several whole prompts share a step (1). For 2:

- `SPLIT_FREE`, the default: vLLM's own fast kernels (CUTLASS FP8 with torch.compile's fused RMSNorm and per-token
  quantization, FlashAttention, the Triton Gated DeltaNet kernels), with only the reductions whose order follows
  the step's size removed: cuBLAS split-K (a one-byte cuBLASLt workspace, reduced-precision reductions off) and
  FlashAttention's KV splits (one split, no ahead-of-time schedule). The other kernels of a whole-prompt prefill
  reduce within one token's row or walk one sequence (`cu_seqlens`). Measured on an H100
  (bench/results/serve-h100.md): every request got the bits it got alone, inside a 64-request batch (16/16) and
  inside batches of random sizes holding prompts of 500 to 4,096 tokens (42/42), in FP8 and bf16, at the speed of
  free batching (FP8 34.1 against 33.7 records/s batched; bf16 25.4 against 25.3).
- `KERNELS` (`CLEF_GPU_INVARIANCE=vllm`): vLLM's batch-invariant mode (`VLLM_BATCH_INVARIANT=1`), which also routes
  RMSNorm, softmax, `bmm` and `mean` through fixed-order kernels and breaks torch.compile's fusion of the FP8
  per-token quantization: FP8 at 16.1 records/s on the same H100 (0.48 of batched), one request 73.5 ms p50 against
  45.5 split-free. vLLM 0.32 refuses that mode for Gated DeltaNet layers ("not supported for GDN_ATTN") because a
  decode step reads state an earlier, differently batched step wrote; a Clef engine never decodes (each prompt is
  prefilled whole, from a zero state), so `accept_gdn_layers` lifts the refusal for the Clef model only. bf16
  linears keep cuBLAS without split-K there on Hopper and newer (`CLEF_INVARIANT_BF16_GEMM=triton` asks for
  vLLM's Triton matmul). Releases with FP4 weights on Blackwell keep this mode: it has a batch-invariant NVFP4
  kernel, and the FP4 GEMMs the split-free method would keep are not measured yet.

Before Blackwell there is no FP4 tensor core and Marlin splits K by the problem size, so NVFP4 and NVFP4A16
releases run one whole prompt per step (`ONE_PROMPT_PER_STEP`), as on a CPU, where oneDNN's bf16 GEMMs round a
row differently with the number of rows in the call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clef_vllm.errors import CheckpointError, SettingsError
from clef_vllm.format.release_config import read_release_config

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
BF16_GEMM_ENV = "CLEF_INVARIANT_BF16_GEMM"  # "cublas" (split-K off, the default on Hopper and newer) or "triton"
# FP4 tensor cores, and with them vLLM's batch-invariant NVFP4 kernel, start with Blackwell.
FP4_CAPABILITY = 10
# Whole prompts per step on a GPU: enough tokens for about ten 1.5k-token records, a step size at which an H200's
# GEMMs are compute bound.
GPU_STEP_TOKENS = 16384

KERNELS = "batch-invariant kernels"
SPLIT_FREE = "split-free kernels"
ONE_PROMPT_PER_STEP = "one prompt per step"
# Which GPU method the default mode uses where both can: "split-free" (SPLIT_FREE, the default) or "vllm" (KERNELS).
GPU_METHOD_ENV = "CLEF_GPU_INVARIANCE"
GPU_METHODS = {"split-free": SPLIT_FREE, "vllm": KERNELS}
# Read by the engine's processes (they inherit it): the split-free method is on for the engine being started.
SPLIT_FREE_ENV = "CLEF_SPLIT_FREE"
# Which BLAS library the split-free method prefers for unquantized GEMMs: "cublaslt" (the default) or "cublas"
# (torch's own choice). Both run without a split-K workspace.
SPLIT_FREE_BLAS_ENV = "CLEF_SPLIT_FREE_BLAS"
SPLIT_FREE_BLAS = ("cublaslt", "cublas")
# cuBLAS and cuBLASLt pick split-K only when they have a workspace to reduce the partial sums in.
NO_SPLIT_K_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}


def uses_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def invariance_method(gpu: bool, model: str | Path | None = None, capability: int | None = None) -> str:
    """How the default (invariant) mode keeps answers independent of load for `model` on this kind of device.

    `capability`: the GPU's major compute capability (default: this machine's first GPU)."""
    if not gpu:
        return ONE_PROMPT_PER_STEP
    if model is not None and stores_fp4_weights(model):
        if capability is None:
            import torch

            capability = torch.cuda.get_device_capability()[0]
        if capability < FP4_CAPABILITY:
            return ONE_PROMPT_PER_STEP
        # vLLM's mode has a batch-invariant NVFP4 kernel there; the FP4 GEMMs the split-free method would keep
        # have not been measured alone and in a batch.
        return KERNELS
    return chosen_gpu_method()


def chosen_gpu_method() -> str:
    """The GPU method `CLEF_GPU_INVARIANCE` names (default: the split-free kernels)."""
    name = os.environ.get(GPU_METHOD_ENV, "split-free")
    if name not in GPU_METHODS:
        raise SettingsError(f"{GPU_METHOD_ENV}={name!r}: the choices are {', '.join(GPU_METHODS)}")
    if GPU_METHODS[name] == SPLIT_FREE:
        split_free_blas()  # refused here, in the process that starts the engine, not in the engine's own
    return GPU_METHODS[name]


def batches_whole_prompts(method: str) -> bool:
    """Whether `method` lets several whole prompts share a step (the GPU methods) or runs one per step."""
    return method in (KERNELS, SPLIT_FREE)


def stores_fp4_weights(model: str | Path) -> bool:
    """Whether a release folder's compressed-tensors config stores 4-bit float weights (NVFP4, NVFP4A16)."""
    try:
        return read_release_config(model).stores_fp4_weights
    except CheckpointError:
        return False  # a Hub id, or a folder the engine reports itself


def set_invariant_kernels(enabled: bool) -> None:
    """Turn vLLM's batch-invariant kernels on or off for the engines started from now on in this process.

    The engine core reads the variable in its own process, which inherits it; vLLM's cached copy of its
    environment is dropped so an in-process core reads it too."""
    os.environ[BATCH_INVARIANT_ENV] = "1" if enabled else "0"
    import vllm.envs as envs

    if envs._is_envs_cache_enabled():
        envs.disable_envs_cache()


_SAVED_ENV: dict[str, str | None] = {}


def set_split_free_kernels(enabled: bool) -> None:
    """Turn the split-free method on or off for the engines started from now on in this process: the flag their
    processes read, and cuBLAS's workspace settings (read when a process first uses cuBLAS). Turning it off puts
    back what the environment held before."""
    os.environ[SPLIT_FREE_ENV] = "1" if enabled else "0"
    if enabled:
        for name, value in NO_SPLIT_K_ENV.items():
            _SAVED_ENV.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        return
    for name, value in _SAVED_ENV.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _SAVED_ENV.clear()


def split_free_kernels_on() -> bool:
    return os.environ.get(SPLIT_FREE_ENV) == "1"


def use_split_free_kernels() -> None:
    """In the process that builds the Clef model, before its layers exist: no split-K in cuBLAS, one KV split in
    FlashAttention. Only the attention metadata builder is patched, and only while the flag is on."""
    import torch

    for name, value in NO_SPLIT_K_ENV.items():
        os.environ.setdefault(name, value)
    # A tuple since torch 2.10: (allow reduced precision, allow split-K reductions in it).
    off: Any = (False, False) if _torch_at_least(2, 10) else False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = off
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = off
    if torch.cuda.is_available() and split_free_blas() == "cublaslt":
        torch.backends.cuda.preferred_blas_library(backend="cublaslt")
    _one_kv_split_in_flash_attention()


def split_free_blas() -> str:
    """The BLAS library `CLEF_SPLIT_FREE_BLAS` names for the split-free method's unquantized GEMMs."""
    name = os.environ.get(SPLIT_FREE_BLAS_ENV, SPLIT_FREE_BLAS[0])
    if name not in SPLIT_FREE_BLAS:
        raise SettingsError(f"{SPLIT_FREE_BLAS_ENV}={name!r}: the choices are {', '.join(SPLIT_FREE_BLAS)}")
    return name


def _torch_at_least(major: int, minor: int) -> bool:
    import torch

    found = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return found >= (major, minor)


def _one_kv_split_in_flash_attention() -> None:
    try:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    except ImportError:  # a build without FlashAttention (the CPU's): nothing splits there
        return
    build = FlashAttentionMetadataBuilder.build
    if getattr(build, "_clef_one_split", False):
        return

    def one_split_build(self: Any, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        if not split_free_kernels_on():
            return build(self, common_prefix_len, common_attn_metadata, fast_build)
        # FA3 picks its KV split count (and an ahead-of-time schedule) from the whole step's shape.
        self.aot_schedule = False
        metadata = build(self, common_prefix_len, common_attn_metadata, fast_build)
        metadata.max_num_splits = 1
        return metadata

    one_split_build._clef_one_split = True  # type: ignore[attr-defined]
    FlashAttentionMetadataBuilder.build = one_split_build  # type: ignore[method-assign]


def invariant_kernels_on() -> bool:
    import vllm.envs as envs

    return bool(envs.VLLM_BATCH_INVARIANT)


def accept_gdn_layers() -> None:
    """Let vLLM's batch-invariant mode run the Clef model's Gated DeltaNet layers (prefill only; see above).

    Called while the Clef model is built, in the process that builds it, so other models keep vLLM's refusal."""
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

    GDNAttentionBackend.supports_batch_invariance = classmethod(_prefill_only_invariant)  # type: ignore[method-assign]


def _prefill_only_invariant(cls: type) -> bool:
    return True


def keep_cublas_for_bf16_linears() -> bool:
    """Under vLLM's batch-invariant mode, run unquantized linear layers through cuBLAS (split-K off) instead of
    vLLM's Triton matmul, on Hopper and newer unless `CLEF_INVARIANT_BF16_GEMM=triton`. Returns whether it did."""
    import torch

    if os.environ.get(BF16_GEMM_ENV, "cublas") != "cublas" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability()[0] < 9:
        return False
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    def apply(self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
        return self._gemm_impl(layer, x, layer.weight, bias)

    UnquantizedLinearMethod.apply = apply  # type: ignore[method-assign]
    return True
