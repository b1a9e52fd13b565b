"""The one registry of evaluation metrics: what each observes, how it aggregates, and which direction is better.

Question metrics look at one question of one record: the reference's probabilities, the side's probabilities
(both over the question's options in model order; a noul question is two options, true then false) and the gold
option. Record metrics look at a record's prompt tokens and scoring seconds (throughput). Aggregation runs over
all observations of a task, or of every task together for the All row (so All weighs questions, not tasks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from clef_quant.divergences import kl_divergence, total_variation

ECE_BINS = 10


@dataclass(frozen=True)
class QuestionObservation:
    reference: np.ndarray  # probabilities over the options, model order
    side: np.ndarray
    gold: int  # index of the gold option in model order


@dataclass(frozen=True)
class RecordObservation:
    tokens: int
    seconds: float


@dataclass(frozen=True)
class Metric:
    name: str
    title: str  # column title in results.md
    description: str
    direction: Literal["higher", "lower"]
    level: Literal["question", "record"]
    aggregation: str  # words for results.json: "mean", "max", "ECE over 10 bins", "sum / sum"
    observe: Callable[[Any], Any]
    aggregate: Callable[[Sequence[Any]], float]
    percent: bool = False
    compares: bool = True  # needs the reference; False for accuracy, ECE and throughput


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _max(values: Sequence[float]) -> float:
    return float(np.max(values)) if len(values) else math.nan


def expected_calibration_error(pairs: Sequence[tuple[float, bool]], bins: int = ECE_BINS) -> float:
    """Weighted mean |accuracy - confidence| over equal-width confidence bins (top-1 confidence, gold correctness)."""
    if not pairs:
        return math.nan
    confidence = np.array([c for c, _ in pairs], dtype=np.float64)
    correct = np.array([k for _, k in pairs], dtype=np.float64)
    # Bin i holds (i/bins, (i+1)/bins]; a confidence of exactly 0 cannot occur for a top-1 probability.
    index = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        members = index == b
        if members.any():
            total += members.sum() * abs(correct[members].mean() - confidence[members].mean())
    return float(total / len(pairs))


def _rate(numerator: Callable[[RecordObservation], float]) -> Callable[[Sequence[RecordObservation]], float]:
    def aggregate(records: Sequence[RecordObservation]) -> float:
        seconds = sum(r.seconds for r in records)
        return sum(numerator(r) for r in records) / seconds if seconds > 0 else math.nan

    return aggregate


METRICS: tuple[Metric, ...] = (
    Metric(
        "accuracy", "acc", "top-1 answer equals the gold answer", "higher", "question", "mean",
        lambda o: float(np.argmax(o.side) == o.gold), _mean, percent=True, compares=False,
    ),
    Metric(
        "agreement", "agree", "top-1 answer equals the reference's top-1 answer", "higher", "question", "mean",
        lambda o: float(np.argmax(o.side) == np.argmax(o.reference)), _mean, percent=True,
    ),
    Metric(
        "kl", "KL", "KL(reference || side) in nats over the question's options", "lower", "question", "mean",
        lambda o: kl_divergence(o.reference, o.side), _mean,
    ),
    Metric(
        "tv", "TV", "total variation distance: half the L1 distance of the two distributions", "lower", "question",
        "mean", lambda o: total_variation(o.reference, o.side), _mean,
    ),
    Metric(
        "max_dp", "max |dp|", "largest absolute change of any option's probability", "lower", "question", "max",
        lambda o: float(np.max(np.abs(o.reference.astype(np.float64) - o.side.astype(np.float64)))), _max,
    ),
    Metric(
        "ece", "ECE", "expected calibration error of the top-1 confidence against gold", "lower",
        "question", f"{ECE_BINS} equal-width confidence bins",
        lambda o: (float(np.max(o.side)), bool(np.argmax(o.side) == o.gold)), expected_calibration_error,
        compares=False,
    ),
    Metric(
        "records_per_s", "rec/s", "records scored per second (model time, encoding excluded)", "higher", "record",
        "records / seconds", lambda r: r, _rate(lambda r: 1.0), compares=False,
    ),
    Metric(
        "tokens_per_s", "tok/s", "prompt tokens scored per second (model time, encoding excluded)", "higher",
        "record", "tokens / seconds", lambda r: r, _rate(lambda r: float(r.tokens)), compares=False,
    ),
)  # fmt: skip

METRIC_BY_NAME = {metric.name: metric for metric in METRICS}
QUALITY_METRICS = tuple(m for m in METRICS if m.level == "question")
SPEED_METRICS = tuple(m for m in METRICS if m.level == "record")


def compute(questions: Sequence[QuestionObservation], records: Sequence[RecordObservation]) -> dict[str, float]:
    """Every metric of the registry over one group of observations."""
    values: dict[str, float] = {}
    for metric in METRICS:
        observed = questions if metric.level == "question" else records
        values[metric.name] = metric.aggregate([metric.observe(o) for o in observed])
    return values


def format_value(metric: Metric, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if metric.percent:
        return f"{100 * value:.1f}%"
    if metric.level == "record":
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    if value == 0:
        return "0"
    return f"{value:.4f}" if value >= 1e-3 else f"{value:.1e}"
