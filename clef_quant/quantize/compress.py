"""The model side of `quantize`: load the bf16 backbone and run llm-compressor's `oneshot` over it.

`oneshot` runs with the qkv/z pair added to its fused-scale groups and with the CPU workarounds of `cpu_compat`;
progress and the "calibrating" stage come from hooks on the decoder layers, since `oneshot` reports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clef_quant.progress import Progress
from clef_quant.quantize import task_names as tasks
from clef_quant.quantize.cpu_compat import no_pinned_memory_without_accelerator, one_rank_is_not_distributed
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.fused_scales import fused_global_scales
from clef_quant.quantize.recipes import checked_config
from clef_quant.quantize.source_shards import backbone_read_errors
from clef_vllm.format.release_config import ReleaseConfig


def backbone_class(source_config: ReleaseConfig | Mapping[str, Any]) -> Any:
    """The transformers class `config.json`'s `architectures` names."""
    import transformers

    architectures = checked_config(source_config).architectures
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        raise QuantizeError(f"config.json names no transformers architecture ({architectures or 'none'})")
    return model_class


def load_model(source_dir: Path, source_config: ReleaseConfig | Mapping[str, Any], device: str) -> Any:
    """The backbone class `config.json` names, in bf16, on `device`, in eval mode."""
    import torch

    from clef_vllm.engine.cpu.conv1d import use_in_transformers

    use_in_transformers()  # calibration and the scan run the model; the same bits, far faster on CPU
    model_class = backbone_class(source_config)
    # The release is bf16 and serving runs bf16; the GPU path loads straight onto the device, as plain
    # llm-compressor does, so FP8_DYNAMIC computes its scales there.
    with backbone_read_errors(source_dir):  # the shards' headers passed; a read can still fail
        model = model_class.from_pretrained(
            source_dir, dtype=torch.bfloat16, device_map=device if device != "cpu" else None
        )
    model.eval()
    _linearize_experts(model)
    return model


def save_compressed(model: Any, folder: Path) -> None:
    """The compressed backbone (weights, their index, config.json) into `folder`, without the `recipe.yaml`
    llm-compressor's `save_pretrained` adds: the release's is written once, on either path, by `release_files`.
    Scoped like `fused_global_scales`: the function is back when the save ends, whatever happened inside."""
    from llmcompressor.transformers.compression import compressed_tensors_utils as saving

    original = saving.update_and_save_recipe  # looked up by save_pretrained's wrapper when it runs
    saving.update_and_save_recipe = lambda _model_stub, _save_directory: None
    try:
        model.save_pretrained(str(folder), save_compressed=True)
    finally:
        saving.update_and_save_recipe = original


def _linearize_experts(model: Any) -> None:
    """One Linear per expert (llm-compressor's LinearExperts2D) in place of transformers' fused 3-D expert tensors:
    the plan, the recipe's `Linear` targets and the saved checkpoint (per-expert names, as released and as vLLM
    loads them) all need the experts as modules. A dense model has none and is left as it is.

    One block at a time, holding only its name between blocks: llm-compressor's `linearize_moe` keeps every fused
    block alive until the last is copied, twice the experts' memory at its peak (Clef-Omni, 59 GiB in bf16, ran an
    80 GB H100 out of memory that way); here a block's fused tensors are freed as soon as its copy replaces it."""
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    names = [name for name, _module in get_non_linearized_moes(model)]
    for name in names:
        fused = model.get_submodule(name)
        config = getattr(fused, "config", model.config)  # as `linearize_moe` builds each block
        linear = LinearExperts2D.get_linear_experts_cls(type(fused)).from_experts_module(fused, config)
        del fused
        model.set_submodule(name, linear)


def linearize_meta_experts(model: Any) -> bool:
    """What `_linearize_experts` makes of a model on the meta device, so that the plan made before loading sees the
    Linear modules the loaded model will have; whether the model had experts. llm-compressor's `linearize_moe`
    cannot run there: it copies each expert's weights and sets up offloading, and a meta model has neither."""
    import torch
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    found = get_non_linearized_moes(model)
    for name, module in found:
        config = getattr(module, "config", model.config)  # the config `linearize_moe` builds the experts from
        with torch.device("meta"):
            model.set_submodule(name, LinearExperts2D.get_linear_experts_cls(type(module))(config))
    return bool(found)


