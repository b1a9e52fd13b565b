"""On a GPU: the quantized Linear layers of a Clef model at a step's token count, timed per kernel.

For clef-flash and the 27B (`clef-quant make-tiny` sizes), each of the Linear shapes vLLM runs (its merged
projections: gate and up, Gated DeltaNet's q/k/v/z, attention's q/k/v) is timed with random inputs under
vLLM's CUTLASS FP8 (per-token activations x per-channel weights: what FP8_DYNAMIC runs), `torch._scaled_mm` with the
same rowwise scales, CUTLASS FP8 with 128x128 weight blocks (fp8-block) and bf16 `torch.mm`. The report gives each
shape's TFLOP/s and the whole model's Linear time per step, per kernel. The per-token quantization of the activations
is timed once per shape (in the model, torch.compile fuses it into the RMSNorm before most of them).

    python scripts/fp8_gemm_kernels.py bench/results/gemm-h100.md   # needs CUDA and vLLM's CUDA build
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from clef_quant.tiny.sizes import SIZES, Size

# Step sizes: the Flide workloads' prompt lengths and a full step of whole prompts.
TOKENS = {"flash": (553, 1500, 6445, 16384), "clef": (553, 685, 1500, 6445, 7198)}


def linear_shapes(size: Size) -> list[tuple[str, int, int, int]]:
    """(name, N, K, layers) of every quantized Linear vLLM runs for a Qwen3.5 text model, merged as vLLM merges them;
    `in_proj_a`/`in_proj_b` stay bf16 and are left out."""
    text = size.text
    hidden, layers = text.hidden_size, text.num_hidden_layers
    attention_layers = layers // text.full_attention_interval
    key = text.linear_num_key_heads * text.linear_key_head_dim
    value = text.linear_num_value_heads * text.linear_value_head_dim
    query = text.num_attention_heads * text.head_dim
    return [
        ("gate_up", 2 * text.intermediate_size, hidden, layers),
        ("down", hidden, text.intermediate_size, layers),
        ("gdn_qkvz", 2 * key + 2 * value, hidden, layers - attention_layers),
        ("gdn_out", hidden, value, layers - attention_layers),
        # Qwen3.5's attention gates its output: q_proj holds the query and the gate.
        ("attn_qkv", 2 * query + 2 * text.num_key_value_heads * text.head_dim, hidden, attention_layers),
        ("attn_o", hidden, query, attention_layers),
    ]


def _timed(fn: Callable[[], object], calls: int = 30) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def _kernels(m: int, n: int, k: int) -> Iterator[tuple[str, Callable[[], object]]]:
    from vllm import _custom_ops as ops

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    x8, x_scale = ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    w8, w_scale = ops.scaled_fp8_quant(w, use_per_token_if_dynamic=True)  # one scale per output channel
    yield "quant_act", lambda: ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    yield "cutlass_fp8", lambda: ops.cutlass_scaled_mm(x8, w8.t(), x_scale, w_scale, torch.bfloat16)
    row_scale = w_scale.view(1, n).contiguous()
    yield (
        "torch_scaled_mm",
        lambda: torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=row_scale, out_dtype=torch.bfloat16),
    )
    block_x = torch.rand(m, k // 128, device="cuda").t().contiguous().t()  # M-major, as CUTLASS's blockwise wants
    block_w = torch.rand(k // 128, n // 128, device="cuda")
    yield "cutlass_fp8_block", lambda: ops.cutlass_scaled_mm(x8, w8.t(), block_x, block_w, torch.bfloat16)
    yield "bf16_mm", lambda: torch.mm(x, w.t())


def measure(out: Path) -> None:
    rows: list[dict[str, object]] = []
    summary: list[str] = []
    for model in TOKENS:
        shapes = linear_shapes(SIZES[model])
        for m in TOKENS[model]:
            totals: dict[str, float] = {}
            for name, n, k, layers in shapes:
                for kernel, fn in _kernels(m, n, k):
                    try:
                        ms = _timed(fn)
                    except Exception as error:  # a kernel this build lacks for the shape
                        rows.append({"model": model, "tokens": m, "shape": name, "kernel": kernel, "error": str(error)})
                        continue
                    rows.append(
                        {"model": model, "tokens": m, "shape": name, "n": n, "k": k, "kernel": kernel, "ms": ms}
                    )
                    totals[kernel] = totals.get(kernel, 0.0) + ms * layers
                torch.cuda.empty_cache()
            flops = sum(2 * m * n * k * layers for _, n, k, layers in shapes)
            timed = ", ".join(
                f"{kernel} {ms:.2f} ms ({flops / ms / 1e9:.0f} TFLOP/s)"
                for kernel, ms in totals.items()
                if kernel != "quant_act"
            )
            summary.append(f"- {model}, {m} tokens, every Linear once: {timed}")
            print(summary[-1], flush=True)
    header = [
        f"# Linear layers per kernel: {torch.cuda.get_device_name()}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; "
        f"`python scripts/fp8_gemm_kernels.py {out}`; ms per call (CUDA events, 30 calls after 5 untimed)",
        "",
    ]
    table = ["| model | tokens | shape | N | K | kernel | ms | TFLOP/s |", "|---|---:|---|---:|---:|---|---:|---:|"]
    for row in rows:
        if "error" in row:
            table.append(f"| {row['model']} | {row['tokens']} | {row['shape']} | | | {row['kernel']} | error | |")
            continue
        flop = 2 * row["tokens"] * row["n"] * row["k"]  # type: ignore[operator]
        rate = "" if row["kernel"] == "quant_act" else f"{flop / row['ms'] / 1e9:.0f}"  # type: ignore[operator]
        table.append(
            f"| {row['model']} | {row['tokens']} | {row['shape']} | {row['n']} | {row['k']} | {row['kernel']} "
            f"| {row['ms']:.3f} | {rate} |"
        )
    out.write_text("\n".join([*header, *summary, "", "## Per shape", "", *table]) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    measure(Path(sys.argv[1]))
