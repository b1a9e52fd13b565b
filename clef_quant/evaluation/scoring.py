"""Probabilities of encoded records through transformers (the reference) or the vLLM plugin, with seconds per record.

Shared by `clef-quant eval` and `clef-quant bench throughput`, so both time the same calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from clef_quant.progress import NoProgress, Progress
from clef_vllm.format.answers import split_logits
from clef_vllm.format.encoding import Encoding

# Records handed to vLLM per call. vLLM forms its own batches inside a call (max_num_seqs); the chunk only sets how
# often progress moves and probabilities are saved.
PLUGIN_CHUNK = 256


def probabilities(encoding: Encoding, logits: torch.Tensor) -> list[list[float]]:
    counts = [len(options) for options in encoding.option_ids]
    return [p.tolist() for p in split_logits(logits.float().cpu(), counts)]


def score_reference(
    scorer: Any, encodings: Sequence[Encoding], progress: Progress | None = None, task: str = ""
) -> list[tuple[list[list[float]], float]]:
    """Probabilities and seconds of each record through transformers, one record at a time (ReferenceScorer says
    why). `progress` is told each record as `task`."""
    progress = progress or NoProgress()
    out: list[tuple[list[list[float]], float]] = []
    for encoding in encodings:
        began = time.perf_counter()
        logits = scorer.logits(encoding).float().cpu()  # .cpu() waits for the device
        out.append((probabilities(encoding, logits), time.perf_counter() - began))
        progress.advance(task, 1)
    return out


def score_plugin(
    engine: Any,
    encodings: Sequence[Encoding],
    chunk: int = PLUGIN_CHUNK,
    progress: Progress | None = None,
    task: str = "",
) -> list[tuple[list[list[float]], float]]:
    """Probabilities and seconds of each record through the vLLM plugin; a call's time is shared by its records.

    `progress` is told each call's records as `task`."""
    progress = progress or NoProgress()
    out: list[tuple[list[list[float]], float]] = []
    for start in range(0, len(encodings), chunk):
        part = list(encodings[start : start + chunk])
        began = time.perf_counter()
        logits = engine.logits(part)
        seconds = (time.perf_counter() - began) / len(part)
        out.extend((probabilities(e, x), seconds) for e, x in zip(part, logits, strict=True))
        progress.advance(task, len(part))
    return out
