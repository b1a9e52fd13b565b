"""The suite's in-process vLLM engines: `start_engine` (counted for the summary) and `clef_engine`, the factory that
shares one engine among every test that asks for the same one."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from plugins.engine_starts import count_in_process

if TYPE_CHECKING:
    from clef_vllm.engine import ClefEngine

# vLLM engines run in the test process: start in seconds instead of ~20 s, and schedule an offline
# batch deterministically. Server tests start their own processes with their own environment.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ENGINE_MAX_MODEL_LEN = 4096


# The tests' in-process engines get a small KV cache of their own (the tiny model's one 4,096-token prompt needs a
# few MiB; 64 MiB holds about 80,000 tokens) instead of the process's whole GiB (VLLM_CPU_KVCACHE_SPACE, kept for
# the engines that eval and the CLI start here), so that each engine the suite asks for again stays open: about
# twenty different ones, most asked for by several modules, each ~0.1 GB in process (~1 GB for Omni's, whose core
# runs in its own process), and no test uses more than two at once.
ENGINE_KV_CACHE_BYTES = 64 * 2**20
ENGINES_KEPT = 16


@contextmanager
def small_kv_cache() -> Iterator[dict[str, int]]:
    """The engine argument for an ENGINE_KV_CACHE_BYTES cache, for the engines started inside: the process's
    VLLM_CPU_KVCACHE_SPACE, which vLLM's CPU platform would put over it, is out of the way until the end."""
    space = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        yield {"kv_cache_memory_bytes": ENGINE_KV_CACHE_BYTES}
    finally:
        if space is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = space


def start_engine(model: str | Path, **engine_kwargs: Any) -> ClefEngine:
    """`ClefEngine(model, **engine_kwargs)`, counted in the session summary's engine starts."""
    from clef_vllm.engine import ClefEngine

    count_in_process(model, engine_kwargs)
    return ClefEngine(model, **engine_kwargs)


@pytest.fixture(scope="session")
def clef_engine() -> Iterator[Callable[..., ClefEngine]]:
    """Factory for `ClefEngine`s, shared by every test that asks for the same one; the least recently asked-for
    engine is closed once more than ENGINES_KEPT are open, and every one at the end of the session."""
    engines: OrderedDict[tuple[str, str], ClefEngine] = OrderedDict()

    def get(model: Path, **engine_kwargs: Any) -> ClefEngine:
        key = (str(model), repr(sorted(engine_kwargs.items())))
        if key in engines:
            engines.move_to_end(key)
            return engines[key]
        while len(engines) >= ENGINES_KEPT:
            engines.popitem(last=False)[1].close()
        with small_kv_cache() as kv_cache:
            engines[key] = start_engine(
                model, max_model_len=ENGINE_MAX_MODEL_LEN, enforce_eager=True, **kv_cache, **engine_kwargs
            )
        return engines[key]

    yield get
    # Closed here, not in the interpreter's teardown: an engine core in its own process (Omni's) is stopped while
    # logging still works, and the last in-process engine frees vLLM's process-wide state.
    while engines:
        engines.popitem()[1].close()
