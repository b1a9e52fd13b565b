"""Recipes are data: llm-compressor recipe YAML files in `recipes/` (shipped with clef-quant), one per scheme, plus
any user file. What a shipped file says about its scheme (its front matter) is read by `registry.py`.

A recipe is a Jinja2 template: `{{ name }}` placeholders hold facts that differ per checkpoint (the hybrid recipe
splits the decoder layers in two halves), filled from the checkpoint's `config.json` before llm-compressor reads
the text, and `{{ keep_bf16 | yaml_list }}`, the keep-list below, which every shipped recipe's `ignore` is. The
filled text is what runs and what the manifest records.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from clef_quant.documents import parse_yaml
from clef_quant.families import FAMILIES, Family, family_of_config
from clef_quant.quantize import registry
from clef_quant.quantize.errors import QuantizeError
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import ReleaseConfig, release_config

CUSTOM_SCHEME = "custom"
# Not a recipe: a per-layer mix chosen from a scan (quantize/auto.py).
AUTO_SCHEME = "auto"


@dataclass(frozen=True)
class KeptBf16:
    """Modules that stay bf16 in every quantized release, and why (in the model card's words, per module kind)."""

    target: str  # llm-compressor's target syntax: `re:` = re.match from the start of the name, else an exact name
    reasons: dict[str, str]  # module kind (schemes.module_kind) -> why it stays bf16


# The keep-list of each Clef model (`clef_quant.families`). Every shipped recipe's `ignore` is rendered from the
# model's list, `clef-quant quantize` refuses a recipe that would quantize any of it, `inspect` checks the result
# and the card says why each kind stays bf16.
def keep_list(family: Family | None = None) -> tuple[KeptBf16, ...]:
    """The keep-list of `family` (clef-flash's when None)."""
    chosen = family or FAMILIES["clef-flash"]
    return tuple(KeptBf16(target, reasons) for target, reasons in chosen.keep)


def keep_bf16(family: Family | None = None) -> tuple[str, ...]:
    """The keep-list's targets, as a recipe's `ignore` lists them."""
    return tuple(kept.target for kept in keep_list(family))


KEEP_LIST: tuple[KeptBf16, ...] = keep_list()
KEEP_BF16: tuple[str, ...] = keep_bf16()
# Every family's targets: their module names never overlap (Omni's all start with `thinker.`, and its router
# pattern `mlp.gate$` matches no Qwen3.5 module), so a name-only check can use them all.
_ALL_KEEP_TARGETS: tuple[str, ...] = tuple(dict.fromkeys(t for f in FAMILIES.values() for t, _ in f.keep))


def keep_reasons(family: Family | None = None) -> dict[str, str]:
    """Why each module kind of the keep-list stays bf16."""
    return {kind: why for kept in keep_list(family) for kind, why in kept.reasons.items()}


@dataclass(frozen=True)
class Recipe:
    """A recipe ready for llm-compressor, read and parsed once: where it came from, the filled text (what the
    manifest records) and that text parsed (what llm-compressor builds its modifiers from)."""

    scheme: str  # a registry scheme name, CUSTOM_SCHEME for a user recipe, or AUTO_SCHEME
    path: Path | Traversable  # a user file, the shipped recipe of the scheme, or auto's scan
    text: str
    variables: dict[str, Any]  # placeholder values used to fill it
    document: dict[str, Any]  # `text` parsed: a mapping of stages
    shipped: bool = False  # the registry's own file, not a --recipe file given with or instead of a scheme

    @functools.cached_property
    def compressor_recipe(self) -> Any:
        """llm-compressor's Recipe, built from `document` on first use: the one object the run plans with,
        quantizes with and writes as `recipe.yaml`. Built lazily because importing llm-compressor takes seconds and
        the cheaper checks of a run come first; a modifier or field it refuses is a one-line QuantizeError."""
        return compressor_recipe(self.document)


def matches_target(name: str, target: str) -> bool:
    """llm-compressor's name matching: `re:` prefix = `re.match`, anything else an exact module name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def is_kept_bf16(name: str, family: Family | None = None) -> bool:
    """True for a Linear module that a quantized release of `family` (of any Clef model when None) keeps in bf16."""
    targets = keep_bf16(family) if family is not None else _ALL_KEEP_TARGETS
    return any(matches_target(name, target) for target in targets)


def checked_config(config: ReleaseConfig | Mapping[str, Any]) -> ReleaseConfig:
    """`config` typed (a mapping is a `config.json` already parsed); one of another shape is a QuantizeError."""
    try:
        return release_config(config)
    except CheckpointError as exc:
        raise QuantizeError(str(exc)) from None


def num_decoder_layers(config: ReleaseConfig | Mapping[str, Any]) -> int:
    """Decoder layer count from a `config.json` (the text config of a vision-language checkpoint)."""
    layers = checked_config(config).text.num_hidden_layers
    if layers is None or layers < 1:
        raise QuantizeError("config.json has no num_hidden_layers (text_config.num_hidden_layers)")
    return layers


def layer_variables(config: ReleaseConfig | Mapping[str, Any]) -> dict[str, Any]:
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


def yaml_quoted(value: str) -> str:
    """`value` as a single-quoted YAML scalar: backslashes stay as they are (regex targets), `'` doubles."""
    return "'" + value.replace("'", "''") + "'"


def yaml_list(values: list[str] | tuple[str, ...]) -> str:
    """A YAML flow sequence of single-quoted scalars, for one line of a recipe (`ignore: [...]`)."""
    return "[" + ", ".join(yaml_quoted(v) for v in values) + "]"


def recipe_environment() -> Any:
    """The Jinja2 environment recipes are filled in: the keep-list and the YAML quoting filters are always there."""
    import jinja2

    # The YAML is the template's text: kept byte for byte, final newline included, nothing HTML-escaped.
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    environment.filters["yaml_quoted"] = yaml_quoted
    environment.filters["yaml_list"] = yaml_list
    environment.globals["keep_bf16"] = KEEP_BF16
    return environment


def fill(template: str, variables: dict[str, Any], keep: tuple[str, ...] | None = None) -> str:
    """The recipe as Jinja2 renders it with `variables` and `keep_bf16` (`keep`, clef-flash's list when None); an
    unknown name is an error naming it and the names there are (checked before rendering, so no placeholder is
    ever silently left empty)."""
    import jinja2
    from jinja2 import meta

    environment = recipe_environment()
    try:
        parsed = environment.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise QuantizeError(f"recipe template error on line {exc.lineno}: {exc.message}") from None
    available = variables.keys() | environment.globals.keys()
    unknown = sorted(meta.find_undeclared_variables(parsed) - available)
    if unknown:
        raise QuantizeError(
            f"recipe placeholder(s) {', '.join(unknown)} unknown; available: {', '.join(sorted(variables))}, keep_bf16"
        )
    chosen = {"keep_bf16": keep} if keep is not None else {}
    return environment.from_string(parsed).render({**variables, **chosen})


def scheme_choices() -> tuple[str, ...]:
    """What `--scheme` accepts: every scheme of the registry, then auto."""
    return (*registry.schemes().names, AUTO_SCHEME)


class SchemeName(str):
    """A `--scheme` value `check_scheme` accepted. The command line's parser hands this on, so the run it starts
    takes the scheme as checked; a plain string (the library entered directly) is checked where the run begins."""


def check_scheme(scheme: str) -> SchemeName:
    """`scheme` if `--scheme` accepts it: the one check of a run's scheme (the command line's parser's, else the
    library's)."""
    if scheme not in scheme_choices():
        raise QuantizeError(registry.unknown_scheme(scheme, scheme_choices()))
    return SchemeName(scheme)


def check_recipe_choice(scheme: str | None, recipe_file: Path | None) -> SchemeName | None:
    """A quantize run names a scheme or a recipe file, and a scheme it names exists (checked here unless the
    command line's parser did); the scheme, checked, or None."""
    if scheme is None and recipe_file is None:
        raise QuantizeError(f"give --scheme or --recipe; --scheme is one of {', '.join(scheme_choices())}")
    if scheme is None or isinstance(scheme, SchemeName):
        return scheme
    return check_scheme(scheme)


def scheme_recipe_path(scheme: str) -> Traversable:
    """The shipped recipe file of a scheme."""
    return registry.schemes().recipe_path(scheme)


def load_recipe(scheme: str | None, recipe_file: Path | None, config: ReleaseConfig | Mapping[str, Any]) -> Recipe:
    """The recipe for a scheme (or a user file, which wins), filled for this checkpoint and checked as YAML, for
    callers that have not checked the choice (a quantize run has: it calls `recipe_of`)."""
    return recipe_of(check_recipe_choice(scheme, recipe_file), recipe_file, config)


def recipe_of(scheme: SchemeName | None, recipe_file: Path | None, config: ReleaseConfig | Mapping[str, Any]) -> Recipe:
    """The recipe of a choice `check_recipe_choice` accepted, filled for this checkpoint and parsed.

    A shipped recipe is the text the registry read; a user's file is read here. A file's front matter (a first YAML
    document under `clef:`, as the shipped recipes have) is not part of the recipe: it is left out of what
    llm-compressor reads and what the manifest records."""
    if scheme == AUTO_SCHEME and recipe_file is None:
        raise QuantizeError("--scheme auto is planned from a scan, not read from a recipe file")
    path: Path | Traversable
    if recipe_file is None:
        path, template = scheme_recipe_path(scheme or ""), registry.schemes().recipe_template(scheme or "")
    else:
        path = Path(recipe_file)
        try:
            _, template = registry.split_front_matter(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise QuantizeError(f"cannot read recipe {path}: {exc.strerror}") from None
    config = checked_config(config)
    variables = layer_variables(config)
    text = fill(template, variables, keep_bf16(family_of_config(config)))
    # A --recipe file given with --scheme wins over the scheme's own: only the shipped file itself counts as shipped.
    shipped = scheme in registry.schemes().names and str(path) == str(scheme_recipe_path(scheme or ""))
    return parsed_recipe(scheme or CUSTOM_SCHEME, path, text, variables, shipped=shipped)


def parsed_recipe(
    scheme: str, path: Path | Traversable, text: str, variables: dict[str, Any], *, shipped: bool = False
) -> Recipe:
    """`text` parsed into a Recipe; a text that is not a mapping of stages is refused naming `path`."""
    document = parse_yaml(text, where=f"recipe {path}", error=QuantizeError)
    if not isinstance(document, dict) or not document:
        raise QuantizeError(f"recipe {path} is not an llm-compressor recipe (expected a mapping of stages)")
    return Recipe(scheme=str(scheme), path=path, text=text, variables=variables, document=document, shipped=shipped)


def compressor_recipe(recipe: Mapping[str, Any] | str) -> Any:
    """llm-compressor's Recipe for a parsed recipe (or, for callers holding only the text, the text); a bad modifier
    or field is a one-line user error."""
    from llmcompressor.recipe import Recipe as CompressorRecipe

    try:
        if isinstance(recipe, str):
            return CompressorRecipe.create_instance(recipe)
        return CompressorRecipe.from_dict(dict(recipe))
    except Exception as exc:  # pydantic and registry errors: the recipe is the user's to fix
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QuantizeError(f"llm-compressor cannot use this recipe: {first}") from None
