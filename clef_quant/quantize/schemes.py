"""Names for what a Linear module became, and the module groups vLLM fuses, shared by quantize and inspect."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

BF16 = "bf16"  # the label of a module that stays unquantized (whatever its float dtype)

# Sibling modules vLLM loads as one fused layer (Qwen3.5: in_proj_qkvz, in_proj_ba, qkv_proj, gate_up_proj).
# One fused layer has one quantization method, so every member must have the same scheme, and under
# tensor-group schemes the same weight global scale.
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (
    ("in_proj_qkv", "in_proj_z"),
    ("in_proj_b", "in_proj_a"),
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
)

# The fields that decide how numbers are stored; observers and dtypes of zero points do not.
_ARG_FIELDS = ("num_bits", "type", "strategy", "symmetric", "group_size", "dynamic", "block_structure")
# Preferred names when several presets are the same thing (W8A8 = INT8).
_PREFERRED = ("FP8_DYNAMIC", "NVFP4", "NVFP4A16", "FP8", "FP8_BLOCK", "W8A8", "W4A16", "W8A16")

_LAYER_PREFIX = re.compile(r"^(?:.*\.)?layers\.\d+\.")
_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")


def module_kind(name: str) -> str:
    """A module's kind for totals: `lm_head`, `vision`, `audio` (Omni's audio tower), or its path inside a decoder
    layer (`mlp.up_proj`; one kind for all experts of a MoE layer: `mlp.experts.up_proj`)."""
    if name == "lm_head" or name.endswith(".lm_head"):
        return "lm_head"
    if ".visual." in f".{name}":
        return "vision"
    if ".audio_tower." in f".{name}":
        return "audio"
    stripped = _EXPERT_INDEX.sub(".experts.", _LAYER_PREFIX.sub("", name))
    return stripped if stripped != name else name.rsplit(".", 1)[-1]


def _normalized(args: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    if not args:
        return None
    values = []
    for key in _ARG_FIELDS:
        value = args.get(key)
        value = getattr(value, "value", value)  # enums from live objects, strings from JSON
        if isinstance(value, list):
            value = tuple(value)
        values.append(str(value).lower() if isinstance(value, (str, bool)) else value)
    return tuple(values)


@cache
def _presets() -> dict[tuple[Any, ...], str]:
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    table: dict[tuple[Any, ...], str] = {}
    names = [n for n in _PREFERRED if n in PRESET_SCHEMES] + [n for n in PRESET_SCHEMES if n not in _PREFERRED]
    for name in names:
        preset = PRESET_SCHEMES[name]
        if not preset:
            continue
        weights = preset.get("weights")
        inputs = preset.get("input_activations")
        key = (
            _normalized(weights.model_dump(mode="json") if weights is not None else None),
            _normalized(inputs.model_dump(mode="json") if inputs is not None else None),
        )
        table.setdefault(key, name)
    return table


def scheme_label(weights: Mapping[str, Any] | None, input_activations: Mapping[str, Any] | None = None) -> str:
    """The compressed-tensors preset name these quantization args equal (FP8_DYNAMIC, NVFP4, ...), or a
    description such as `w4-float-group/128 a16` when they match no preset."""
    if not weights and not input_activations:
        return BF16
    key = (_normalized(weights), _normalized(input_activations))
    preset = _presets().get(key)
    if preset is not None:
        return preset
    return f"{_describe('w', weights)} {_describe('a', input_activations)}"


def _describe(prefix: str, args: Mapping[str, Any] | None) -> str:
    if not args:
        return f"{prefix}16"
    strategy = getattr(args.get("strategy"), "value", args.get("strategy"))
    group = f"/{args['group_size']}" if args.get("group_size") else ""
    kind = getattr(args.get("type"), "value", args.get("type"))
    return f"{prefix}{args.get('num_bits')}-{kind}-{strategy}{group}"


def fused_groups_of(names: list[str]) -> list[tuple[str, list[str]]]:
    """`(parent, members)` for every fused group whose members all appear in `names` (module names)."""
    present = set(names)
    parents = sorted({name.rsplit(".", 1)[0] for name in names if "." in name})
    groups = []
    for parent in parents:
        for group in FUSED_GROUPS:
            members = [f"{parent}.{member}" for member in group]
            if all(member in present for member in members):
                groups.append((parent, members))
    return groups
