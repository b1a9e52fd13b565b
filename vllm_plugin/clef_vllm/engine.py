"""Offline Python API: score many SystemOne requests at once with vLLM.

    from clef_vllm.engine import ClefEngine

    engine = ClefEngine("artifacts/tiny")
    responses = engine.score([request_body, ...])   # SystemOne response bodies, in order

Requests are validated and encoded here (the whole batch before the engine runs), vLLM schedules them, and
the plugin's pooler returns every option's logit. Scripts that create an engine need an
`if __name__ == "__main__":` guard, because vLLM spawns its engine core process.

By default (`batch_invariant=True`) a request's probabilities are the same bits whatever else is in flight
(`clef_vllm.invariance` says how, per platform): on a GPU, vLLM batches whole prompts and runs its batch-invariant
kernels; on a CPU, each engine step runs one whole prompt. `batch_invariant=False` lets vLLM batch and split
prompts freely (`max_num_seqs`, `max_num_batched_tokens`): answers then move in the third decimal with load.

On a GPU the engine compiles the model and replays CUDA graphs unless `enforce_eager=True`, and Gated DeltaNet's
prefill runs vLLM's Triton kernels when FlashInfer is not installed (vLLM's own choice on Hopper is FlashInfer).
Any other vLLM engine argument passes through as a keyword (`gpu_memory_utilization=0.5`, ...).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from clef_vllm.answers import response_from_logits
from clef_vllm.cpu_threads import bind_rank_threads, parallel_ranks
from clef_vllm.encoder import Encoder
from clef_vllm.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.engine_options import check_quantization, refuse_engine_keys
from clef_vllm.errors import RequestError, SettingsError
from clef_vllm.invariance import (
    GPU_STEP_TOKENS,
    KERNELS,
    SPLIT_FREE,
    batches_whole_prompts,
    invariance_method,
    set_invariant_kernels,
    set_split_free_kernels,
    uses_gpu,
)
from clef_vllm.plugin import architecture_overrides
from clef_vllm.pooling_contract import check_token_ids, pooling_params
from clef_vllm.release_kernels import check_release_kernels
from clef_vllm.release_source import BACKBONE_CONFIG, local_release
from clef_vllm.request import DEFAULT_LIMITS, ClefRequest, Limits
from clef_vllm.vllm_logs import show_vllm_warnings_once

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


def schedule_args(
    *,
    max_model_len: int,
    batch_invariant: bool = True,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """The scheduler limits for vLLM. With `batch_invariant` no prompt is split across steps, and with the
    one-prompt-per-step method (`clef_vllm.invariance`; default: this machine's) each step runs one prompt."""
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
            "prompts would be split across steps; turn batch invariance off to allow it"
        )
    if batches_whole_prompts(method or invariance_method(uses_gpu())):
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
            "on a GPU without FP4 kernels) makes answers depend on load; turn batch invariance off to allow it"
        )
    return {"max_num_seqs": 1, "max_num_batched_tokens": max_num_batched_tokens or max_model_len}


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
    schedule = schedule_args(
        max_model_len=max_model_len,
        batch_invariant=batch_invariant,
        max_num_seqs=overrides.pop("max_num_seqs", None),
        max_num_batched_tokens=overrides.pop("max_num_batched_tokens", None),
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
    return args


def prepare_engine_process(batch_invariant: bool, model: str | Path, args: dict[str, Any]) -> None:
    """Process-wide settings an engine about to start with `args` reads: on a CPU the KV cache size (unless `args`
    give the engine its own) and the cores of each rank (`clef_vllm.cpu_threads`), and the GPU's invariant kernels
    (vLLM's or the split-free ones, `clef_vllm.invariance`) when answers must not move with load and they cover the
    model here."""
    apply_cpu_defaults(args.get("kv_cache_memory_bytes"))
    if not uses_gpu():
        bind_rank_threads(parallel_ranks(args))
    method = invariance_method(uses_gpu(), model) if batch_invariant else None
    set_invariant_kernels(method == KERNELS)
    set_split_free_kernels(method == SPLIT_FREE)


def config_architectures(model: str | Path) -> list[str]:
    """config.json's `architectures` of a local folder or a Hub id ([] when it cannot be read)."""
    import json

    path = Path(model) / BACKBONE_CONFIG
    if not path.is_file():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(str(model), BACKBONE_CONFIG))
        except Exception:  # offline or no such repo: vLLM reports it when it starts
            return []
    try:
        found = json.loads(path.read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(name) for name in found] if isinstance(found, list) else []


# Engines whose core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) share vLLM's process-wide
# distributed state; closing one must not tear that state down under the others.
_IN_PROCESS_ENGINES: weakref.WeakSet[ClefEngine] = weakref.WeakSet()


