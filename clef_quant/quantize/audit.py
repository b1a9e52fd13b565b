"""The load-safety audit of `clef-quant inspect` (and so of `upload`): what engines we do not run (vLLM's own
classes, SGLang, llama.cpp) load without a word and then compute wrong. Each rule is one check line of inspect's
summary, and each failure names its tensor or module:

1. scales (here): every scale and global scale compressed-tensors stores (`weight_scale`, `weight_global_scale`,
   `input_global_scale`, `input_scale`, `k_scale` ...) is finite and positive, every stored zero point finite;
2. zeros (`audit_zeros`): no FP4, FP8 or packed-int block or row of a quantized weight is all zero where the bf16
   source's is not (rows only when the source is not on this machine);
3. targets (`audit_names`): every `quantization_config` target and `ignore` entry matches a module of the model;
4. fused global scales: the groups vLLM fuses share one `weight_global_scale`: inspect's CHECK_FUSED line
   (`inspect_checks.fused_group_violations`, over `schemes.FUSED_GROUPS`), not repeated here;
5. names (`audit_names`): the index and the shards agree, and hold the tensors `config.json`'s architecture loads.

Tensors are read one at a time (safetensors' `safe_open`), so memory follows the largest tensor, not the model.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from clef_quant.quantize.audit_names import model_view, name_violations, quant_params, target_violations
from clef_quant.quantize.audit_zeros import open_source, zero_block_violations
from clef_quant.quantize.inspect_modules import ConfigSchemes
from clef_quant.quantize.inspect_report import CHECK_SCALES, CheckResult, Violation, check_result
from clef_quant.quantize.stored_tensors import StoredTensor
from clef_vllm.format.manifest import Manifest
from clef_vllm.format.release_config import QuantizationConfig, ReleaseConfig


def audit_release(
    folder: Path,
    config: ReleaseConfig,
    quantization_config: QuantizationConfig | None,
    configured: ConfigSchemes,
    index: dict[str, StoredTensor],
    by_module: dict[str, dict[str, StoredTensor]],
    manifest: Manifest | None,
    violations: list[Violation],
    notes: list[str],
) -> list[CheckResult]:
    """The audit's check lines (rules 1, 2, 3 and 5), in that order; its violations are added to `violations`."""
    checks = [scale_violations(index, violations)]
    checks.append(zero_block_violations(by_module, configured, open_source(manifest), violations, notes))
    view, why_not = model_view(folder, config)
    checks.append(target_violations(view, why_not, quantization_config, violations))
    checks.append(name_violations(folder, view, why_not, index, violations))
    return checks


def scale_violations(index: dict[str, StoredTensor], violations: list[Violation]) -> CheckResult:
    """Rule 1. A scale multiplies every value it covers: NaN or Inf spreads to every output that reads them, and
    zero or a negative value silences or flips them. compressed-tensors itself never writes a zero scale (it puts
    its dtype's smallest step there), so a zero is damage, not a rounding. A zero point may be 0 or negative, so only
    finiteness applies to it."""
    from safetensors import safe_open

    params = quant_params()
    scales, zero_points = params.scales, params.zero_points
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name, entry in index.items():
        if name.rpartition(".")[2] in scales | zero_points:
            by_file[entry.file].append(name)
    found = []
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as handle:
            for name in sorted(names):
                problem = _scale_problem(handle.get_tensor(name), is_scale=name.rpartition(".")[2] in scales)
                if problem is not None:
                    found.append(Violation(CHECK_SCALES, name, problem))
    violations += sorted(found, key=lambda v: v.subject)
    if not by_file:
        return CheckResult(CHECK_SCALES, "skipped", "no scale or zero point stored (nothing quantized)")
    counted = sum(len(names) for names in by_file.values())
    return check_result(CHECK_SCALES, violations, f"{counted} scale and zero-point tensor(s) read, all finite and > 0")


def _scale_problem(tensor: Any, is_scale: bool) -> str | None:
    import torch

    if not (tensor.is_floating_point() or is_scale):
        return None  # an integer zero point is always finite
    values = tensor.float().flatten()
    kinds = {"NaN": torch.isnan(values), "infinite": torch.isinf(values)}
    if is_scale:
        kinds["zero or negative"] = values <= 0  # False for NaN, so no value counts twice
    counts = {kind: int(mask.sum()) for kind, mask in kinds.items()}
    if not any(counts.values()):
        return None
    bad = torch.stack(list(kinds.values())).any(0)
    first = int(bad.nonzero()[0])
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), tuple(tensor.shape)))
    listed = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    return (
        f"{listed} of {values.numel()} value(s) (first at {list(where)}: {values[first].item():g}); "
        "an engine loads it as it is and every output it scales is wrong"
    )
