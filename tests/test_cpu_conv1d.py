"""DeltaNet's CPU causal convolution with fp32 weights gives vLLM's bf16 outputs and conv states bit for bit."""

from __future__ import annotations

import pytest
import torch

from clef_vllm.engine.cpu.conv1d import register, with_fp32_weights

conv_module = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d")


def run(conv, x, weight, bias, states, starts, has_initial):
    states = states.clone()
    out = conv(
        x=x.clone(), weight=weight, bias=bias, conv_states=states, query_start_loc=starts,
        cache_indices=torch.arange(len(starts) - 1), has_initial_state=has_initial, activation="silu",
    )  # fmt: skip
    return out, states


@pytest.mark.parametrize("with_bias", [False, True])
def test_fp32_weights_give_the_same_bf16_bits(with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(7)
    channels, taps, lengths = 1024, 4, [1, 5, 300, 1700]
    total = sum(lengths)
    x = torch.randn(channels, total, generator=generator).to(torch.bfloat16)
    weight = torch.randn(channels, taps, generator=generator).to(torch.bfloat16)
    bias = torch.randn(channels, generator=generator).to(torch.bfloat16) if with_bias else None
    states = torch.randn(len(lengths), channels, taps - 1, generator=generator).to(torch.bfloat16)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    has_initial = torch.tensor([True, False, True, False])

    stock = run(conv_module.causal_conv1d_fn_cpu, x, weight, bias, states, starts, has_initial)
    upcast = run(with_fp32_weights(conv_module.causal_conv1d_fn_cpu), x, weight, bias, states, starts, has_initial)
    assert stock[0].dtype == upcast[0].dtype == torch.bfloat16
    assert torch.equal(stock[0], upcast[0])
    assert torch.equal(stock[1], upcast[1])


def test_register_patches_the_gated_deltanet_prefill_once() -> None:
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    register()
    patched = gdn_attention.causal_conv1d_torch
    register()
    assert gdn_attention.causal_conv1d_torch is patched
    assert patched.__wrapped__ is conv_module.causal_conv1d_fn_cpu


@pytest.mark.parametrize("length", [1, 7, 1669])
def test_transformers_convolution_in_fp32_gives_the_same_bf16_bits(length: int) -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    from clef_vllm.engine.cpu.conv1d import use_in_transformers

    use_in_transformers()
    use_in_transformers()
    patched = modeling.causal_conv1d_fn
    stock = patched.__wrapped__
    assert not getattr(stock, "_clef_fp32_weights", False)  # patched once, not wrapped twice
    generator = torch.Generator().manual_seed(length)
    x = torch.randn(2, 1024, length, generator=generator).to(torch.bfloat16)
    weight = torch.randn(1024, 4, generator=generator).to(torch.bfloat16)
    for activation in ("silu", None):
        expected = stock(x, weight, None, activation=activation)
        got = patched(x, weight, None, activation=activation)
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected), activation
