"""Whether each engine reads a quantized release's weights as they are stored, judged from its files alone.

`clef_quant/engines_compat.py` says which engines take a folder for a Clef model; this module says what each
makes of the quantized backbone. The rules of each engine are one row of data (`clef_quant/engines_loading_rules.py`),
read from its released code for a compressed-tensors checkpoint of `Qwen3_5ForConditionalGeneration`: the
checkpoint modules it fuses into one layer, how it spells its layers and matches `quantization_config.ignore` and
the config groups' targets against them, and what it does when the members of one fused layer are ignored
differently, when a stored tensor has no parameter in the layer it built, and when the members of one NVFP4 layer
carry different global scales. `check_folder` applies every row to a folder's config.json and the names, dtypes
and global scales of its shards, and gives per engine: loads as stored, loads but drops or misreads weights (naming
the layers), or refuses to load. Nothing is loaded but the shards' headers and the few global scales of fused NVFP4
layers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.engines_compat import ENGINES, QWEN3_5, detect_all
from clef_quant.engines_loading_rules import HEAD, RULES, LoadRules, Verdict
from clef_quant.formatting import first_few
from clef_quant.quantize.inspect_modules import is_embedding
from clef_quant.quantize.schemes import scheme_label
from clef_quant.quantize.stored_tensors import StoredTensor, group_by_module, read_tensor, read_tensor_index
from clef_vllm.format.release_config import QuantizationConfig, QuantizationGroup, read_release_config

FLOAT_DTYPES = ("BF16", "F16", "F32")


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    layer: str  # the engine's layer, spelled as the checkpoint spells its modules (the fused name where fused)
    what: str

    def __str__(self) -> str:
        return f"{self.layer}: {self.what}"


@dataclass(frozen=True)
class LoadCheck:
    engine: str
    read: str | None  # the code the rules come from; None: no rules for this engine or this folder
    findings: tuple[Finding, ...] = ()
    note: str = ""

    @property
    def verdict(self) -> Verdict | None:
        if self.read is None:
            return None
        return max((finding.verdict for finding in self.findings), default=Verdict.LOADS)

    def summary(self, limit: int = 2) -> str:
        """One line: the verdict and the first layers behind it (`refuses: layer: why; ... (and 3 more)`)."""
        verdict = self.verdict
        if verdict is None:
            return f"not checked: {self.note}"
        if verdict is Verdict.LOADS:
            return verdict.words + (f" ({self.note})" if self.note else "")
        worst = [finding for finding in self.findings if finding.verdict is verdict]
        return f"{verdict.words}: {first_few(worst, limit)}"

    def as_json(self) -> dict[str, Any]:
        verdict = self.verdict
        return {
            "verdict": verdict.words if verdict is not None else None,
            "rules_read_from": self.read,
            "findings": [{"verdict": f.verdict.words, "layer": f.layer, "what": f.what} for f in self.findings],
            "note": self.note,
        }


@dataclass(frozen=True)
class Group:
    targets: tuple[str, ...]
    format: str | None
    weights: dict[str, Any]
    inputs: dict[str, Any] | None


@dataclass(frozen=True)
class Layout:
    """What the engines read of a release: config.json's quantization facts and the Linear modules' stored tensors."""

    architectures: tuple[str, ...]
    quant_method: str | None
    ignore: tuple[str, ...]
    groups: tuple[Group, ...]
    modules: dict[str, dict[str, StoredTensor]]  # checkpoint module name -> parameter name -> stored tensor


def read_layout(folder: Path) -> Layout:
    config = read_release_config(folder)
    quantization = config.quantization_config or QuantizationConfig()
    groups = tuple(_group(group, quantization.format) for group in quantization.groups)
    modules = {
        name: {key: value for key, value in params.items() if key != "bias"}
        for name, params in group_by_module(read_tensor_index(Path(folder))).items()
        if _is_linear(name, params)
    }
    return Layout(tuple(config.architectures), quantization.quant_method, tuple(quantization.ignore), groups, modules)


def _group(group: QuantizationGroup, config_format: str | None) -> Group:
    weights, inputs = group.written_args()
    return Group(tuple(group.targets), group.format or config_format, weights or {}, inputs)


def _is_linear(name: str, params: dict[str, StoredTensor]) -> bool:
    dense = "weight" in params and len(params["weight"].shape) == 2
    return ("weight_packed" in params or dense) and not is_embedding(name)


def check_folder(folder: Path) -> list[LoadCheck]:
    """Every engine of `engines_compat.ENGINES`, in its order, with what it would make of `folder`'s weights."""
    layout = read_layout(folder)
    by_engine = {name: rules for rules in RULES for name in rules.engines}
    return [
        check_layout(layout, by_engine[engine.name], engine.name)
        if engine.name in by_engine
        else LoadCheck(engine.name, None, note="its loading code was not read")
        for engine in ENGINES
    ]


