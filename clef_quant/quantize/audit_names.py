"""Rules 3 and 5 of the load-safety audit, against the model `config.json` names, built on the meta device.

The model comes from its definition, not from the shards' names: compressed-tensors matches a target or an
`ignore` entry against the loaded model's modules (`re:` = a regex, `re.match` from the start of the name;
anything else an exact module name or the name of a class in the module's bases, as `Linear`), and a class is not
in a shard, nor is a module whose tensors went missing. Building the model on the meta device (as quantize's
planner and streaming path do: no weights, a second at full size) gives every module with its class. MoE experts
count as quantize saves them: one Linear per expert under its per-expert name (the names vLLM loads), a meta
Linear standing for each (llm-compressor's own linearizing copies weights, which the meta device does not have).

Rule 5 then compares the names: the index and the shards agree (an engine that reads the index never loads a
tensor the index leaves out, and fails on one it names that its shard lacks), every tensor stored is one the
architecture loads (its own name, or a compressed-tensors parameter of one of its modules: `weight_packed`,
`weight_scale`, `input_global_scale` ...) with its shape, and every tensor the architecture loads is stored
(a tied weight and what the class itself drops or leaves missing on purpose excepted).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.checkpoint_names import disk_tensors
from clef_quant.quantize.inspect_report import CHECK_NAMES, CHECK_TARGETS, CheckResult, Violation, check_result
from clef_quant.quantize.release_files import WEIGHTS_INDEX
from clef_quant.quantize.stored_tensors import StoredTensor
from clef_vllm.format.release_config import QuantizationConfig, ReleaseConfig

# Beyond compressed-tensors' quantization parameters (QuantizationMetadata.all_qparam_names()), what its
# compressors store in place of a module's `weight`: packed FP4/INT4 codes and GPTQ's activation order.
_STORED_IN_PLACE = ("weight_packed", "weight_g_idx")
_PACKED_WEIGHT = "weight_packed"
NEAREST_FOR = 5  # offenders that get a "did you mean" (difflib over every name is slow at full size)


@dataclass(frozen=True)
class QuantParams:
    """The parameter names compressed-tensors stores on a quantized module, by what they are."""

    scales: frozenset[str]  # weight_scale, weight_global_scale, input_global_scale, k_scale ...
    zero_points: frozenset[str]
    all: frozenset[str]  # the above, the `*_shape` tensors and what is stored in place of `weight`


def quant_params() -> QuantParams:
    from compressed_tensors.quantization.quant_metadata import QuantizationMetadata

    names = QuantizationMetadata.all_qparam_names()
    scales = frozenset(n for n in names if n.endswith("scale"))
    zero_points = frozenset(n for n in names if n.endswith("zero_point"))
    return QuantParams(scales, zero_points, frozenset(names) | frozenset(_STORED_IN_PLACE))


@dataclass
class ModelView:
    """The released model as `config.json`'s architecture defines it."""

    architecture: str
    modules: dict[str, Any]  # module name -> module (a shared meta Linear stands for each linearized expert)
    tensors: dict[str, tuple[int, ...]]  # what a checkpoint stores -> its shape
    optional: set[str]  # tied weights and names the class accepts missing
    dropped: re.Pattern[str] | None  # names the class drops on load on purpose (Qwen3.5's `mtp.*`)


def model_view(folder: Path, config: ReleaseConfig) -> tuple[ModelView | None, str | None]:
    """The model `config.json` names, or (None, why it cannot be built)."""
    import torch

    from clef_quant.quantize.streaming import meta_model

    architecture = (config.architectures or ["?"])[0]
    try:
        model = meta_model(folder, config)
    except Exception as exc:  # transformers refuses a config in many ways; any of them means no model to compare
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"transformers cannot build {architecture} from config.json: {first}"
    modules = dict(model.named_modules())
    parameters = {name for name, _ in model.named_parameters()}
    tensors = {name: tuple(shape) for name, shape in disk_tensors(model)}
    expert = torch.nn.Linear(1, 1, bias=False, device="meta")
    for name in tensors.keys() - parameters:
        modules.setdefault(name.rpartition(".")[0], expert)
    buffers = {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in parameters}
    tensors.update(buffers)
    # Persistent buffers load when stored and are never required; a tied weight is the tensor it is tied to.
    optional = set(buffers) | set(getattr(model, "all_tied_weights_keys", None) or {})
    missing_ok = _patterns(getattr(model, "_keys_to_ignore_on_load_missing", None))
    if missing_ok is not None:
        optional |= {name for name in tensors if missing_ok.search(name)}
    dropped = _patterns(getattr(model, "_keys_to_ignore_on_load_unexpected", None))
    return ModelView(architecture, modules, tensors, optional, dropped), None


def _patterns(patterns: Any) -> re.Pattern[str] | None:
    """transformers' own reading of a class's ignore lists: one regex, searched anywhere in a name."""
    patterns = list(patterns or [])
    return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None


