"""How sure a scan's numbers are: each unit's KL interval over the held-out records, and which two units the
scan cannot rank (a paired bootstrap of their KL difference over the same held-out records covers 0).

The draws are `clef_quant.bootstrap`'s, as `clef-quant eval` makes them, with the held-out records as one group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clef_quant.bootstrap import Bootstrap, covers_zero, resampled_means
from clef_quant.quantize.scan_file import UnitResult


def bootstrap_settings(bootstrap: Bootstrap) -> dict[str, float | int]:
    return {"confidence": bootstrap.confidence, "resamples": bootstrap.resamples, "seed": bootstrap.seed}


def kl_interval(record_kl: Sequence[float], questions: Sequence[int], bootstrap: Bootstrap) -> tuple[float, float]:
    """95% interval of a unit's mean KL over every question, resampling the held-out records."""
    weights = bootstrap.weights([len(record_kl)])
    drawn = resampled_means(weights, np.asarray(record_kl, dtype=np.float64), np.asarray(questions))
    low, high = bootstrap.interval(drawn)
    return float(low), float(high)


def indistinguishable_pairs(
    units: Sequence[UnitResult],
    pairs: Sequence[tuple[int, int]],
    questions: Sequence[int],
    bootstrap: Bootstrap,
) -> list[tuple[int, int]] | None:
    """The pairs (positions in `units`) whose mean-KL difference has a 95% interval covering 0, on the same
    resampled held-out records for both; None when a unit of a pair has no per-record KLs (an older scan)."""
    needed = sorted({i for pair in pairs for i in pair})
    if any(units[i].record_kl is None or len(units[i].record_kl) != len(questions) for i in needed):
        return None
    if not pairs:
        return []
    column = {unit: n for n, unit in enumerate(needed)}
    sums = np.array([units[i].record_kl for i in needed], dtype=np.float64).T  # (records, units)
    drawn = resampled_means(bootstrap.weights([len(questions)]), sums, np.asarray(questions))  # (resamples, units)
    found = []
    for a, b in pairs:
        low, high = bootstrap.interval(drawn[:, column[a]] - drawn[:, column[b]])
        if covers_zero(low, high):
            found.append((a, b))
    return found
