"""An eval output as pandas DataFrames: every metric per side and task, and every stored record's probabilities.

The report's tables, results.csv and the model card are all rendered from these frames (or from the typed
`Results` they are built from), so what a reader loads is what the report shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.results import Results, ResultSide, read_results, results_json_path
from clef_quant.evaluation.store import read_store

if TYPE_CHECKING:
    import pandas as pd

SIDE_COLUMNS = ("side", "side_key", "role", "folder")
TASK_COLUMNS = ("task", "title", "records", "questions")
RECORD_COLUMNS = ("id", "task", "tokens", "seconds", "questions", "probs")


def metric_names(results: Results) -> list[str]:
    """The metrics results.json lists, in its order (the columns after the side and task columns)."""
    return [m.name for m in results.metrics]


def values_frame(results: Results) -> pd.DataFrame:
    """One row per side and task (the tasks, then All), side order first; a metric without a value is NaN."""
    import pandas as pd

    metrics = metric_names(results)
    rows = []
    for side in results.sides:
        for task in results.tasks:
            row = {
                "side": side.name,
                "side_key": side.key,
                "role": side.role,
                "folder": side.folder,
                "task": task.name,
                "title": task.title,
                "records": task.records,
                "questions": task.questions,
            }
            rows.append(row | {m: results.value(side, task.name, m) for m in metrics})
    frame = pd.DataFrame(rows, columns=[*SIDE_COLUMNS, *TASK_COLUMNS, *metrics])
    return frame.astype({m: "float64" for m in metrics})


def probabilities_frame(results: Results, folder: Path, sides: Sequence[ResultSide] | None = None) -> pd.DataFrame:
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
    """
    results = read_results(Path(path))
    folder = results_json_path(Path(path)).parent
    return ResultFrames(values_frame(results), probabilities_frame(results, folder))