def matches_a_module(view: ModelView, entry: str, class_names: set[str]) -> bool:
    """compressed-tensors' matching (`utils.match.is_match`) of one target or ignore entry, against every module."""
    if entry.startswith("re:"):
        pattern = re.compile(entry[3:])
        return any(pattern.match(name) for name in view.modules)
    return entry in view.modules or entry in class_names


def target_violations(
    view: ModelView | None,
    why_not: str | None,
    quantization_config: QuantizationConfig | None,
    violations: list[Violation],
) -> CheckResult:
    """Rule 3. An ignore entry that matches nothing leaves quantized what it meant to keep (or names a module an
    engine's own model does not have); a target that matches nothing quantizes nothing."""
    if quantization_config is None:
        return CheckResult(CHECK_TARGETS, "skipped", "no quantization_config")
    if view is None:
        return CheckResult(CHECK_TARGETS, "skipped", str(why_not))
    class_names = {
        "Linear" if cls.__name__ == "LinearBase" else cls.__name__
        for module in view.modules.values()
        for cls in type(module).__mro__
    }
    entries = [("ignore", entry) for entry in quantization_config.ignore]
    for group_name, group in quantization_config.config_groups.items():
        entries += [(f"config_groups.{group_name}.targets", target) for target in group.targets]
    found = 0
    for where, entry in entries:
        if matches_a_module(view, entry, class_names):
            continue
        hint = ""
        if found < NEAREST_FOR and not entry.startswith("re:"):
            close = difflib.get_close_matches(entry, list(view.modules), n=1)
            hint = f" (nearest module: {close[0]})" if close else ""
        found += 1
        violations.append(
            Violation(
                CHECK_TARGETS,
                entry,
                f"quantization_config.{where} entry matches no module of {view.architecture}{hint}",
            )
        )
    detail = f"{len(entries)} target(s) and ignore entries, each matching a module of {view.architecture}"
    return check_result(CHECK_TARGETS, violations, detail)


def read_weight_map(folder: Path) -> dict[str, str] | None:
    """`model.safetensors.index.json`'s weight_map, None when there is no index (or none that reads as one)."""
    try:
        weight_map = json.loads((folder / WEIGHTS_INDEX).read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return weight_map if isinstance(weight_map, dict) else None


def _index_violations(folder: Path, stored: dict[str, StoredTensor]) -> list[Violation]:
    weight_map = read_weight_map(folder)
    if weight_map is None:
        return []
    found = []
    for name, shard in weight_map.items():
        held = stored.get(name)
        if held is None or held.file.name != shard:
            where = "is missing" if not (folder / str(shard)).is_file() else "does not hold it"
            message = f"{WEIGHTS_INDEX} names shard {shard}, which {where}: loading fails or leaves it unset"
            found.append(Violation(CHECK_NAMES, name, message))
    for name in sorted(stored.keys() - weight_map.keys()):
        message = f"in {stored[name].file.name} but not in {WEIGHTS_INDEX}: engines that read the index never load it"
        found.append(Violation(CHECK_NAMES, name, message))
    return found


def name_violations(
    folder: Path,
    view: ModelView | None,
    why_not: str | None,
    stored: dict[str, StoredTensor],
    violations: list[Violation],
) -> CheckResult:
    """Rule 5 over every name of the index and the shards."""
    found = _index_violations(folder, stored)
    if view is None:
        violations += found
        if found:
            return check_result(CHECK_NAMES, violations, "")
        return CheckResult(CHECK_NAMES, "skipped", f"index and shards agree; {why_not}")
    suffixes = quant_params().all
    names = set(stored) | set(read_weight_map(folder) or {})
    unexpected = []
    for name in sorted(names):
        module, _, suffix = name.rpartition(".")
        if name in view.tensors:
            entry = stored.get(name)
            if entry is not None and tuple(entry.shape) != view.tensors[name]:
                message = f"stored as {list(entry.shape)}; {view.architecture} loads {list(view.tensors[name])}"
                found.append(Violation(CHECK_NAMES, name, message))
        elif view.dropped is not None and view.dropped.search(name):
            continue  # the class drops it on purpose when it loads (Qwen3.5's multi-token-prediction layers)
        elif not (suffix in suffixes and module in view.modules):
            unexpected.append(name)
    for count, name in enumerate(unexpected):
        hint = ""
        if count < NEAREST_FOR:
            close = difflib.get_close_matches(name, list(view.tensors), n=1)
            hint = f" (nearest: {close[0]})" if close else ""
        message = f"not a tensor of {view.architecture}{hint}: loading drops it or fails on it"
        found.append(Violation(CHECK_NAMES, name, message))
    for name in view.tensors:
        packed = name.endswith(".weight") and f"{name.removesuffix('weight')}{_PACKED_WEIGHT}" in names
        if name not in names and not packed and name not in view.optional:
            message = f"{view.architecture} loads it and no shard holds it: loading fails or leaves it unset"
            found.append(Violation(CHECK_NAMES, name, message))
    violations += found
    detail = f"{len(names)} stored tensor(s) are {view.architecture}'s; index and shards agree"
    return check_result(CHECK_NAMES, violations, detail)
