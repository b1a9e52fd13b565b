"""Evaluation and calibration records drawn from a task's splits, deterministically.

Each task and split has its own `random.Random` seeded from text (stable across Python processes, unlike
`hash()`), rows are visited in that shuffled order and the first valid ones are kept, then written in dataset
order. Evaluation records come from the held-out split, calibration records from the training split; a
calibration row whose state equals an evaluation record's state (datasets repeat texts across splits) is skipped,
so the two sets never overlap in content either.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clef_quant.evaluation.errors import RowError, TaskFileError
from clef_quant.evaluation.sources import label_names, load_split
from clef_quant.evaluation.tasks import Task
from clef_vllm.format.text import render


@dataclass(frozen=True)
class Record:
    id: str
    task: str
    request: dict[str, Any]
    gold: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSample:
    task: Task
    eval_records: list[Record]
    calibration_records: list[Record]
    eval_rows: int  # rows in the eval split
    calibration_rows: int
    skipped: dict[str, int]  # reason -> rows skipped


def calibration_quotas(tasks: Sequence[Task], total: int) -> dict[str, int]:
    """`total` calibration records spread as evenly as possible, the remainder to the first tasks by name."""
    share, extra = divmod(total, len(tasks))
    return {task.name: share + (i < extra) for i, task in enumerate(tasks)}


def _shuffled(count: int, seed: int, task: str, split: str) -> list[int]:
    order = list(range(count))
    random.Random(f"clef-quant/{seed}/{task}/{split}").shuffle(order)
    return order


def _state_key(body: dict[str, Any]) -> str:
    return hashlib.sha256(render(body["state"]).encode("utf-8")).hexdigest()


def _draw(
    task: Task,
    dataset: Any,
    split: str,
    wanted: int,
    seed: int,
    *,
    with_gold: bool,
    exclude_states: set[str],
    skipped: dict[str, int],
) -> list[Record]:
    """The first `wanted` usable rows in the split's shuffled order, returned in dataset order."""
    names = label_names(dataset)
    chosen: list[tuple[int, Record]] = []
    first_problem = ""
    for index in _shuffled(len(dataset), seed, task.name, split):
        if len(chosen) == wanted:
            break
        record_id = f"{task.name}/{split}/{index}"
        try:
            body, gold = task.record(dataset[index], names, record_id)
        except RowError as exc:
            # Real splits hold a few rows a task cannot use (an ARC question with one choice, an unlabelled row).
            first_problem = first_problem or str(exc)
            _count(skipped, f"{split}: row does not fit the task")
            continue
        if _state_key(body) in exclude_states:
            _count(skipped, f"{split}: same state as an eval record")
            continue
        chosen.append((index, Record(record_id, task.name, body, gold if with_gold else {})))
    if not chosen and len(dataset) and first_problem:
        raise TaskFileError(f"no row of {task.dataset.id} {split} fits task {task.name}; the first: {first_problem}")
    return [record for _, record in sorted(chosen, key=lambda pair: pair[0])]


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def sample_task(
    task: Task, *, per_task: int, calibration: int, seed: int, source: str, exclude_states: set[str]
) -> TaskSample:
    """Evaluation and calibration records of one task; `exclude_states` grows with this task's eval states."""
    spec = task.dataset
    skipped: dict[str, int] = {}
    eval_set = load_split(task, spec.eval_split, source)
    eval_records = _draw(
        task, eval_set, spec.eval_split, per_task, seed, with_gold=True, exclude_states=set(), skipped=skipped
    )
    exclude_states.update(_state_key(r.request) for r in eval_records)
    calibration_records: list[Record] = []
    calibration_rows = 0
    if calibration > 0:
        train_set = load_split(task, spec.calibration_split, source)
        calibration_rows = len(train_set)
        calibration_records = _draw(
            task,
            train_set,
            spec.calibration_split,
            calibration,
            seed,
            with_gold=False,
            exclude_states=exclude_states,
            skipped=skipped,
        )
    return TaskSample(task, eval_records, calibration_records, len(eval_set), calibration_rows, skipped)