def engine_rows(folder: Path) -> list[dict[str, Any]]:
    """One row per engine for a report or a card: how to run it on `folder`, whether it detects a Clef model there
    (and what it misses) and what it makes of the weights (`verdict`, None where its loading code was not read)."""
    loads = {check.engine: check for check in check_folder(folder)}
    return [
        {
            "engine": detection.engine.name,
            "how": detection.engine.how,
            "detects": detection.detected,
            "missing": list(detection.missing),
            "verdict": loads[detection.engine.name].verdict,
            "loads": loads[detection.engine.name].summary(limit=1),
        }
        for detection in detect_all(folder)
    ]


def check_layout(layout: Layout, rules: LoadRules, engine: str | None = None) -> LoadCheck:
    """What the engine `rules` describes makes of `layout`."""
    name = engine or rules.engines[0]
    if QWEN3_5 not in layout.architectures:
        return LoadCheck(name, None, note=f"its rules were read for {QWEN3_5} only")
    if not layout.quant_method:
        return LoadCheck(name, rules.read, note="not quantized")
    if layout.quant_method != "compressed-tensors":
        return LoadCheck(name, None, note=f"only compressed-tensors configs were read, not {layout.quant_method}")
    findings = [
        finding
        for layer, stored in engine_layers(rules, layout).items()
        if (finding := _check_layer(layout, rules, layer, stored)) is not None
    ]
    return LoadCheck(name, rules.read, tuple(findings))


# -- one engine layer ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """How the engine builds one layer: `group` is the config group it quantizes it with (None: unquantized);
    `refusal` is set when building it already fails."""

    how: str  # "ignored", "built without the quantization config", "quantized", "no target"
    group: Group | None = None
    refusal: Finding | None = None


def engine_layers(rules: LoadRules, layout: Layout) -> dict[str, list[str]]:
    """Engine layer (spelled as the checkpoint spells modules) -> the stored modules loaded into it, in shard order."""
    fused_of = {member: fused for fused, members in rules.fused for member in members}
    order = {member: i for _, members in rules.fused for i, member in enumerate(members)}
    layers: dict[str, list[str]] = {}
    for name in layout.modules:
        parent, _, last = name.rpartition(".")
        layers.setdefault(f"{parent}.{fused_of[last]}" if parent and last in fused_of else name, []).append(name)
    return {layer: sorted(found, key=lambda m: order.get(m.rpartition(".")[2], 0)) for layer, found in layers.items()}


def engine_name(rules: LoadRules, name: str) -> str:
    """`name` as the engine spells it: each prefix rename applied in turn, as its weights mapper does."""
    spelled = name + "."
    for old, new in rules.renames:
        if spelled.startswith(old):
            spelled = new + spelled[len(old) :]
    return spelled[:-1]


def decide(layout: Layout, rules: LoadRules, layer: str) -> Decision:
    """How the engine builds `layer` from the release's ignore list and config groups."""
    guarded = layout.quant_method in rules.linear_attn_unquantized_for and ".linear_attn." in layer
    if guarded or any(layer.startswith(prefix) for prefix in rules.built_unquantized):
        return Decision("built without the quantization config")
    members = _members_of(rules, layer)
    ignored = [_ignored(rules, layout, member) for member in members]
    if (len(members) > 1 and _ignored_directly(rules, layout, layer)) or all(ignored):
        return Decision("ignored")
    if any(ignored):
        pairs = zip(members, ignored, strict=True)
        marks = ", ".join(f"{m.rpartition('.')[2]} {'ignored' if i else 'not'}" for m, i in pairs)
        return Decision("mixed", refusal=Finding(rules.mixed_members, layer, f"{marks}: one layer takes one scheme"))
    group = _target(rules, layout, layer)
    if group is None and layer != HEAD and rules.no_target is not None:
        refusal = Finding(rules.no_target, layer, "neither ignored nor named by any config group's targets")
        return Decision("no target", refusal=refusal)
    return Decision("quantized" if group else "no target", group)


def _members_of(rules: LoadRules, layer: str) -> list[str]:
    """Every member the engine loads into `layer` (one: the layer itself when it is not fused)."""
    parent, _, last = layer.rpartition(".")
    members = dict(rules.fused).get(last)
    return [f"{parent}.{member}" for member in members] if parent and members else [layer]


def _check_layer(layout: Layout, rules: LoadRules, layer: str, stored: list[str]) -> Finding | None:
    decision = decide(layout, rules, layer)
    if decision.refusal is not None:
        return decision.refusal
    group = decision.group
    expected = _expected_params(group)
    built = f"built as {scheme_label(group.weights, group.inputs)}" if group else f"built bf16 ({decision.how})"
    if expected is None:
        return Finding(Verdict.REFUSES, layer, f"{built}, a format these rules do not cover")
    problems = [problem for member in stored if (problem := _compare(rules, layout.modules[member], expected))]
    if problems:
        verdict = max(v for v, _ in problems)
        parts = sorted({text for _, text in problems})
        names = ", ".join(m.rpartition(".")[2] for m in stored)
        return Finding(verdict, layer, f"{built}, but {names} store {' and '.join(parts)}")
    if group is not None and group.format == "nvfp4-pack-quantized" and len(stored) > 1:
        return _compare_scales(layout, rules, layer, stored, group)
    return None


