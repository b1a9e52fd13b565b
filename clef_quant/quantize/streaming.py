"""Quantize without loading the model: data-free schemes shard by shard, through llm-compressor's model-free PTQ.

A data-free scheme (FP8_DYNAMIC, FP8_BLOCK, NVFP4A16: weights rounded to the nearest value, activations scaled
at run time) computes each weight's scales from that weight alone, so nothing needs the model in memory: each
source shard is read, its Linear weights quantized by llm-compressor's `ModelFreePtqConverter` (the observers
and compressors `oneshot` uses), and the shard written. Peak memory is a few shards, whatever the model's size.

Plain `model_free_ptq` matches tensors by name only, so it would quantize embeddings and try DeltaNet's 3-D
`conv1d` weights. Here the model's definition is built on the meta device (no memory, a second for clef-flash)
and `plan.plan_quantization` resolves the recipe against its Linear modules exactly as the oneshot path does;
every weight that is not a Linear is added to model-free's ignore list, and the run is refused unless the
modules model-free would quantize are exactly the planned ones with the same schemes. `config.json` gets the
`quantization_config` the oneshot path writes (its ignore list names every Linear that stays bf16), so the
release is the same. For NVFP4A16 the qkv/z pair is added to model-free's fused mappings (`fused_scales`), so
it shares one global scale even when the two weights sit in different shards.

Three shards are in flight at most: the next one is read in the background while this one is quantized, and the
one before is written with `save_file` and hashed in the background (`shard_writer`); the manifest takes those
hashes instead of reading the shards again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.progress import Progress
from clef_quant.quantize import task_names as tasks
from clef_quant.quantize.compress import backbone_class
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.plan import QuantPlan, plan_quantization, recipe_needs_calibration
from clef_quant.quantize.schemes import BF16, scheme_label
from clef_quant.quantize.shard_writer import HashingShardWriter
from clef_quant.quantize.source_shards import INDEX_FILE, SINGLE_SHARD, ShardedSource, shard_read_errors, sharded_source
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import ReleaseConfig, read_release_config

# The schemes that take the streaming path unless --no-streaming are those whose front matter says
# `streaming: true` (registry.py): the ones whose output is bit-identical to the oneshot path's
# (tests/test_quantize_streaming.py checks each on the tiny and small checkpoints).


class NotStreamable(QuantizeError):
    """This recipe or checkpoint cannot be quantized exactly without loading the model (the message says why)."""


def streaming_problem(recipe_obj: Any) -> str | None:
    """Why a parsed recipe needs the model in memory, or None when every modifier is data-free."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    for modifier in recipe_obj.modifiers:
        if type(modifier) is not QuantizationModifier:
            return f"{type(modifier).__name__} needs the model (only QuantizationModifier runs shard by shard)"
    if recipe_needs_calibration(recipe_obj):
        return "the recipe calibrates on data"
    for modifier in recipe_obj.modifiers:
        config = modifier.resolved_config
        if config.kv_cache_scheme is not None:
            return "a KV-cache scheme needs calibration"
        for name, group in config.config_groups.items():
            if group.weights is None:
                return f"config group {name} quantizes no weights"
            for args in (group.input_activations, group.output_activations):
                if args is not None and not args.dynamic:
                    return f"config group {name} has static activation scales"
    if len(recipe_obj.modifiers) != 1:
        return "more than one quantization modifier"
    return None


def meta_model(source_dir: Path, source_config: ReleaseConfig | Mapping[str, Any]) -> Any:
    """The backbone's module tree on the meta device: names, classes and shapes, no weights."""
    import torch
    from transformers import AutoConfig

    model_class = backbone_class(source_config)
    with torch.device("meta"):
        return model_class(AutoConfig.from_pretrained(source_dir))


