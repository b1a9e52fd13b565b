"""Which step sizes a GPU engine captures CUDA graphs for.

vLLM's default sizes stop at 512 tokens: they are chosen for decode steps, where a step holds one token per sequence.
A Clef engine never decodes: every step holds whole prompts, so a 553-token request ran every one of its ~800 kernels
from Python, and the GPU sat idle between them. Measured on an H100 (bench/results/latency-h100-graphs.md), flash
FP8, one request at a time in the default mode: decision-index (553 tokens) 51.8 -> 35.7 ms p50 and race (685) 51.6
-> 35.4 ms with graphs up to 7,680 tokens. The same run showed what coarse sizes cost: multirc's 6,445 tokens padded
to 7,680 went from 138 to 151 ms. So sizes here grow in steps of a sixteenth of their doubling (at most 1/16 of a
step is padding) up to `LARGEST_GRAPH_TOKENS`; a step beyond that is long enough for its kernels to hide the launches.

Padding does not move answers in the invariant mode: its kernels reduce within one token's row or walk one sequence
(`clef_vllm.engine.invariance`), so extra rows are like extra prompts in the step.

vLLM captures a graph of N tokens with min(N, max_num_seqs) one-token sequences, and Gated DeltaNet allocates a
float32 state for each of them (value heads x 128 x 128), after the KV cache has taken its share of the card. With
vLLM's default of 1,024 sequences on an H100 that is 3 GiB a layer on the 27B, and the 27B FP8 ran out of memory
capturing 8,192 tokens (bench/results/latency-h100-27b-graphs-oom.md). So these engines also get at most
`CAPTURE_MAX_SEQS` sequences a step unless told otherwise: a Clef prompt's fixed part alone (system prompt and
headers) is about 60 tokens, so a 16,384-token step of whole prompts rarely has room for more."""

from __future__ import annotations

from typing import Any

# Steps of up to this many tokens replay a graph (the longest Flide workload, quality, is 7,198 tokens).
LARGEST_GRAPH_TOKENS = 8192
# Sizes in each doubling from 256 tokens on: the padding a step can get is under 1/16 of its size.
SIZES_PER_DOUBLING = 16
_KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
# 256 one-token sequences hold a quarter of the state that ran out of memory (and half of what vLLM's 512-token
# graphs held when the 27B started).
CAPTURE_MAX_SEQS = 256


def whole_prompt_graph_sizes(step_tokens: int) -> list[int]:
    """Capture sizes for steps of at most `step_tokens` tokens: vLLM's own below 256, then 16 per doubling, up to
    `LARGEST_GRAPH_TOKENS` (the largest size is the cap itself, so every step up to it has a graph)."""
    cap = min(step_tokens, LARGEST_GRAPH_TOKENS)
    sizes = [1, 2, 4, *range(8, 256, 8)]
    low = 256
    while low < cap:
        sizes.extend(range(low, 2 * low, low // SIZES_PER_DOUBLING))
        low *= 2
    return sorted({size for size in sizes if size < cap} | {cap})


def graph_config(overrides: dict[str, Any], step_tokens: int, max_num_seqs: int | None = None) -> dict[str, Any]:
    """The `compilation_config` a GPU engine gets: the caller's own, with `whole_prompt_graph_sizes` added unless it
    names capture sizes itself (or the engine runs eager, or the caller passed a config that is not a dict); with
    those sizes, `max_num_seqs` becomes `CAPTURE_MAX_SEQS` unless the caller set it."""
    given = overrides.get("compilation_config")
    if overrides.get("enforce_eager") or not (given is None or isinstance(given, dict)):
        return {}
    given = dict(given or {})
    if any(key in given for key in _KEYS):
        return {}
    config = {"compilation_config": {**given, "cudagraph_capture_sizes": whole_prompt_graph_sizes(step_tokens)}}
    return config if max_num_seqs is not None else {**config, "max_num_seqs": CAPTURE_MAX_SEQS}
