"""Each side's stored probabilities against the reference's: every metric of the registry per task and for All,
and the question means' intervals (`clef_quant.bootstrap`) with every pair of plugin sides' paired differences."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clef_quant.bootstrap import Bootstrap, resampled_means
from clef_quant.evaluation.data import EvalData, EvalRecord, records_by_task
from clef_quant.evaluation.metrics import METRIC_BY_NAME, QuestionObservation, RecordObservation, compute
from clef_quant.evaluation.results import ALL, DifferenceEntry, IntervalSettings, Uncertainty
from clef_quant.evaluation.sides import Side
from clef_quant.evaluation.store import ProbabilityStore, StoredRecord


def compare(
    sides: Sequence[Side], data: EvalData, stores: dict[str, ProbabilityStore]
) -> dict[str, dict[str, dict[str, float]]]:
    """`{side key: {task or All: {metric: value}}}`, every side against the first (the reference)."""
    reference = [stores[sides[0].key].get(key) for key in sides[0].keys]
    values: dict[str, dict[str, dict[str, float]]] = {}
    for side in sides:
        stored = [stores[side.key].get(key) for key in side.keys]
        values[side.key] = compare_records(data.records, reference, stored)
    return values


def compare_records(
    records: Sequence[EvalRecord], reference: Sequence[StoredRecord | None], side: Sequence[StoredRecord | None]
) -> dict[str, dict[str, float]]:
    """Metrics per task and for All of one side's stored probabilities against the reference's."""
    questions: dict[str, list[QuestionObservation]] = {}
    timings: dict[str, list[RecordObservation]] = {}
    for record, ref, own in zip(records, reference, side, strict=True):
        if ref is None or own is None:
            raise RuntimeError(f"record {record.id} has no stored probabilities")
        for ref_p, own_p, gold in zip(ref.probabilities, own.probabilities, record.gold_index, strict=True):
            questions.setdefault(record.task, []).append(
                QuestionObservation(np.asarray(ref_p), np.asarray(own_p), gold)
            )
        timings.setdefault(record.task, []).append(RecordObservation(own.tokens, own.seconds))
    result = {task: compute(questions[task], timings[task]) for task in questions}
    result[ALL] = compute(
        [q for task in questions for q in questions[task]], [t for task in timings for t in timings[task]]
    )
    return result


INTERVAL_METRICS = ("accuracy", "agreement", "kl", "tv")  # the question means: a resample re-weighs their sums
INTERVAL_METHOD = (
    "paired percentile bootstrap over records, each task's records drawn with replacement to the task's size; "
    "the same draws for every side"
)


def question_sums(
    records: Sequence[EvalRecord], reference: Sequence[StoredRecord | None], side: Sequence[StoredRecord | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Per record: the sum over its questions of each of INTERVAL_METRICS (records, metrics), and its questions."""
    observe = [METRIC_BY_NAME[name].observe for name in INTERVAL_METRICS]
    sums = np.zeros((len(records), len(observe)))
    counts = np.zeros(len(records))
    for row, (record, ref, own) in enumerate(zip(records, reference, side, strict=True)):
        if ref is None or own is None:
            raise RuntimeError(f"record {record.id} has no stored probabilities")
        for ref_p, own_p, gold in zip(ref.probabilities, own.probabilities, record.gold_index, strict=True):
            question = QuestionObservation(np.asarray(ref_p), np.asarray(own_p), gold)
            sums[row] += [f(question) for f in observe]
        counts[row] = len(ref.probabilities)
    return sums, counts


def intervals(
    sides: Sequence[Side], data: EvalData, stores: dict[str, ProbabilityStore], bootstrap: Bootstrap | None = None
) -> Uncertainty:
    """Every side's intervals per task and for All, and every pair of plugin sides' paired differences."""
    by_task = records_by_task(data.records)
    order = [i for indices in by_task.values() for i in indices]  # records grouped by task, as the draws are
    records = [data.records[i] for i in order]
    reference = [stores[sides[0].key].get(sides[0].keys[i]) for i in order]
    per_side = [question_sums(records, reference, [stores[s.key].get(s.keys[i]) for i in order]) for s in sides]
    plugin = [i for i, side in enumerate(sides) if side.role != "reference"]
    return paired_intervals(
        {task: len(indices) for task, indices in by_task.items()},
        [side.key for side in sides],
        np.stack([sums for sums, _ in per_side], axis=1),
        per_side[0][1],
        [(a, b) for n, a in enumerate(plugin) for b in plugin[n + 1 :]],
        bootstrap or Bootstrap(),
    )


def paired_intervals(
    tasks: dict[str, int],
    keys: Sequence[str],
    sums: np.ndarray,
    counts: np.ndarray,
    pairs: Sequence[tuple[int, int]],
    bootstrap: Bootstrap,
    metrics: Sequence[str] = INTERVAL_METRICS,
) -> Uncertainty:
    """The intervals of `metrics` from per-record sums: `tasks` maps each task to its number of records, in
    the order of the rows of `sums` (records, sides, metrics) and `counts` (questions per record); `pairs` are the
    (a, b) side positions whose difference a - b is drawn. Every task and All use the same draws."""
    weights = bootstrap.weights(list(tasks.values()))
    slices: dict[str, slice] = {}
    start = 0
    for task, size in tasks.items():
        slices[task] = slice(start, start + size)
        start += size
    slices[ALL] = slice(0, start)
    bounds: dict[str, dict[str, dict[str, tuple[float, float]]]] = {key: {} for key in keys}
    differences: list[DifferenceEntry] = []
    for task, part in slices.items():
        point = resampled_means(np.ones((1, part.stop - part.start)), sums[part], counts[part])[0]  # (sides, metrics)
        resampled = resampled_means(weights[:, part], sums[part], counts[part])  # (resamples, sides, metrics)
        drawn = bootstrap.interval(resampled)  # (sides, metrics, 2)
        for i, key in enumerate(keys):
            bounds[key][task] = {m: (float(drawn[i, j, 0]), float(drawn[i, j, 1])) for j, m in enumerate(metrics)}
        for a, b in pairs:
            gap = bootstrap.interval(resampled[:, a] - resampled[:, b])  # (metrics, 2)
            differences += [
                DifferenceEntry(
                    a=keys[a],
                    b=keys[b],
                    task=task,
                    metric=metric,
                    difference=_number(point[a, j] - point[b, j]),
                    low=_number(gap[j, 0]),
                    high=_number(gap[j, 1]),
                )
                for j, metric in enumerate(metrics)
            ]
    settings = IntervalSettings(
        method=INTERVAL_METHOD,
        confidence=bootstrap.confidence,
        resamples=bootstrap.resamples,
        seed=bootstrap.seed,
        metrics=list(metrics),
    )
    return Uncertainty(settings, bounds, differences)


def _number(value: float) -> float | None:
    return None if np.isnan(value) else float(value)
