"""An engine's settings checked before anything starts: vLLM's own configuration of the engine, built as the engine
would build it, with vLLM's reason for refusing it in one line, and a KV cache that holds one prompt of the model's
length.

`clef-systemone` builds this configuration before it listens and starts its engine from it; `clef-quant eval` and
the benchmarks check each release's settings here before the first record is scored (`check_engine_settings`), so a
bad `--engine-arg` value ends the command at once, not when its engine starts hours later.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from math import prod
from pathlib import Path
from typing import Any

from clef_vllm.engine.engine_settings import EngineSettings
from clef_vllm.errors import SettingsError
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits

KV_CACHE_KEY = "kv_cache_memory_bytes"
MIB = 2**20


def vllm_refusal(exc: ValueError) -> str:
    """vLLM's reason for refusing a configuration, as one line (pydantic wraps it in a validation report), naming
    the setting where pydantic says which it was."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc") or ())
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
    else:
        message = str(exc)
    lines = message.strip().splitlines() or [type(exc).__name__]
    return lines[0].removeprefix("Value error, ").replace(": Value error, ", ": ")


def engine_config(model: str | Path, args: dict[str, Any], *, batch_invariant: bool, serving: bool = False) -> Any:
    """vLLM's configuration of an engine started with `args` (nothing is loaded), after the process settings that
    engine gets (`prepare_engine_process`); `SettingsError` with vLLM's reason when it refuses them, or when the
    KV cache cannot hold one prompt of max_model_len tokens. `serving`: for an async engine (the server's)."""
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from clef_vllm.engine.settings import own_kv_cache, prepare_engine_process, warn_kv_cache_space_ignored
    from clef_vllm.engine.vllm_logs import held_vllm_warnings

    prepare_engine_process(batch_invariant, model, args)
    engine_class, usage = (AsyncEngineArgs, UsageContext.ENGINE_CONTEXT) if serving else (EngineArgs, None)
    with held_vllm_warnings():
        try:
            with own_kv_cache(args.get(KV_CACHE_KEY), warn=False):  # vLLM's CPU platform reads it here
                engine = engine_class(**args)
                config = engine.create_engine_config(usage) if usage else engine.create_engine_config()
        except (ValueError, TypeError, NotImplementedError) as exc:  # pydantic's ValidationError is a ValueError
            raise SettingsError(f"vLLM refuses the engine settings: {vllm_refusal(exc)}") from None
        check_kv_cache(config, args.get(KV_CACHE_KEY))
    warn_kv_cache_space_ignored(args.get(KV_CACHE_KEY))  # after the refusals, which then stay the only line
    return config


def check_kv_cache(config: Any, given: Any) -> None:
    """Refuse a KV cache size that is not positive or cannot hold one prompt of max_model_len tokens: vLLM would
    refuse it only once the model is loaded, in the engine's own process. `given`: the engine argument, else the
    size came from VLLM_CPU_KVCACHE_SPACE."""
    size = config.cache_config.kv_cache_memory_bytes
    if size is None:
        return  # sized by vLLM from the free memory (a GPU)
    setting = (
        f"{KV_CACHE_KEY}={given}"
        if given is not None
        else f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')}"
    )
    if size <= 0:
        raise SettingsError(f"{setting}: the KV cache needs a positive number of bytes (leave it out for vLLM's size)")
    try:
        floor = kv_cache_floor(config)
    except Exception:  # a model vLLM's helpers cannot size here: vLLM's own check at start stands
        floor = 1
    if size < floor:
        length = config.model_config.max_model_len
        raise SettingsError(
            f"{setting}: a KV cache of {size:,} bytes cannot hold one prompt of max_model_len={length:,} tokens, "
            f"which needs at least {floor:,} bytes ({floor / MIB:.1f} MiB) per rank on this model"
        )


def kv_cache_floor(config: Any) -> int:
    """The fewest KV cache bytes per rank that hold one prompt of max_model_len tokens, as vLLM counts them: each
    attention layer's keys and values for that many tokens (whole blocks) plus each linear attention (DeltaNet)
    layer's state. vLLM pads pages to one size across layer kinds, so it needs somewhat more than this (3.6 MB
    where this says 2.9 MB for the tiny model at 4,096 tokens), never less."""
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, get_dtype_size

    model, parallel, cache = config.model_config, config.parallel_config, config.cache_config
    dtype = model.dtype if cache.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache.cache_dtype]
    per_token = 2 * model.get_num_kv_heads(parallel) * model.get_head_size() * get_dtype_size(dtype)
    block = cache.block_size or 1
    tokens = -(-model.max_model_len // block) * block
    floor = model.get_num_layers_by_block_type(parallel, "attention") * per_token * tokens
    if model.is_hybrid:
        floor += model.get_num_layers_by_block_type(parallel, "linear_attention") * _linear_state_bytes(config)
    return floor


def _linear_state_bytes(config: Any) -> int:
    """One sequence's state in one linear attention layer, from the model class vLLM serves the folder with."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.utils.torch_utils import get_dtype_size

    model_class, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    shapes = model_class.get_mamba_state_shape_from_config(config)
    dtypes = model_class.get_mamba_state_dtype_from_config(config)
    return sum(prod(shape) * get_dtype_size(dtype) for shape, dtype in zip(shapes, dtypes, strict=True))


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """The process environment as it was, whatever a configuration build set in it (vLLM's CPU platform sets its
    own variables; the engine's process settings are made again when it starts)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def check_engine_settings(
    model: str | Path,
    *,
    max_model_len: int = DEFAULT_MAX_LENGTH,
    batch_invariant: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    **engine_kwargs: Any,
) -> None:
    """Raise `SettingsError` or `CheckpointError` (one line) where `ClefEngine(model, ...)` with these arguments
    could not start: a release without kernels here, an engine argument refused, a value vLLM refuses, a KV cache
    too small. Nothing is loaded and nothing starts; the process environment is left as it was."""
    check_settings(
        EngineSettings.from_keywords(
            model, max_model_len=max_model_len, batch_invariant=batch_invariant, limits=limits, **engine_kwargs
        )
    )


def check_settings(settings: EngineSettings) -> None:
    """`check_engine_settings` for an engine described by `settings`."""
    from clef_vllm.engine.release_kernels import check_release_kernels

    check_release_kernels(settings.model)
    args = settings.vllm_kwargs()
    with environment_kept():
        engine_config(settings.model, args, batch_invariant=settings.batch_invariant)
