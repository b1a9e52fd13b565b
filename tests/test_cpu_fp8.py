"""The FP8 kernel for CPUs without AMX-FP8 computes what vLLM's `torch._scaled_mm` kernel computes."""

from __future__ import annotations

import pytest
import torch

from clef_vllm.engine.cpu.fp8 import UpcastFP8ScaledMMLinearKernel, fp8_scaled_mm, register


def _operands(m: int, k: int, n: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=generator) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=generator) * 4).to(torch.float8_e4m3fn).t()  # [K, N], as vLLM stores it
    a_scale = torch.rand(m, 1, generator=generator) + 0.01
    b_scale = torch.rand(n, 1, generator=generator) + 0.01
    bias = torch.randn(n, generator=generator)
    return a, b, a_scale, b_scale, bias


@pytest.mark.parametrize("per_tensor", [False, True])
def test_upcast_product_equals_scaled_mm(per_tensor: bool) -> None:
    a, b, a_scale, b_scale, bias = _operands(33, 64, 48)
    if per_tensor:
        a_scale, b_scale = a_scale[:1, :1].reshape(()), b_scale[:1, :1].reshape(())
    one = torch.ones(1)
    # vLLM's channel-wise torch kernel: the raw fp8 product in fp32, then both scales, then the bias
    raw = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
    expected = (raw * a_scale.reshape(-1, 1) * b_scale.reshape(1, -1) + bias).to(torch.bfloat16)
    got = fp8_scaled_mm(a, b, a_scale, b_scale, torch.bfloat16, bias)
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=8e-3, atol=1e-5)  # one bf16 ulp at most


def test_registered_ahead_of_the_scaled_mm_kernels_once() -> None:
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import TorchFP8ScaledMMLinearKernel
    from vllm.platforms import PlatformEnum

    register()
    register()
    kernels = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CPU]
    assert kernels.count(UpcastFP8ScaledMMLinearKernel) == 1
    ours = kernels.index(UpcastFP8ScaledMMLinearKernel)
    assert all(ours < i for i, k in enumerate(kernels) if issubclass(k, TorchFP8ScaledMMLinearKernel))
    assert UpcastFP8ScaledMMLinearKernel.is_supported()[0]


@pytest.mark.slow
def test_fp8_folder_runs_on_the_upcast_kernel(quantized_dir, clef_engine) -> None:
    engine = clef_engine(quantized_dir("fp8-dynamic"), max_num_batched_tokens=4096)
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    kernels = {
        type(module.scheme.fp8_linear).__name__
        for module in model.modules()
        if hasattr(getattr(module, "scheme", None), "fp8_linear")
    }
    assert kernels == {UpcastFP8ScaledMMLinearKernel.__name__}
