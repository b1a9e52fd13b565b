"""How far one question's probabilities (over its options, model order) are from the reference's.

Below both `evaluation` (the kl and tv metrics) and `quantize` (the scan's unit KLs), so a scan's prediction and
`eval`'s measurement use the same numbers.
"""

from __future__ import annotations

import numpy as np

PROBABILITY_FLOOR = 1e-12  # KL needs q > 0 where p > 0; softmax in bf16 can underflow to exactly 0


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) in nats; terms with p = 0 contribute nothing, q is floored so a vanished option stays finite."""
    p64, q64 = p.astype(np.float64), np.maximum(q.astype(np.float64), PROBABILITY_FLOOR)
    mask = p64 > 0
    return float(np.sum(p64[mask] * (np.log(p64[mask]) - np.log(q64[mask]))))


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(p.astype(np.float64) - q.astype(np.float64)).sum())