@dataclass
class StreamingPlan:
    plan: QuantPlan  # the same plan the oneshot path makes
    model_free_config: Any  # the recipe's QuantizationConfig with every non-Linear weight added to its ignore
    release_config: Any  # the recipe's QuantizationConfig with oneshot's ignore list (config.json)
    source: ShardedSource
    jobs: dict[str, Any]  # output shard -> compressed-tensors inverse weight map (what to read from where)
    left_out: list[str] = field(default_factory=list)  # checkpoint tensors the model does not have


def plan_streaming(
    source_dir: Path,
    source_config: ReleaseConfig | Mapping[str, Any],
    recipe_obj: Any,
    source: ShardedSource | None = None,
    model: Any = None,
    plan: QuantPlan | None = None,
) -> StreamingPlan:
    """Resolve the recipe against the meta model and the checkpoint's tensors (`source`, checked already, or read
    here; `model` and its `plan`, made already, or made here); NotStreamable when streaming would not give exactly
    what oneshot gives."""
    import torch

    problem = streaming_problem(recipe_obj)
    if problem is not None:
        raise NotStreamable(problem)
    source = source or sharded_source(source_dir)
    model = model if model is not None else meta_model(source_dir, source_config)
    plan = plan if plan is not None else plan_quantization(model, recipe_obj)

    state_keys = set(model.state_dict().keys())
    missing = sorted(state_keys - set(source.weight_map))
    if missing:
        raise NotStreamable(
            f"{len(missing)} weight(s) of the model are not in the checkpoint under their module names "
            f"(first: {missing[0]})"
        )
    left_out = sorted(set(source.weight_map) - state_keys)  # what loading the model would drop too
    weight_map = {name: shard for name, shard in source.weight_map.items() if name in state_keys}

    linears = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    not_linear = sorted({name.rsplit(".", 1)[0] for name in weight_map if name.endswith(".weight")} - linears)
    resolved = recipe_obj.modifiers[0].resolved_config
    release_config = copy.deepcopy(resolved).model_copy(update={"ignore": plan.kept_bf16})
    model_free_config = _validated(resolved.model_copy(update={"ignore": [*(resolved.ignore or []), *not_linear]}))

    predicted = _model_free_schemes(weight_map, model_free_config)
    planned = {name: label for name, label in plan.schemes.items() if label != BF16}
    if predicted != planned:
        differ = sorted(set(predicted.items()) ^ set(planned.items()))
        raise NotStreamable(
            f"model-free PTQ would not quantize the planned modules ({len(differ)} differ, first: {differ[0][0]})"
        )
    jobs = _inverse_weight_maps(weight_map, source, model_free_config)
    return StreamingPlan(plan, model_free_config, release_config, source, jobs, left_out)


def _validated(config: Any) -> Any:
    from llmcompressor.entrypoints.model_free.validate import validate_config

    return validate_config(copy.deepcopy(config), None, [])


def _model_free_schemes(weight_map: dict[str, str], config: Any) -> dict[str, str]:
    """Module -> scheme label for the weights model-free PTQ would quantize (first matching group wins)."""
    from compressed_tensors.utils import match_quantizable_tensors

    names = dict.fromkeys(weight_map)
    found: dict[str, str] = {}
    for group in config.config_groups.values():
        for module_name, _name in match_quantizable_tensors(names, config.ignore, group.targets):
            found.setdefault(
                module_name,
                scheme_label(
                    group.weights.model_dump() if group.weights is not None else None,
                    group.input_activations.model_dump() if group.input_activations is not None else None,
                ),
            )
    return found


def _inverse_weight_maps(weight_map: dict[str, str], source: ShardedSource, config: Any) -> dict[str, Any]:
    from compressed_tensors.entrypoints.convert import build_inverse_weight_maps
    from llmcompressor.entrypoints.model_free.converter import ModelFreePtqConverter

    from clef_quant.quantize.fused_scales import model_free_fused_global_scales

    files = {name: str(path) for name, path in source.shards.items()}
    with model_free_fused_global_scales():
        maps = build_inverse_weight_maps(weight_map, files, [ModelFreePtqConverter(config)])
    # A shard holding only partners of another shard's weights has no job: its tensors go with their primary.
    return {shard: maps[shard] for shard in source.shards if shard in maps}


