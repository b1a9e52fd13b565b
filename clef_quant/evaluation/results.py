"""The results dict of an evaluation run, as results.json stores it: config, data, tasks, metrics, sides, values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.data import EvalData, records_by_task
from clef_quant.evaluation.metrics import METRICS
from clef_quant.evaluation.sides import Side
from clef_quant.evaluation.store import tool_versions

RESULTS_FORMAT = "clef-quant-eval-results/1"
PROBS_DIR = "probs"
SHOWN_REJECTED = 5  # ids of stored records that did not verify, named in results.json and on the terminal


def results_dict(
    config: EvalConfig,
    data: EvalData,
    sides: Sequence[Side],
    engine_settings: dict[str, Any],
    values: dict[str, dict[str, dict[str, float]]],
) -> dict[str, Any]:
    """Everything results.json holds; `values` is `comparison.compare` of the same sides."""
    titles = {name: task.get("title", name) for name, task in (data.summary.get("tasks") or {}).items()}
    tasks = []
    for task, indices in records_by_task(data.records).items():
        tasks.append(
            {
                "name": task,
                "title": titles.get(task, task),
                "records": len(indices),
                "questions": sum(len(data.records[i].request.questions) for i in indices),
            }
        )
    return {
        "format": RESULTS_FORMAT,
        "created": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "tools": tool_versions(),
        "config": {
            "reference": str(config.reference),
            "candidates": [str(c) for c in config.candidates],
            "max_model_len": config.max_model_len,
            "batch_size": config.batch_size,
            "reference_device": config.device,
            "engine": engine_settings,
        },
        "data": {"folder": str(data.folder), "files": data.files, "summary": data.summary},
        "tasks": tasks,
        "metrics": [
            {
                "name": m.name,
                "title": m.title,
                "description": m.description,
                "direction": m.direction,
                "level": m.level,
                "aggregation": m.aggregation,
                "compares_with_reference": m.compares,
            }
            for m in METRICS
        ],
        "sides": [
            {
                "key": side.key,
                "name": side.name,
                "role": side.role,
                "runner": side.runner,
                "folder": str(side.folder),
                "model_hash": {
                    "sha256": side.fingerprint.sha256,
                    "from": side.fingerprint.source,
                    "scheme": side.fingerprint.scheme,
                },
                "settings": side.settings,
                "records_scored": side.scored,
                "records_reused": side.reused,
                "records_rejected": len(side.rejected),
                "rejected": [str(r) for r in side.rejected[:SHOWN_REJECTED]],
                "seconds_scored": round(side.seconds_scored, 3),
                "probabilities": f"{PROBS_DIR}/{side.key}.jsonl",
            }
            for side in sides
        ],
        "values": {
            key: {task: {m: _json_number(v) for m, v in row.items()} for task, row in per_task.items()}
            for key, per_task in values.items()
        },
    }


def _json_number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value
