"""The Linear modules of a checkpoint folder and the scheme each has, from the tensors and config.json alone."""

from __future__ import annotations

from typing import Any

from clef_quant.quantize.inspect_report import CHECK_CONSISTENT, CHECK_KEEP, LinearInfo, Violation
from clef_quant.quantize.recipes import matches_target
from clef_quant.quantize.schemes import BF16, module_kind, scheme_label
from clef_quant.quantize.stored_tensors import StoredTensor, dense_shape, describe_stored
from clef_vllm.format.release_config import QuantizationConfig

QUANTIZED_MARKERS = ("weight_packed", "weight_scale")
UNKNOWN_SCHEME = "quantized (scheme not in config)"


def is_embedding(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "embed" in last or last in ("wte", "wpe")


class ConfigSchemes:
    """The scheme label compressed-tensors' config assigns to a Linear module by name."""

    def __init__(self, quantization_config: QuantizationConfig | None, notes: list[str]) -> None:
        self.groups: list[tuple[list[str], str]] = []
        self.weight_args: list[dict[str, Any]] = []  # each group's `weights` arguments, in the order of `groups`
        self.ignore: list[str] = []
        if quantization_config is None:
            return
        for group in quantization_config.groups:
            weights, inputs = group.written_args()
            self.groups.append((list(group.targets), scheme_label(weights, inputs)))
            self.weight_args.append(weights or {})
        self.ignore = list(quantization_config.ignore)
        odd = sorted(
            {t for targets, _ in self.groups for t in targets if self._is_class(t) and t != "Linear"}
            | {t for t in self.ignore if self._is_class(t) and t != "Linear"}
        )
        if odd:
            notes.append(f"class-name targets other than Linear cannot be resolved from files: {', '.join(odd)}")

    @staticmethod
    def _is_class(target: str) -> bool:
        return not target.startswith("re:") and "." not in target and target[:1].isupper()

    def _matches(self, name: str, target: str) -> bool:
        return target == "Linear" if self._is_class(target) else matches_target(name, target)

    def _group(self, name: str) -> int | None:
        """The config group that quantizes `name` (the first whose targets match), None when ignored or none."""
        if any(self._matches(name, target) for target in self.ignore):
            return None
        return next(
            (i for i, (targets, _) in enumerate(self.groups) if any(self._matches(name, t) for t in targets)), None
        )

    def label(self, name: str) -> str:
        group = self._group(name)
        return BF16 if group is None else self.groups[group][1]

    def weights(self, name: str) -> dict[str, Any]:
        """The `weights` quantization arguments of the group that quantizes `name` (empty when none does)."""
        group = self._group(name)
        return {} if group is None else self.weight_args[group]


def linear_modules(
    by_module: dict[str, dict[str, StoredTensor]], configured: ConfigSchemes
) -> tuple[list[LinearInfo], list[Violation]]:
    """Every Linear module with its configured scheme, in natural name order, and where config and tensors disagree."""
    violations: list[Violation] = []
    modules: list[LinearInfo] = []
    for name, params in by_module.items():
        packed = "weight_packed" in params
        dense = "weight" in params and len(params["weight"].shape) == 2
        if not (packed or dense):
            continue
        quantized = any(marker in params for marker in QUANTIZED_MARKERS)
        if is_embedding(name):
            if quantized:
                violations.append(Violation(CHECK_KEEP, name, "embedding is quantized; embeddings stay bf16"))
            continue
        label = configured.label(name)
        if label != BF16 and not quantized:
            violations.append(
                Violation(
                    CHECK_CONSISTENT, name, f"config says {label} but the stored weight is {describe_stored(params)}"
                )
            )
        if label == BF16 and quantized:
            violations.append(
                Violation(CHECK_CONSISTENT, name, f"stored quantized ({describe_stored(params)}) but config says bf16")
            )
            label = UNKNOWN_SCHEME
        modules.append(
            LinearInfo(name, module_kind(name), dense_shape(name, params), label, describe_stored(params), quantized)
        )

    modules.sort(key=lambda m: natural_key(m.name))
    return modules, violations


def natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in name.split(".")]
