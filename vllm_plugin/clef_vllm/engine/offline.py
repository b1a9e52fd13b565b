"""Offline Python API: score many SystemOne requests at once with vLLM.

    from clef_vllm.engine import ClefEngine

    engine = ClefEngine("artifacts/tiny")
    responses = engine.score([request_body, ...])   # SystemOne response bodies, in order

Requests are validated and encoded here (the whole batch before the engine runs), vLLM schedules them, and
the plugin's pooler returns every option's logit. Scripts that create an engine need an
`if __name__ == "__main__":` guard, because vLLM spawns its engine core process.

By default (`batch_invariant=True`) a request's probabilities are the same bits whatever else is in flight
(`clef_vllm.engine.invariance` says how, per platform): on a GPU, vLLM batches whole prompts and runs kernels
whose reductions do not follow the step's size; on a CPU, each engine step runs one whole prompt.
`batch_invariant=False` lets vLLM batch and split prompts freely (`max_num_seqs`, `max_num_batched_tokens`):
answers then move in the third decimal with load. `prompt_chunk=N` (text only: with `language_model_only=True`)
keeps them fixed and runs prompts longer than N tokens in pieces, the requests in flight taking steps in turn
(`clef_vllm.engine.turns`).

On a GPU the engine compiles the model and replays CUDA graphs unless `enforce_eager=True`, and Gated DeltaNet's
prefill runs vLLM's Triton kernels when FlashInfer is not installed (vLLM's own choice on Hopper is FlashInfer).
Any other vLLM engine argument passes through as a keyword (`gpu_memory_utilization=0.5`, ...).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from clef_vllm.engine.cpu.threads import match_lone_engine_threads, parallel_ranks, restore_process_threads
from clef_vllm.engine.engine_settings import EngineSettings
from clef_vllm.engine.invariance import uses_gpu
from clef_vllm.engine.pooling_contract import check_token_ids, pooling_params
from clef_vllm.engine.prompt import engine_prompt
from clef_vllm.engine.release_kernels import check_release_kernels
from clef_vllm.engine.settings import core_in_process, own_kv_cache, prepare_engine_process
from clef_vllm.engine.vllm_logs import show_vllm_warnings_once
from clef_vllm.errors import RequestError
from clef_vllm.format.answers import response_from_logits
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits
from clef_vllm.format.release_source import local_release
from clef_vllm.format.request import ClefRequest

# Engines whose core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) share vLLM's process-wide
# distributed state; closing one must not tear that state down under the others.
_IN_PROCESS_ENGINES: weakref.WeakSet[ClefEngine] = weakref.WeakSet()


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
        self._start(
            EngineSettings.from_keywords(
                model, max_model_len=max_model_len, limits=limits, batch_invariant=batch_invariant, **engine_kwargs
            )
        )

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> ClefEngine:
        """The engine `settings` describe (what a command's flags and `--engine-arg` values set)."""
        engine = cls.__new__(cls)
        engine._start(settings)
        return engine

    def _start(self, settings: EngineSettings) -> None:
        from vllm import LLM

        local_release(settings.model)  # a release folder or a Hub id, before vLLM starts
        check_release_kernels(settings.model)
        args = settings.vllm_kwargs()
        self.settings = settings
        self.model = settings.model
        self.max_length = settings.max_model_len
        self.limits = settings.limits
        self.batch_invariant = settings.batch_invariant
        self.encoder = Encoder(self.model, max_length=self.max_length, media=self.limits.media_enabled)
        prepare_engine_process(self.batch_invariant, self.model, args)
        if not uses_gpu() and parallel_ranks(args) == 1 and core_in_process():
            match_lone_engine_threads()  # its answers then are the bits a server's engine gives
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
            if core is not None:
                restore_process_threads()
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
