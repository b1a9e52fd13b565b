"""The vLLM class that serves a Clef folder, and the overrides that make vLLM pick it."""

from __future__ import annotations

from pathlib import Path

from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import read_release_config
from clef_vllm.format.release_source import BACKBONE_CONFIG

# The one home of the architecture name: the model class (engine.vllm_model) is registered under it and every engine
# overrides a release's config to it (engine.settings, the `vllm serve` command of clef_quant.engines_compat).
ARCHITECTURE = "ClefFlashForJointSchema"
MODEL_CLASS = f"clef_vllm.engine.vllm_model:{ARCHITECTURE}"

# Clef backbones vLLM 0.32 serves with its own class: vllm/transformers_utils/model_arch_config_convertor.py
# (Qwen3OmniMoeModelArchConfigConvertor) switches a Qwen3-Omni folder holding joint_head_config.json to
# ClefOmniForJointSchema (vllm/model_executor/models/clef_omni.py). Every other Clef backbone (Qwen3.5: clef-flash
# and the 27B) is served by the class this plugin registers, named with `--hf-overrides`.
NATIVE_ARCHITECTURES = {"Qwen3OmniMoeForConditionalGeneration": "ClefOmniForJointSchema"}


def engine_architecture(config_architectures: list[str]) -> str:
    """The vLLM class that serves a Clef folder whose config.json names `config_architectures`."""
    for name in config_architectures:
        if name in NATIVE_ARCHITECTURES:
            return NATIVE_ARCHITECTURES[name]
    return ARCHITECTURE


def architecture_overrides(config_architectures: list[str]) -> dict[str, list[str]]:
    """The `hf_overrides` that make vLLM serve the folder with its Clef class ({} when vLLM picks it itself)."""
    if engine_architecture(config_architectures) == ARCHITECTURE:
        return {"architectures": [ARCHITECTURE]}
    return {}


def config_architectures(model: str | Path) -> list[str]:
    """config.json's `architectures` of a local folder or a Hub id ([] when it cannot be read)."""
    folder = Path(model)
    if not (folder / BACKBONE_CONFIG).is_file():
        try:
            from huggingface_hub import hf_hub_download

            folder = Path(hf_hub_download(str(model), BACKBONE_CONFIG)).parent
        except Exception:  # offline or no such repo: vLLM reports it when it starts
            return []
    try:
        return list(read_release_config(folder).architectures)
    except CheckpointError:  # vLLM reports a broken config.json itself, in its own words
        return []
