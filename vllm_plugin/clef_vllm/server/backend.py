"""The engine behind the server: an async vLLM engine with the plugin's pooler, plus our encoder.

Encoding runs in worker threads; only the tokenizer calls themselves take a lock (one tokenizer, many requests).
No call is long (a text is handed over at most `state_cut.MAX_CALL_CHARS` characters at a time), so a request
tokenizing megabytes delays a small one by about one call. The head runs inside the engine core, so the event
loop only awaits results. A request whose client goes away is aborted in the engine (`finally`), so no work is
left running for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from clef_vllm.engine.check import engine_config
from clef_vllm.engine.pooling_contract import check_token_ids, pooling_params
from clef_vllm.engine.prompt import engine_prompt
from clef_vllm.engine.vllm_logs import show_vllm_warnings_once
from clef_vllm.format.answers import response_from_logits
from clef_vllm.format.encoder import Encoder, load_tokenizer
from clef_vllm.format.encoding import Encoding
from clef_vllm.format.request import ClefRequest
from clef_vllm.server.model_info import model_info
from clef_vllm.server.settings import ServeConfig

STATE_TOKENS_DROPPED = "x-clef-state-tokens-dropped"
STATE_TOKENS_DROPPED_EXACT = "x-clef-state-tokens-dropped-exact"


@dataclass(frozen=True)
class Scored:
    """A response body and the headers that describe how the request was read."""

    body: dict[str, Any]
    headers: dict[str, str]


def truncation_headers(encoding: Encoding) -> dict[str, str]:
    """How many state tokens were cut to fit; the body keeps the release's shape."""
    return {
        STATE_TOKENS_DROPPED: str(encoding.state_tokens_dropped),
        STATE_TOKENS_DROPPED_EXACT: "true" if encoding.state_tokens_dropped_exact else "false",
    }


class _LockedTokenizer:
    """A tokenizer whose calls are serialized: a Rust fast tokenizer refuses concurrent use ("Already
    borrowed"). Each call is short (see the module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    def __call__(self, text: list[str], **kwargs: Any) -> Any:
        with self._lock:
            return self._tokenizer(text, **kwargs)

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self._tokenizer.decode(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class Load:
    """What the backend is doing now and has done: requests in each stage, prompt tokens sent to the engine.

    Only the event loop changes it (threads do the encoding, not the counting), so it needs no lock."""

    STAGES = ("encoding", "engine")

    def __init__(self) -> None:
        self.in_progress = dict.fromkeys(self.STAGES, 0)
        self.prompt_tokens = 0

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.in_progress[name] += 1
        try:
            yield
        finally:
            self.in_progress[name] -= 1


# Prompts up to this many tokens share the first place in the engine's queue; each doubling past it comes one
# place later.
SHORT_PROMPT_TOKENS = 1024


def queue_priority(num_tokens: int) -> int:
    """Where a prompt waits in the engine's queue under `--engine-arg scheduling_policy=priority` (vLLM: lower
    first, then by arrival; its default first-come-first-served queue ignores it): shorter prompts first, in
    doubling classes of length. A small request queued behind full-length prompts then waits for the step in
    progress, not for each of theirs, and no answer changes (a step still holds whole prompts). Not the default:
    vLLM's queue has no ageing, so under a steady stream of short requests a long one waits until the stream
    pauses (bench/results/queue-cpu.md: 38.6 s against 7.3 s)."""
    if num_tokens <= SHORT_PROMPT_TOKENS:
        return 0
    return (num_tokens - 1).bit_length() - (SHORT_PROMPT_TOKENS - 1).bit_length()


class EngineBackend:
    """Owns the async engine; `score` turns one request body into a response body."""

    def __init__(self, config: ServeConfig) -> None:
        config.check()
        self.config = config
        tokenizer = _LockedTokenizer(load_tokenizer(config.model))
        self.encoder = Encoder(
            config.model, max_length=config.max_model_len, media=config.limits.media_enabled, tokenizer=tokenizer
        )
        self._processor_lock = threading.Lock()  # the processor's own tokenizer refuses concurrent use too
        self._ids = itertools.count()
        self.vllm_config: Any = None
        self.engine: Any = None
        self.ready = False
        self.failed = False
        self.load = Load()

    def configure(self) -> None:
        """Build vLLM's engine configuration (fast: nothing is loaded). The server does it before it listens, so
        settings vLLM refuses (a `--tp` that does not divide the model's heads, an `--engine-arg` out of range) end
        the command with one line, not as an engine that dies while the server waits (which a supervisor restarts)."""
        # vLLM labels its metrics with this name: the one /v1/models shows, never the folder's path.
        name = model_info(self.config.model, self.config.served_model_name).name
        kwargs = {**self.config.vllm_kwargs(), "served_model_name": name}
        self.vllm_config = engine_config(
            self.config.model, kwargs, batch_invariant=self.config.batch_invariant, serving=True
        )

    def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.vllm_config is None:
            self.configure()
        self.engine = AsyncLLM.from_vllm_config(self.vllm_config)
        show_vllm_warnings_once()  # again: the engine's modules brought their own loggers

    @property
    def dead(self) -> bool:
        return self.failed or (self.engine is not None and bool(self.engine.errored))

    STATES = ("starting", "ready", "dead")

    @property
    def state(self) -> str:
        """`starting` until warmed up, `ready`, then `dead` once the engine has stopped or failed to start."""
        return "dead" if self.dead else "ready" if self.ready else "starting"

    def prepare(self, body: Any, parts: Mapping[str, bytes] | None = None) -> tuple[ClefRequest, Encoding]:
        """`parts`: the file parts of a multipart request, which media objects name as `{"part": name}`."""
        return self.encoder.prepare(body, self.config.limits, parts, self._processor_lock)

    async def score(self, body: Any, parts: Mapping[str, bytes] | None = None) -> Scored:
        with self.load.stage("encoding"):
            request, encoding = await asyncio.to_thread(self.prepare, body, parts)
        with self.load.stage("engine"):
            self.load.prompt_tokens += encoding.num_tokens
            logits = await self._logits(encoding)
        response = response_from_logits(request, logits, encoding.num_tokens)
        return Scored(response, truncation_headers(encoding))

    async def _logits(self, encoding: Encoding) -> torch.Tensor:
        request_id = f"clef-{next(self._ids)}"
        params = pooling_params(encoding)
        finished = False
        output = None
        try:
            prompt, priority = engine_prompt(encoding), queue_priority(encoding.num_tokens)
            async for update in self.engine.encode(prompt, params, request_id, priority=priority):
                output = update
            finished = True
        finally:
            if not finished:
                await self.engine.abort(request_id)
        if output is None:
            raise RuntimeError("the engine returned no output")
        check_token_ids(output.prompt_token_ids, encoding)
        return output.outputs.data.float().cpu()

    async def warm_up(self) -> None:
        """One real request through every stage of every engine (`--dp` of them, sent at once: vLLM spreads a
        burst over its engines), so the first client does not pay for lazy setup."""
        body = {"model": self.config.model_name, "state": "warm-up", "questions": {"ready": {"type": "noul"}}}
        await asyncio.gather(*(self.score(body) for _ in range(self.config.data_parallel_size)))
        self.ready = True

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
