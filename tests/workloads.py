"""Request workloads for tests: the benchmarks' varied requests with shorter states.

On two cores vLLM's CPU prefill of the tiny checkpoint costs about 2 ms a token, so what a test shows with
varied requests (answers that do not move under load, agreement with transformers) is shown as well with
states of at most ~500 tokens as with the benchmarks' ~1,500, in a third of the time."""

from __future__ import annotations

from typing import Any

from clef_quant.bench.workload import varied_requests

TEST_STATE_WORDS = (3, 20, 60, 150, 300)


def short_requests(count: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """`varied_requests(count, seed)` with states of at most 300 words (the same questions)."""
    return varied_requests(count, seed, state_words=TEST_STATE_WORDS)