def engine_prompt(encoding: Encoding) -> Any:
    """What the engine runs: for media, the ids with unexpanded placeholders plus the decoded media and the processor
    settings of the model (`clef_vllm.media_encoding`), which vLLM's own processor expands into exactly
    `encoding.input_ids` (checked on every output)."""
    from vllm import TokensPrompt

    if not encoding.multi_modal_data:
        return TokensPrompt(prompt_token_ids=encoding.input_ids)
    prompt = TokensPrompt(prompt_token_ids=encoding.prompt_ids, multi_modal_data=encoding.multi_modal_data)
    if encoding.mm_processor_kwargs:
        prompt["mm_processor_kwargs"] = encoding.mm_processor_kwargs
    return prompt


class ClefEngine:
    """A vLLM engine over one Clef-Flash release folder (original or quantized).

    `batch_invariant=True` (the default): each request's probabilities do not depend on the rest of the batch
    (see the module docstring); `False` lets vLLM batch and split prompts (`max_num_seqs`,
    `max_num_batched_tokens`) at the price of answers that move with the batch.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        max_model_len: int = DEFAULT_MAX_LENGTH,
        limits: Limits = DEFAULT_LIMITS,
        batch_invariant: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        from vllm import LLM

        local_release(model)  # a release folder or a Hub id, before vLLM starts
        check_release_kernels(model)
        args = engine_args(
            model, max_model_len=max_model_len, batch_invariant=batch_invariant, limits=limits, **engine_kwargs
        )
        self.model = str(model)
        self.max_length = max_model_len
        self.limits = limits
        self.batch_invariant = batch_invariant
        self.encoder = Encoder(self.model, max_length=max_model_len, media=limits.media_enabled)
        prepare_engine_process(batch_invariant, model, args)
        show_vllm_warnings_once()
        with own_kv_cache(args.get("kv_cache_memory_bytes")):
            self.llm = LLM(**args)
        show_vllm_warnings_once()  # again: the engine's modules brought their own loggers
        if _in_process_core(self.llm) is not None:
            _IN_PROCESS_ENGINES.add(self)

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        """The KV cache size the engine runs with, as its configuration says after the platform's adjustments;
        None where vLLM sizes it from free memory (a GPU without `kv_cache_memory_bytes`)."""
        return self.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes

    def encode(self, body: dict[str, Any] | ClefRequest) -> tuple[ClefRequest, Encoding]:
        return self.encoder.prepare(body, self.limits)

    def logits(self, encodings: Sequence[Encoding], *, progress: bool = False) -> list[torch.Tensor]:
        """Every option's logit for each encoded request (flat, model order), batched by vLLM."""
        prompts = [engine_prompt(e) for e in encodings]
        params = [pooling_params(e) for e in encodings]
        outputs = self.llm.encode(prompts, params, pooling_task="token_classify", use_tqdm=progress)
        logits = []
        for encoding, output in zip(encodings, outputs, strict=True):
            check_token_ids(output.prompt_token_ids, encoding)
            logits.append(output.outputs.data.float().cpu())
        return logits

    def score(self, bodies: Sequence[dict[str, Any] | ClefRequest], *, progress: bool = False) -> list[dict[str, Any]]:
        """SystemOne response bodies, in order. Every request is validated before any is scored."""
        encoded = []
        for index, body in enumerate(bodies):
            try:
                encoded.append(self.encode(body))
            except RequestError as exc:
                raise RequestError(f"request {index}: {exc.message}", exc.field) from None
        logits = self.logits([e for _, e in encoded], progress=progress)
        return [
            response_from_logits(request, record_logits, encoding.num_tokens)
            for (request, encoding), record_logits in zip(encoded, logits, strict=True)
        ]

    def close(self) -> None:
        """Stop the engine core now instead of at garbage collection (frees its memory and processes)."""
        client = self.llm.llm_engine.engine_core
        core = _in_process_core(self.llm)
        _IN_PROCESS_ENGINES.discard(self)
        if core is None or not len(_IN_PROCESS_ENGINES):
            client.shutdown()
            return
        # vLLM's own shutdown ends with cleanup_dist_env_and_memory(), which would leave the other in-process
        # engines without their (process-wide) parallel groups: free this engine's executor and scheduler only.
        client._finalizer.detach()
        core.model_executor.shutdown()
        core.scheduler.shutdown()
        gc.unfreeze()


def _in_process_core(llm: Any) -> Any | None:
    """The EngineCore when it runs in this process, else None (it runs in its own process)."""
    from vllm.v1.engine.core_client import InprocClient

    client = llm.llm_engine.engine_core
    return client.engine_core if isinstance(client, InprocClient) else None