def _entry(rules: LoadRules, entry: str) -> str:
    """An ignore entry or target as the engine holds it: dotted names renamed, patterns and class names kept."""
    return engine_name(rules, entry) if "." in entry and not entry.startswith("re:") else entry


def _matches(name: str, entry: str, *, suffix: bool = False) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == name or (suffix and name.endswith("." + entry))


def _ignored(rules: LoadRules, layout: Layout, member: str) -> bool:
    name = engine_name(rules, member)
    return any(_matches(name, _entry(rules, e), suffix=rules.ignore_suffix) for e in layout.ignore)


def _ignored_directly(rules: LoadRules, layout: Layout, layer: str) -> bool:
    """Whether an ignore entry names the fused layer itself, before its members are looked at."""
    name = engine_name(rules, layer)
    entries = [_entry(rules, e) for e in layout.ignore]
    if rules.fused_ignore_literal_only:
        return name in entries
    return any(_matches(name, e, suffix=rules.ignore_suffix) for e in entries)


def _target(rules: LoadRules, layout: Layout, layer: str) -> Group | None:
    """The config group the engine gives `layer`: by its name, by all of its members' names, or by class."""
    targets = [(_entry(rules, t), group) for group in layout.groups for t in group.targets]
    by_name = next((g for t, g in targets if _matches(engine_name(rules, layer), t)), None)
    members = [engine_name(rules, m) for m in _members_of(rules, layer)]
    by_members = None
    if len(members) > 1:
        first = [next((g for t, g in targets if _matches(m, t)), None) for m in members]
        by_members = first[0] if all(g is not None for g in first) else None
    # Layers are Linear classes, whose names contain "Linear"; the head is a ParallelLMHead, which no class target
    # names (both engines match a class target as a substring of the layer's class name).
    by_class = None if layer == HEAD else next((g for t, g in targets if t == "Linear"), None)
    order = (by_class, by_members) if rules.class_before_fused else (by_members, by_class)
    return by_name or order[0] or order[1]


def _expected_params(group: Group | None) -> tuple[frozenset[str], tuple[str, ...] | None] | None:
    """The parameters (and the weight's dtypes) a layer of `group`'s compressed-tensors format is built with, as
    both engines' schemes register them (vLLM 0.34.0 compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py:
    120-135, compressed_tensors_w4a4_nvfp4.py:63-91, compressed_tensors_wNa16.py:231-236); None for another format."""
    if group is None:
        return frozenset({"weight"}), FLOAT_DTYPES
    weights, inputs = group.weights, group.inputs or {}
    if group.format == "float-quantized" and weights.get("num_bits") == 8:
        static = bool(inputs) and not inputs.get("dynamic")
        return frozenset({"weight", "weight_scale", *(["input_scale"] if static else [])}), ("F8_E4M3",)
    if group.format == "nvfp4-pack-quantized":
        extra = ["input_global_scale"] if group.inputs else []
        return frozenset({"weight_packed", "weight_scale", "weight_global_scale", *extra}), None
    if group.format == "pack-quantized":
        extra = [] if weights.get("symmetric", True) else ["weight_zero_point"]
        return frozenset({"weight_packed", "weight_scale", "weight_shape", *extra}), None
    return None


def _compare(
    rules: LoadRules, stored: dict[str, StoredTensor], expected: tuple[frozenset[str], tuple[str, ...] | None]
) -> tuple[Verdict, str] | None:
    params, dtypes = expected
    unread = sorted(set(stored) - params)
    unset = sorted(params - set(stored))
    if unread:
        return rules.stored_unread, f"{', '.join(unread)}, which the layer has no parameter for"
    if unset:
        return Verdict.MISREADS, f"no {', '.join(unset)}, which the layer leaves unset"
    weight = stored.get("weight")
    if dtypes is not None and weight is not None and weight.dtype not in dtypes:
        return Verdict.MISREADS, f"a {weight.dtype} weight, which the layer reads as {'/'.join(dtypes)}"
    return None


def _compare_scales(layout: Layout, rules: LoadRules, layer: str, stored: list[str], group: Group) -> Finding | None:
    for scale in ("weight_global_scale", "input_global_scale"):
        entries = [layout.modules[m].get(scale) for m in stored]
        if any(entry is None for entry in entries):
            continue
        values = [float(read_tensor(e, f"{m}.{scale}").float().max()) for e, m in zip(entries, stored, strict=True)]
        if len(set(values)) > 1:
            verdict = rules.unequal_scales if group.inputs else rules.unequal_scales_weight_only
            shown = ", ".join(f"{m.rpartition('.')[2]} {v:g}" for m, v in zip(stored, values, strict=True))
            return Finding(verdict, layer, f"{scale} differs ({shown}), and the layer keeps one for all")
    return None
