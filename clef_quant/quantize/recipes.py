"""Recipes are data: llm-compressor recipe YAML files in `recipes/` (shipped with clef-quant), one per scheme, plus
any user file.

A recipe is a Jinja2 template: `{{ name }}` placeholders hold facts that differ per checkpoint (the hybrid recipe
splits the decoder layers in two halves). They are filled from the checkpoint's `config.json` before
llm-compressor reads the text; the filled text is what runs and what the manifest records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from clef_quant import shipped
from clef_quant.quantize.errors import QuantizeError

# Scheme name on the command line -> recipe file in the shipped `recipes/` folder.
SCHEMES: dict[str, str] = {
    "fp8-dynamic": "fp8_dynamic.yaml",
    "nvfp4": "nvfp4.yaml",
    "nvfp4-hybrid": "nvfp4_hybrid.yaml",
    "nvfp4a16": "nvfp4a16.yaml",
    "nvfp4-gptq": "nvfp4_gptq.yaml",
    "nvfp4-awq": "nvfp4_awq.yaml",
    "nvfp4-mse": "nvfp4_mse.yaml",
    "fp8-block": "fp8_block.yaml",
    "w4a16": "w4a16.yaml",
}
CUSTOM_SCHEME = "custom"
# Not a recipe: a per-layer mix chosen from a scan (quantize/auto.py).
AUTO_SCHEME = "auto"

# Modules that stay bf16 in every quantized release, in llm-compressor's target syntax (`re:` = re.match from
# the start of the module name, otherwise an exact name). The recipes' ignore lists hold the same entries;
# `clef-quant quantize` refuses a recipe that would quantize any of them and `inspect` checks the result.
KEEP_BF16: tuple[str, ...] = (
    "lm_head",  # the joint schema head reads its rows as lexical features
    r"re:model\.visual\..*",  # the whole vision tower
    r"re:.*linear_attn\.in_proj_[ab]$",  # DeltaNet gate projections (32 outputs each in clef-flash)
)


@dataclass(frozen=True)
class Recipe:
    """A recipe ready for llm-compressor: where it came from and the filled text."""

    scheme: str  # a SCHEMES key, or CUSTOM_SCHEME for a user recipe
    path: Path | Traversable  # a user file, or the shipped recipe of the scheme
    text: str
    variables: dict[str, Any]  # placeholder values used to fill it


def matches_target(name: str, target: str) -> bool:
    """llm-compressor's name matching: `re:` prefix = `re.match`, anything else an exact module name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def is_kept_bf16(name: str) -> bool:
    """True for a Linear module that every Clef quantized release must keep in bf16."""
    return any(matches_target(name, target) for target in KEEP_BF16)


def num_decoder_layers(config: dict[str, Any]) -> int:
    """Decoder layer count from a `config.json` (the text config of a vision-language checkpoint)."""
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise QuantizeError("config.json has no num_hidden_layers (text_config.num_hidden_layers)")
    return layers


def layer_variables(config: dict[str, Any]) -> dict[str, Any]:
    """Placeholder values for a checkpoint: the layer count and the two halves as regex alternations.

    An odd count puts the extra layer in the second half (the half that gets the narrower format keeps
    the larger share, which is the conservative reading of "first half" for accuracy)."""
    layers = num_decoder_layers(config)
    first = layers // 2
    return {
        "num_layers": layers,
        "first_half_layers": "|".join(str(i) for i in range(first)),
        "second_half_layers": "|".join(str(i) for i in range(first, layers)),
    }


def fill(template: str, variables: dict[str, Any]) -> str:
    """The recipe as Jinja2 renders it with `variables`; an unknown name is an error naming it and the names there
    are (checked before rendering, so no placeholder is ever silently left empty)."""
    import jinja2
    from jinja2 import meta

    # The YAML is the template's text: kept byte for byte, final newline included, nothing HTML-escaped.
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    try:
        parsed = environment.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise QuantizeError(f"recipe template error on line {exc.lineno}: {exc.message}") from None
    unknown = sorted(meta.find_undeclared_variables(parsed) - variables.keys())
    if unknown:
        raise QuantizeError(
            f"recipe placeholder(s) {', '.join(unknown)} unknown; available: {', '.join(sorted(variables))}"
        )
    return environment.from_string(parsed).render(variables)


def scheme_recipe_path(scheme: str) -> Traversable:
    if scheme not in SCHEMES:
        raise QuantizeError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return shipped.recipes().joinpath(SCHEMES[scheme])


def load_recipe(scheme: str | None, recipe_file: Path | None, config: dict[str, Any]) -> Recipe:
    """The recipe for a scheme (or a user file, which wins), filled for this checkpoint and checked as YAML."""
    if scheme is None and recipe_file is None:
        raise QuantizeError("give --scheme or --recipe")
    if scheme is not None and scheme not in SCHEMES:
        raise QuantizeError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    path: Path | Traversable = Path(recipe_file) if recipe_file is not None else scheme_recipe_path(scheme or "")
    try:
        template = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise QuantizeError(f"cannot read recipe {path}: {exc.strerror}") from None
    variables = layer_variables(config)
    text = fill(template, variables)
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise QuantizeError(f"recipe {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise QuantizeError(f"recipe {path} is not an llm-compressor recipe (expected a mapping of stages)")
    return Recipe(scheme=scheme or CUSTOM_SCHEME, path=path, text=text, variables=variables)
