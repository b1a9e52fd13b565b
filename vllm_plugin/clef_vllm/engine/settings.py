"""The engine arguments and process-wide settings a Clef engine starts with: the scheduler limits that keep
answers independent of load (`invariance`), the CPU's KV cache size and the GPU's defaults (Gated DeltaNet's
prefill kernels, CUDA graphs for whole prompts: `cuda_graphs`)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clef_vllm.engine.architecture import architecture_overrides, config_architectures
from clef_vllm.engine.cpu.threads import bind_rank_threads, parallel_ranks
from clef_vllm.engine.cuda_graphs import graph_config
from clef_vllm.engine.invariance import (
    GPU_STEP_TOKENS,
    KERNELS,
    SPLIT_FREE,
    batches_whole_prompts,
    invariance_method,
    set_invariant_kernels,
    set_split_free_kernels,
    uses_gpu,
)
from clef_vllm.engine.options import check_quantization, refuse_engine_keys
from clef_vllm.engine.rope_cache import drop_meta_rotary_embeddings
from clef_vllm.errors import SettingsError
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits

CPU_KV_CACHE_GIB = "2"


CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


_defaulted_kv_cache: list[str] = []  # the value apply_cpu_defaults put in the environment, if it did


_warned: set[str] = set()


def apply_cpu_defaults(kv_cache_memory_bytes: int | None = None) -> None:
    """Without a GPU, vLLM reserves 92% of host memory for its KV cache and refuses to start when other
    processes hold more than the rest; prefill-only scoring needs little, so default to a fixed 2 GiB. An engine
    given its own `kv_cache_memory_bytes` keeps it (`own_kv_cache`)."""
    import torch

    if kv_cache_memory_bytes is None and not torch.cuda.is_available() and CPU_KV_CACHE_ENV not in os.environ:
        os.environ[CPU_KV_CACHE_ENV] = CPU_KV_CACHE_GIB
        _defaulted_kv_cache[:] = [CPU_KV_CACHE_GIB]


@contextlib.contextmanager
def own_kv_cache(kv_cache_memory_bytes: Any, *, warn: bool = True) -> Iterator[None]:
    """While an engine's configuration is built and its processes start: an engine given `kv_cache_memory_bytes`
    gets that size. vLLM's CPU platform would put VLLM_CPU_KVCACHE_SPACE over it (and the engine would report a
    size it does not use), so the variable is out of the environment meanwhile, with one warning when a user set
    it (not this module's own default; `warn=False` leaves it to `warn_kv_cache_space_ignored`)."""
    given = os.environ.get(CPU_KV_CACHE_ENV, "")
    if kv_cache_memory_bytes is None or not given or uses_gpu():
        yield
        return
    if warn:
        warn_kv_cache_space_ignored(kv_cache_memory_bytes)
    del os.environ[CPU_KV_CACHE_ENV]
    try:
        yield
    finally:
        os.environ[CPU_KV_CACHE_ENV] = given


def warn_kv_cache_space_ignored(kv_cache_memory_bytes: Any) -> None:
    """One warning per value when a user's VLLM_CPU_KVCACHE_SPACE gives way to an engine's own size."""
    given = os.environ.get(CPU_KV_CACHE_ENV, "")
    if kv_cache_memory_bytes is None or not given or uses_gpu():
        return
    if [given] != _defaulted_kv_cache and given not in _warned:
        _warned.add(given)
        print(
            f"warning: {CPU_KV_CACHE_ENV}={given} (GiB) is ignored for this engine: its kv_cache_memory_bytes="
            f"{kv_cache_memory_bytes} (--engine-arg) sets the KV cache",
            file=sys.stderr,
        )


# Requests in flight at once when prompts are cut into pieces (`--prompt-chunk`), unless --max-num-seqs says;
# the KV cache may hold fewer at full length (clef_vllm.engine.turns).
PIECES_IN_FLIGHT = 8


def schedule_args(
    *,
    max_model_len: int,
    batch_invariant: bool = True,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    prompt_chunk: int | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """The scheduler limits for vLLM. With `batch_invariant` no prompt is split across steps, and with the
    one-prompt-per-step method (`clef_vllm.engine.invariance`; default: this machine's) each step runs one prompt,
    or with `prompt_chunk` one piece of a prompt (`clef_vllm.engine.turns`)."""
    method = method or invariance_method(uses_gpu())
    if prompt_chunk is not None:
        return chunk_args(prompt_chunk, max_model_len, batch_invariant, max_num_seqs, max_num_batched_tokens, method)
    if not batch_invariant:
        args: dict[str, Any] = {}
        if max_num_seqs is not None:
            args["max_num_seqs"] = max_num_seqs
        if max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = max_num_batched_tokens
        return args
    if max_num_batched_tokens is not None and max_num_batched_tokens < max_model_len:
        raise SettingsError(
            f"max_num_batched_tokens={max_num_batched_tokens} is below max_model_len={max_model_len}: long "
            "prompts would be split across steps; turn batch invariance off (--no-batch-invariant, "
            "batch_invariant=False) to allow it"
        )
    if batches_whole_prompts(method):
        args = {
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max_num_batched_tokens or max(max_model_len, GPU_STEP_TOKENS),
        }
        if max_num_seqs is not None:
            args["max_num_seqs"] = max_num_seqs
        return args
    if max_num_seqs not in (None, 1):
        raise SettingsError(
            f"max_num_seqs={max_num_seqs} puts several prompts in one engine step, which here (on a CPU, or NVFP4 "
            "on a GPU without FP4 kernels) makes answers depend on load; turn batch invariance off "
            "(--no-batch-invariant, batch_invariant=False) to allow it"
        )
    return {"max_num_seqs": 1, "max_num_batched_tokens": max_num_batched_tokens or max_model_len}


def chunk_args(
    prompt_chunk: int,
    max_model_len: int,
    batch_invariant: bool,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    method: str,
) -> dict[str, Any]:
    """Pieces of `prompt_chunk` tokens, one per step, requests in flight taking turns (`clef_vllm.engine.turns`);
    `max_num_seqs` is how many requests are in flight."""
    if not batch_invariant:
        raise SettingsError(
            "prompt_chunk cuts prompts at fixed places so that answers do not move with load; with batch invariance "
            "off vLLM already splits prompts (max_num_batched_tokens)"
        )
    if batches_whole_prompts(method):
        raise SettingsError(
            "prompt_chunk applies where each step runs one prompt (a CPU; NVFP4 on a GPU without FP4 kernels); "
            "this GPU batches whole prompts, so a short request shares the step of a long one instead of waiting"
        )
    if max_num_batched_tokens is not None:
        raise SettingsError(f"prompt_chunk={prompt_chunk} sets the tokens per step; leave max_num_batched_tokens out")
    from clef_vllm.engine.turns import QUALNAME

    return {
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": min(prompt_chunk, max_model_len),
        "max_num_seqs": max_num_seqs or PIECES_IN_FLIGHT,
        "scheduler_cls": QUALNAME,
    }


def check_text_pieces(prompt_chunk: int | None, limits: Limits) -> None:
    """Refuse pieces of prompts (`prompt_chunk`) where requests may hold images or videos: vLLM ends a piece before
    a picture its encoder cache has no room for, and that room depends on the pictures of the other requests in
    flight, so the piece would end where the load says."""
    if prompt_chunk is not None and limits.media_enabled:
        raise SettingsError(
            "--prompt-chunk (prompt_chunk) cuts text prompts only: add --language-model-only (language_model_only="
            "True), or --limit-images 0 --limit-videos 0"
        )


def gpu_defaults(overrides: dict[str, Any]) -> dict[str, Any]:
    """What a GPU engine gets unless asked otherwise: Triton's Gated DeltaNet prefill where FlashInfer, vLLM's
    choice on Hopper, is not installed."""
    if "gdn_prefill_backend" in overrides:
        return {}
    from vllm.utils.flashinfer import has_flashinfer

    return {} if has_flashinfer() else {"gdn_prefill_backend": "triton"}


def engine_args(
    model: str | Path,
    *,
    max_model_len: int = DEFAULT_MAX_LENGTH,
    batch_invariant: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    gpu: bool | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """vLLM engine arguments that run a Clef-Flash folder through the plugin's pooler.

    With media switched off (no images and no videos allowed) the vision tower is not even loaded."""
    from vllm.config import PoolerConfig

    refuse_engine_keys(overrides)
    check_quantization(model, overrides.get("quantization"))
    gpu = uses_gpu() if gpu is None else gpu
    check_text_pieces(overrides.get("prompt_chunk"), limits)
    schedule = schedule_args(
        max_model_len=max_model_len,
        batch_invariant=batch_invariant,
        max_num_seqs=overrides.pop("max_num_seqs", None),
        max_num_batched_tokens=overrides.pop("max_num_batched_tokens", None),
        prompt_chunk=overrides.pop("prompt_chunk", None),
        method=invariance_method(gpu, model),
    )

    args: dict[str, Any] = {
        "model": str(model),
        "runner": "pooling",
        "hf_overrides": architecture_overrides(config_architectures(model)),
        "pooler_config": PoolerConfig(task="token_classify"),
        "enable_prefix_caching": False,
        "language_model_only": not limits.media_enabled,
        "max_model_len": max_model_len,
        "dtype": "bfloat16",
        **schedule,
        **(gpu_defaults(overrides) if gpu else {}),
    }
    if limits.media_enabled:
        args["limit_mm_per_prompt"] = {"image": limits.max_images, "video": limits.max_videos}
    args.update(overrides)
    if gpu:
        step_tokens = args.get("max_num_batched_tokens") or max_model_len
        args.update(graph_config(overrides, step_tokens, args.get("max_num_seqs")))
    return args


IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def core_in_process() -> bool:
    """Whether the engines started from now on run their core (and on a CPU their one worker) in this process."""
    return os.environ.get(IN_PROCESS_ENV, "1") == "0"


def run_cpu_cores_in_process() -> None:
    """On a machine without a GPU, start engines' cores in this process unless the environment says otherwise: a
    core process of its own costs each engine a spawn and a second import of vLLM and torch, and a CPU engine runs
    one prompt per step, so the caller has nothing to overlap with it. The worker keeps the thread count it would
    have in its own process (`match_lone_engine_threads`), and with it the server's bits."""
    if not uses_gpu():
        os.environ.setdefault(IN_PROCESS_ENV, "0")


def prepare_engine_process(batch_invariant: bool, model: str | Path, args: dict[str, Any]) -> None:
    """Process-wide settings an engine about to start with `args` reads: on a CPU the KV cache size (unless `args`
    give the engine its own) and the cores of each rank (`clef_vllm.engine.cpu.threads`), and the GPU's invariant
    kernels (vLLM's or the split-free ones, `clef_vllm.engine.invariance`) when answers must not move with load and
    they cover the model here; and no rotary embedding an earlier engine left on the meta device
    (`clef_vllm.engine.rope_cache`)."""
    drop_meta_rotary_embeddings()
    apply_cpu_defaults(args.get("kv_cache_memory_bytes"))
    if not uses_gpu():
        bind_rank_threads(parallel_ranks(args))
    method = invariance_method(uses_gpu(), model) if batch_invariant else None
    set_invariant_kernels(method == KERNELS)
    set_split_free_kernels(method == SPLIT_FREE)
