"""Each side's stored probabilities against the reference's: every metric of the registry per task and for All."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clef_quant.evaluation.data import EvalData, EvalRecord
from clef_quant.evaluation.metrics import QuestionObservation, RecordObservation, compute
from clef_quant.evaluation.results import ALL
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
