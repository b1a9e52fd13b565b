"""What one `clef-quant eval` run compares (reference, candidates, DATA) and how the reference runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH


@dataclass(frozen=True)
class EvalConfig:
    reference: str  # bf16 release folder (or Hub id)
    candidates: Sequence[str]
    data: Path
    out: Path
    max_model_len: int = DEFAULT_MAX_LENGTH
    device: str = "cpu"  # where the reference runs; the plugin runs where vLLM runs