# Qwen3.5 VL, the Qwen3-Omni thinker, then text-only.
DECODER_LAYER_PATHS = ("model.language_model.layers", "thinker.model.layers", "model.layers")


def decoder_layers_path(model: Any) -> str | None:
    """Where the decoder layers sit in `model` (their ModuleList's dotted name), or None."""
    for path in DECODER_LAYER_PATHS:
        try:
            model.get_submodule(path)
            return path
        except AttributeError:
            continue
    return None


def _decoder_layers(model: Any) -> Any:
    path = decoder_layers_path(model)
    return None if path is None else model.get_submodule(path)


def _first_linear(layer: Any) -> Any:
    import torch

    return next((m for m in layer.modules() if isinstance(m, torch.nn.Linear)), None)


def run_oneshot(
    model: Any,
    recipe_obj: Any,
    dataloader: Any,
    tokenizer: Any,
    progress: Progress,
    on_stage: Callable[[str], None],
) -> None:
    """Quantize `model` in place with `recipe_obj`, calibrating on `dataloader` when the recipe needs it."""
    from llmcompressor import oneshot

    layers = _decoder_layers(model)
    total = len(layers) if layers is not None else None
    progress.start(tasks.CALIBRATING, total)
    handles = []
    if layers is not None and dataloader is not None:
        reached = [0]

        # Sequential calibration runs the decoder layers one after another over all records; the first call
        # into layer i means the layers before it are done. The hook sits on a Linear inside each layer
        # because llm-compressor traces through the layers themselves, while Linear modules stay leaf calls.
        def on_layer(index: int) -> Any:
            def hook(_module: Any, _args: Any) -> None:
                if index == 0 and reached[0] == 0:
                    on_stage("calibrating")
                if index > reached[0]:
                    progress.advance(tasks.CALIBRATING, index - reached[0])
                    reached[0] = index

            return hook

        handles = [
            _first_linear(layer).register_forward_pre_hook(on_layer(i))
            for i, layer in enumerate(layers)
            if _first_linear(layer) is not None
        ]
    kwargs: dict[str, Any] = {}
    if layers is not None and len(layers) > 0:
        kwargs["sequential_targets"] = [type(layers[0]).__name__]
    if dataloader is not None:
        # A DataLoader of token ids skips llm-compressor's tokenization; it still wants the processor.
        kwargs.update(dataset=dataloader, processor=tokenizer)
        # MoE (Clef-Omni): during calibration every expert runs on every token (llm-compressor's
        # moe_calibration_context, read by LinearExperts2D.forward), so each expert's observers see the whole
        # calibration set; the layer's output still uses only the routed experts' results. Without it an expert
        # no calibration token is routed to would get no activation scale.
        kwargs["moe_calibrate_all_experts"] = True
    # Qwen3-Omni's top class has no forward (it only generates), and the thinker's forward reaches its decoder layers
    # through code llm-compressor's tracer cannot follow (it traced one subgraph, and no layer ever ran, so every
    # activation scale stayed unset). So llm-compressor runs the thinker's text model, which holds every module a
    # Clef-Omni release quantizes (the towers, lm_head and the routers stay bf16); the whole model's save_pretrained
    # is then wrapped as oneshot would have.
    root = model.thinker.model if hasattr(model, "thinker") else model
    if root is not model and not root.config.name_or_path:
        root.config.name_or_path = model.config.name_or_path  # oneshot reads the source's config.json there
    try:
        with fused_global_scales(), no_pinned_memory_without_accelerator(), one_rank_is_not_distributed():
            oneshot(model=root, recipe=recipe_obj, **kwargs)
        if root is not model:
            from llmcompressor.transformers.compression.compressed_tensors_utils import modify_save_pretrained

            modify_save_pretrained(model)
    finally:
        for handle in handles:
            handle.remove()
    progress.finish(tasks.CALIBRATING)
