"""scripts/fp8_gemm_kernels.py times the Linear shapes it derives from a make-tiny size; those shapes must be the
model's: every quantized Linear weight of the Qwen3.5 text model, as transformers builds it, counted once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from clef_quant.tiny.backbone_config import backbone_config, meta_model, placeholder_ids
from clef_quant.tiny.sizes import SIZES

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fp8_gemm_kernels.py"
KEPT_BF16 = ("in_proj_a", "in_proj_b")


def script():
    spec = importlib.util.spec_from_file_location("fp8_gemm_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("size", ["flash", "clef", "small"])
def test_the_timed_shapes_are_every_quantized_linear_of_the_model(size: str) -> None:
    spec = SIZES[size]
    model = meta_model(backbone_config(spec, placeholder_ids(spec)))
    weights = {
        name: module.weight.shape
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and "language_model" in name and not name.endswith(KEPT_BF16)
    }
    shapes = script().linear_shapes(spec)
    # Merged projections hold the same weights as the model's separate ones: same K, and N summed per layer.
    assert sum(n * k * layers for _, n, k, layers in shapes) == sum(s.numel() for s in weights.values())
    assert {k for _, _, k, _ in shapes} == {shape[1] for shape in weights.values()}
    assert (
        sum(layers for name, _, _, layers in shapes if name.startswith(("gdn", "attn")))
        == 2 * spec.text.num_hidden_layers
    )
