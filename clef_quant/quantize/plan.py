"""What a recipe will do to a loaded model, checked before the slow part.

llm-compressor resolves each quantization modifier to config groups (scheme + targets) and an ignore list;
matching those against the model's Linear modules gives, per module, the scheme it will get. Two things are
refused here, with every offending module listed at once: quantizing a module that must stay bf16 (the head
reads `lm_head`; the vision tower and DeltaNet gates stay exact), giving the members of a group vLLM fuses
different schemes (one fused GEMM has one quantization method; llm-compressor itself would stop with an
assertion midway through calibration), and giving the experts of a MoE layer different schemes, one kept bf16
among quantized ones included (vLLM runs a layer's experts as one kernel of one scheme, read from the first
expert: no vLLM could load the release).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clef_quant.families import family_of_config
from clef_quant.formatting import first_few
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.recipes import compressor_recipe, is_kept_bf16, keep_bf16
from clef_quant.quantize.schemes import BF16, fused_groups_of, scheme_label
from clef_vllm.engine.cpu.experts import mixed_expert_layers

MAX_LISTED = 8


@dataclass
class QuantPlan:
    """Per Linear module (model order): the scheme label it gets, `bf16` when it stays unquantized."""

    schemes: dict[str, str]

    @property
    def quantized(self) -> list[str]:
        return [name for name, label in self.schemes.items() if label != BF16]

    @property
    def kept_bf16(self) -> list[str]:
        return [name for name, label in self.schemes.items() if label == BF16]


def parse_recipe(text: str) -> Any:
    """llm-compressor's Recipe for a filled recipe text, for callers holding only the text (the scan, benchmarks; a
    quantize run builds it once from its `Recipe`); a bad modifier or field is a one-line user error."""
    return compressor_recipe(text)


def recipe_needs_calibration(recipe: Any) -> bool:
    """Whether any modifier wants calibration data (static activation scales, GPTQ, ...)."""
    return any(getattr(m, "requires_calibration_data", False) for m in recipe.modifiers)


def plan_quantization(model: Any, recipe: Any) -> QuantPlan:
    """Resolve the recipe against the model's Linear modules and refuse what must not happen."""
    import torch
    from compressed_tensors.utils import match_named_modules
    from llmcompressor.modifiers.quantization import QuantizationMixin

    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    schemes = dict.fromkeys(linears, BF16)
    for modifier in recipe.modifiers:
        if not isinstance(modifier, QuantizationMixin):
            continue
        config = modifier.resolved_config
        target_to_scheme = {t: group for group in config.config_groups.values() for t in group.targets}
        for name, _module in match_named_modules(model, list(target_to_scheme), config.ignore or []):
            if name not in linears:
                continue
            # The first matching target wins, as in compressed-tensors' apply_quantization_config.
            group = next(g for t, g in target_to_scheme.items() if _matches(name, linears[name], t))
            schemes[name] = scheme_label(
                group.weights.model_dump() if group.weights is not None else None,
                group.input_activations.model_dump() if group.input_activations is not None else None,
            )

    config = getattr(model, "config", None)
    family = family_of_config(config.to_dict()) if config is not None else None
    _refuse_keep_list(schemes, keep_bf16(family))
    _refuse_split_fused_groups(schemes)
    _refuse_mixed_experts(schemes)
    if not any(label != BF16 for label in schemes.values()):
        raise QuantizeError("the recipe quantizes no Linear module of this model; check its targets")
    return QuantPlan(schemes=schemes)


def _matches(name: str, module: Any, target: str) -> bool:
    from compressed_tensors.utils.match import is_match

    return is_match(name, module, target)


def _listing(names: list[str]) -> str:
    return first_few(names, MAX_LISTED, separator=", ")


def _refuse_keep_list(schemes: dict[str, str], targets: tuple[str, ...]) -> None:
    bad = [name for name, label in schemes.items() if label != BF16 and is_kept_bf16(name)]
    if bad:
        keep = ", ".join(repr(t) for t in targets)
        raise QuantizeError(
            f"the recipe quantizes {len(bad)} module(s) that must stay bf16: {_listing(bad)}; "
            f"add these to its ignore list: {keep}"
        )


def _refuse_split_fused_groups(schemes: dict[str, str]) -> None:
    bad = []
    for parent, members in fused_groups_of(list(schemes)):
        labels = {schemes[m] for m in members}
        if len(labels) > 1:
            described = "/".join(f"{m.rsplit('.', 1)[1]}={schemes[m]}" for m in members)
            bad.append(f"{parent} ({described})")
    if bad:
        raise QuantizeError(
            f"vLLM fuses these modules into one layer, so they need one scheme: {_listing(bad)}; "
            "target or ignore the whole group together"
        )


def _refuse_mixed_experts(schemes: dict[str, str]) -> None:
    mixed = mixed_expert_layers(schemes, schemes.__getitem__)
    if not mixed:
        return
    described = []
    for layer, by_scheme in mixed.items():
        counts = sorted(by_scheme.items(), key=lambda item: len(item[1]))
        fewest, *rest = counts
        example = fewest[1][0].removeprefix(layer.rsplit(".", 1)[0] + ".")
        others = ", ".join(f"{len(modules)} {label}" for label, modules in rest)
        described.append(f"{layer} ({len(fewest[1])} {fewest[0]}, e.g. {example}; {others})")
    raise QuantizeError(
        f"vLLM runs the experts of a MoE layer as one kernel of one scheme, so no vLLM could load a release that mixes "
        f"them: {_listing(described)}; target or ignore every expert of a layer together"
    )