def stream_quantize(
    splan: StreamingPlan,
    source_dir: Path,
    partial: Path,
    device: str,
    progress: Progress,
    on_shard: Callable[[str], None] = lambda _name: None,
) -> dict[str, dict[str, Any]]:
    """Write the quantized shards, their index and config.json into `partial`; returns the shards' manifest
    entries (sha256 and size, computed while writing)."""
    import torch
    from llmcompressor.entrypoints.model_free.converter import ModelFreePtqConverter

    from clef_quant.quantize.fused_scales import model_free_fused_global_scales

    converter = ModelFreePtqConverter(splan.model_free_config)
    target = torch.device(device)
    writer = HashingShardWriter(partial)
    # Reading the next shard overlaps quantizing this one (reading is disk and safetensors, not torch).
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-read")
    weight_map: dict[str, str] = {}
    total_size = 0
    progress.start(tasks.STREAMING, len(splan.jobs))
    jobs = list(splan.jobs.items())
    try:
        with model_free_fused_global_scales():
            loading = reader.submit(_read_shard_job, jobs[0][1], target) if jobs else None
            for position, (shard, _inverse_map) in enumerate(jobs):
                tensors = loading.result()
                if position + 1 < len(jobs):
                    loading = reader.submit(_read_shard_job, jobs[position + 1][1], target)
                tensors = {name: tensor.contiguous() for name, tensor in converter.process(tensors).items()}
                total_size += sum(tensor.nbytes for tensor in tensors.values())
                weight_map.update(dict.fromkeys(tensors, shard))
                writer.submit(shard, tensors, metadata={"format": "pt"})
                del tensors
                progress.advance(tasks.STREAMING)
                on_shard(shard)
        entries = writer.close()
    except BaseException:
        reader.shutdown(wait=True, cancel_futures=True)
        writer.cancel()
        raise
    reader.shutdown(wait=True)
    progress.finish(tasks.STREAMING)
    if list(splan.jobs) != [SINGLE_SHARD]:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (partial / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    _write_config(source_dir, partial, splan, converter)
    return entries


def _read_shard_job(inverse_map: dict[str, list[str] | None], device: Any) -> dict[str, Any]:
    """The tensors one output shard is made of, read file by file so that a failure names its file (the checks of
    `source_shards` passed, but a file can change or fail to read after them)."""
    from compressed_tensors.utils.safetensors_load import load_tensors_from_inverse_weight_map

    tensors: dict[str, Any] = {}
    for file, names in inverse_map.items():
        with shard_read_errors(file):
            tensors.update(load_tensors_from_inverse_weight_map({file: names}, device))
    return tensors


def _write_config(source_dir: Path, partial: Path, splan: StreamingPlan, converter: Any) -> None:
    """The source's config.json with the `quantization_config` the oneshot path writes."""
    from compressed_tensors import __version__ as ct_version
    from compressed_tensors.base import COMPRESSION_VERSION_NAME, QUANTIZATION_METHOD_NAME

    release = splan.release_config
    for name, group in release.config_groups.items():
        group.format = converter.config.config_groups[name].format  # set by the compressor while it ran
    from llmcompressor.entrypoints.model_free.converter import ModelFreePtqConverter

    final = ModelFreePtqConverter(release).update_config(None)
    quantization = final.model_dump(mode="json")
    quantization.update(
        {
            COMPRESSION_VERSION_NAME: ct_version,
            QUANTIZATION_METHOD_NAME: "compressed-tensors",
            "sparsity_config": {},
            "transform_config": {},
        }
    )
    try:
        config = read_release_config(source_dir).document()  # every key of the source, not only the typed ones
    except CheckpointError as exc:
        raise QuantizeError(str(exc)) from None
    config["quantization_config"] = quantization
    (partial / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
