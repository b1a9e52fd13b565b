"""An eval output as pandas DataFrames: every metric per side and task, and every stored record's probabilities.

The report's tables, results.csv and the model card are all rendered from these frames (or from the
`ResultsFile` they are built from), so what a reader loads is what the report shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.results import ResultsFile, SideEntry, read_results, results_json_path
from clef_quant.evaluation.store import read_store

if TYPE_CHECKING:
    import pandas as pd

SIDE_COLUMNS = ("side", "side_key", "role", "folder")
TASK_COLUMNS = ("task", "title", "records", "questions")
RECORD_COLUMNS = ("id", "task", "tokens", "seconds", "questions", "probs")


def metric_names(results: ResultsFile) -> list[str]:
    """The metrics results.json lists, in its order (the columns after the side and task columns)."""
    return [m.name for m in results.metrics]


def values_frame(results: ResultsFile) -> pd.DataFrame:
    """One row per side and task (the tasks, then All), side order first; a metric without a value is NaN."""
    import pandas as pd

    metrics = metric_names(results)
    rows = []
    for side in results.sides:
        for task in results.task_rows:
            row = {
                "side": side.name,
                "side_key": side.key,
                "role": side.role,
                "folder": side.folder,
                "task": task.name,
                "title": task.label,
                "records": task.records,
                "questions": task.questions,
            }
            rows.append(row | {m: results.value(side, task.name, m) for m in metrics})
    frame = pd.DataFrame(rows, columns=[*SIDE_COLUMNS, *TASK_COLUMNS, *metrics])
    return frame.astype({m: "float64" for m in metrics})


INTERVAL_COLUMNS = ("side", "side_key", "role", "task", "metric", "value", "low", "high")
DIFFERENCE_COLUMNS = ("a", "b", "a_key", "b_key", "task", "metric", "difference", "low", "high", "distinguishable")


def intervals_frame(results: ResultsFile) -> pd.DataFrame:
    """One row per side, task (then All) and metric that has an interval: `value`, and `low`, `high` of its 95%
    interval (results.json's `intervals` says how they were drawn). Empty for results.json written before them."""
    import pandas as pd

    names = results.intervals.metrics if results.intervals else []
    rows = [
        {
            "side": side.name,
            "side_key": side.key,
            "role": side.role,
            "task": task.name,
            "metric": metric,
            "value": results.value(side, task.name, metric),
            "low": bound[0],
            "high": bound[1],
        }
        for side in results.sides
        for task in results.task_rows
        for metric in names
        if (bound := results.bound(side, task.name, metric)) is not None
    ]
    frame = pd.DataFrame(rows, columns=list(INTERVAL_COLUMNS))
    return frame.astype({c: "float64" for c in ("value", "low", "high")})


def differences_frame(results: ResultsFile) -> pd.DataFrame:
    """One row per pair of plugin sides (noise floor and candidates), task (then All) and metric: `difference` is
    `a` minus `b`, measured on the same records; `distinguishable` is False when its interval covers 0, None without
    an interval (too few records). Empty for results.json written before intervals."""
    import pandas as pd

    names = {side.key: side.name for side in results.sides}
    rows = [
        {
            "a": names.get(d.a, d.a),
            "b": names.get(d.b, d.b),
            "a_key": d.a,
            "b_key": d.b,
            "task": d.task,
            "metric": d.metric,
            "difference": math.nan if d.difference is None else d.difference,
            "low": math.nan if d.low is None else d.low,
            "high": math.nan if d.high is None else d.high,
            "distinguishable": d.distinguishable,
        }
        for d in results.differences
    ]
    frame = pd.DataFrame(rows, columns=list(DIFFERENCE_COLUMNS))
    return frame.astype({c: "float64" for c in ("difference", "low", "high")})


def probabilities_frame(results: ResultsFile, folder: Path, sides: Sequence[SideEntry] | None = None) -> pd.DataFrame:
    """One row per side and stored record, read from RESULTS/probs/ and verified as the runner verifies it.

    A store also keeps records of earlier runs over other data (it is keyed by encoding); for each record id the
    latest line counts, as it does for a record scored again. Lines that do not verify are left out.
    """
    import pandas as pd

    rows = []
    for side in sides if sides is not None else results.sides:
        path = Path(folder) / side.probabilities
        if not path.is_file():
            raise DataError(f"{path} is missing: the per-record probabilities of clef-quant eval")
        for _, record in read_store(path, side.producer()).lines:
            rows.append(
                {
                    "side": side.name,
                    "side_key": side.key,
                    "role": side.role,
                    "id": record.id,
                    "task": record.task,
                    "tokens": record.tokens,
                    "seconds": record.seconds,
                    "questions": len(record.probabilities),
                    "probs": record.probabilities,
                }
            )
    frame = pd.DataFrame(rows, columns=["side", "side_key", "role", *RECORD_COLUMNS])
    return frame.drop_duplicates(["side_key", "id"], keep="last").reset_index(drop=True)


class ResultFrames(NamedTuple):
    """`load_results`'s two frames; unpacks as `results, probabilities = load_results(path)`."""

    results: pd.DataFrame
    probabilities: pd.DataFrame


def load_results(path: Path | str) -> ResultFrames:
    """Load a `clef-quant eval` output (its RESULTS folder, or the results.json inside it) as two DataFrames.

    `results`: one row per side and task, sides in run order (bf16 reference, noise floor, candidates), each
    side's tasks in results.json order and then `All` (every question of every task). Columns:
    `side` (display name), `side_key` (the key naming its probability store), `role` ("reference",
    "noise-floor" or "candidate"), `folder`, `task` (name, or "All"), `title`, `records`, `questions`, then one
    float column per metric of results.json: `accuracy`, `agreement`, `kl`, `tv`, `max_dp`, `ece` (question
    metrics; the reference's agreement/kl/tv/max_dp compare it with itself) and `records_per_s`,
    `tokens_per_s` (model time while scoring). A value results.json leaves null is NaN.

    `probabilities`: one row per side and stored record, read from RESULTS/probs/ and verified like the runner
    verifies it. Columns: `side`, `side_key`, `role`, `id` (record id), `task`, `tokens` (prompt tokens),
    `seconds` (its share of its batch's model time), `questions`, and `probs`: per question, the option
    probabilities in model order (a noul question is [true, false]). A record scored again counts with its latest
    line; records that an earlier run over other DATA left in the store are included (filter on `id` or `task`).

    The intervals are in `intervals_frame(read_results(path))` and `differences_frame(read_results(path))`.
    """
    results = read_results(Path(path))
    folder = results_json_path(Path(path)).parent
    return ResultFrames(values_frame(results), probabilities_frame(results, folder))


class IntervalFrames(NamedTuple):
    """`load_intervals`' two frames; unpacks as `intervals, differences = load_intervals(path)`."""

    intervals: pd.DataFrame
    differences: pd.DataFrame


def load_intervals(path: Path | str) -> IntervalFrames:
    """The 95% intervals of a `clef-quant eval` output (its RESULTS folder or results.json) as two DataFrames:
    `intervals_frame` (a value's interval per side, task and metric) and `differences_frame` (every pair of plugin
    sides). Both are empty for results.json written before intervals."""
    results = read_results(Path(path))
    return IntervalFrames(intervals_frame(results), differences_frame(results))
