"""How a request's probabilities are kept independent of what else is in flight, per platform.

A row of the engine's output can change with the rest of its step in three ways:
1. a prompt split across steps (chunked prefill) runs its second part against cached state: other roundings;
2. a kernel whose reduction order depends on the step's size (split-K GEMMs, split-KV attention, reductions
   that tile by the row count);
3. a padded batch in the head (the pooler runs the head one prompt at a time, so this never happens here).

On a GPU, vLLM's batch-invariant mode (`VLLM_BATCH_INVARIANT=1`) covers 2: on Hopper it turns cuBLAS split-K
off, runs FlashAttention with one KV split and routes softmax, `bmm` and `mean` through fixed-order kernels.
vLLM 0.32 refuses that mode for Gated DeltaNet layers ("not supported for GDN_ATTN") because a decode step
reads state that an earlier, differently batched step wrote. A Clef engine never decodes: each prompt is
prefilled whole, from a zero state, by kernels that walk each sequence on its own (`cu_seqlens`), so the
refusal does not apply and `accept_gdn_layers` lifts it for the Clef model only. With chunked prefill off (1),
prompts share a step without changing each other's bits, and the engine keeps vLLM's batching.

vLLM's mode also sends every bf16 linear layer through its own persistent Triton matmul. On Hopper and newer,
cuBLAS without split-K (which the mode already forces through the cuBLAS workspace settings) keeps a row's
reduction order too; `CLEF_INVARIANT_BF16_GEMM=cublas` keeps cuBLAS for those layers (`bench modes` measures both).

On a CPU there is no such mode: oneDNN's bf16 GEMMs round a row differently with the number of rows in the call.
There, invariance means one whole prompt per step (`ONE_PROMPT_PER_STEP`), at the cost of batching.
"""

from __future__ import annotations

import os
from typing import Any

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
BF16_GEMM_ENV = "CLEF_INVARIANT_BF16_GEMM"  # "triton" (vLLM's batch-invariant matmul, the default) or "cublas"
# Whole prompts per step on a GPU: enough tokens for about ten 1.5k-token records, a step size at which an H200's
# GEMMs are compute bound.
GPU_STEP_TOKENS = 16384

KERNELS = "batch-invariant kernels"
ONE_PROMPT_PER_STEP = "one prompt per step"


def uses_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def invariance_method(gpu: bool) -> str:
    """What the default (invariant) mode does on this kind of device."""
    return KERNELS if gpu else ONE_PROMPT_PER_STEP


def set_invariant_kernels(enabled: bool) -> None:
    """Turn vLLM's batch-invariant kernels on or off for the engines started from now on in this process.

    The engine core reads the variable in its own process, which inherits it; vLLM's cached copy of its
    environment is dropped so an in-process core reads it too."""
    os.environ[BATCH_INVARIANT_ENV] = "1" if enabled else "0"
    import vllm.envs as envs

    if envs._is_envs_cache_enabled():
        envs.disable_envs_cache()


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
    vLLM's Triton matmul, when asked to and the GPU is Hopper or newer. Returns whether it did."""
    import torch

    if os.environ.get(BF16_GEMM_ENV, "triton") != "cublas" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability()[0] < 9:
        return False
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    def apply(self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
        return self._gemm_impl(layer, x, layer.weight, bias)

    UnquantizedLinearMethod.apply = apply  # type: ignore[method-assign]
    return True
