"""Paired percentile bootstrap over records, for means over questions (eval's metrics, the scan's unit KLs).

A record holds one or more questions, and the questions of one record are not independent (one state, one
forward pass), so the resampling unit is the record. Each resample draws every group's records with replacement
(groups are eval's tasks, so a task keeps its size in every resample) as multinomial counts from one numpy
Generator with a fixed seed; the same counts weigh every side, so a difference of two sides is measured on the
same records in every resample (paired). A question metric's mean over a resample is then
`counts @ per-record sums / counts @ per-record question counts`, one matrix product for every side and metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 29


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are drawn; written beside them so anyone can redraw the same resamples."""

    confidence: float = CONFIDENCE
    resamples: int = RESAMPLES
    seed: int = SEED

    def weights(self, group_sizes: Sequence[int]) -> np.ndarray:
        """(resamples, records) counts: row b says how often resample b draws each record, records in group
        order; each group's counts sum to its size."""
        rng = np.random.default_rng(self.seed)
        blocks = [
            rng.multinomial(size, np.full(size, 1.0 / size), size=self.resamples)
            if size
            else np.zeros((self.resamples, 0), dtype=np.int64)
            for size in group_sizes
        ]
        return np.concatenate(blocks, axis=1) if blocks else np.zeros((self.resamples, 0), dtype=np.int64)

    def interval(self, resampled: np.ndarray) -> np.ndarray:
        """Percentile interval along the first axis: (..., 2) of low, high; NaN where a resample is NaN."""
        tail = (1.0 - self.confidence) / 2
        return np.moveaxis(np.quantile(resampled, [tail, 1.0 - tail], axis=0), 0, -1)


def resampled_means(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Means over questions in every resample: `sums` (records, ...) per-record sums of a question metric,
    `counts` (records,) questions per record; returns (resamples, ...)."""
    totals = np.tensordot(weights.astype(np.float64), sums.astype(np.float64), axes=(1, 0))
    questions = weights.astype(np.float64) @ counts.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return totals / questions.reshape((-1,) + (1,) * (totals.ndim - 1))


def covers_zero(low: float, high: float) -> bool:
    """Whether an interval of a difference leaves its sign open (the two are not told apart)."""
    return bool(low <= 0.0 <= high)
