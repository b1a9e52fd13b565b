"""Markdown tables of an eval run, rendered from the typed results and their values frame.

results.md shows one table per metric (a row per task and All, a column per side); the model card keeps its one
wide table per metric level (a column group per side), and both read their numbers from `frames.values_frame`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clef_quant.evaluation.metrics import METRIC_BY_NAME, Metric, format_value
from clef_quant.evaluation.results import ALL, Results, ResultSide
from clef_quant.formatting import markdown_table

if TYPE_CHECKING:
    import pandas as pd

ARROWS = {"higher": "↑", "lower": "↓"}
ROLE_WORDS = {
    "reference": "reference: transformers, bf16 (the release's own path)",
    "noise-floor": "noise floor: the same bf16 folder through the vLLM plugin",
    "candidate": "candidate, through the vLLM plugin",
}


def cell(text: str) -> str:
    """Markdown table cell text: a bare `|` (as in `max |dp|`) would end the cell."""
    return text.replace("|", "\\|")


def measures(side: ResultSide, metric: Metric) -> bool:
    # Comparing the reference with itself gives 100% / 0 by construction; tables show only what a side measures.
    return side.role != "reference" or not metric.compares


def _task_cell(title: str, name: str) -> str:
    return f"**{title}**" if name == ALL else cell(title)


def _by_side_and_task(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(["side_key", "task"])


def metric_table(results: Results, frame: pd.DataFrame, metric: Metric) -> str:
    """One metric: a row per task and All, a column per side that measures it (results.md)."""
    values = _by_side_and_task(frame)[metric.name]
    sides = [side for side in results.sides if measures(side, metric)]
    rows = [
        [_task_cell(task.title, task.name), *[format_value(metric, values[side.key, task.name]) for side in sides]]
        for task in results.tasks
    ]
    return markdown_table(["task", *[cell(side.name) for side in sides]], rows)


def tasks_table(results: Results) -> str:
    """Records and questions per task: how much one record moves a task's numbers."""
    rows = [[_task_cell(t.title, t.name), str(t.records), str(t.questions)] for t in results.tasks]
    return markdown_table(["task", "records", "questions"], rows)


def side_groups_table(results: Results, frame: pd.DataFrame, metrics: Sequence[Metric]) -> str:
    """Every metric of `metrics` in one table, a column group per side (the model card's form)."""
    indexed = _by_side_and_task(frame)
    groups = [(side, [m for m in metrics if measures(side, m)]) for side in results.sides]
    header = ["task", "records", "questions"]
    for side, columns in groups:
        header += [cell(f"{side.name} · {m.title} {ARROWS[m.direction]}") for m in columns]
    rows = []
    for task in results.tasks:
        cells = [_task_cell(task.title, task.name), str(task.records), str(task.questions)]
        for side, columns in groups:
            cells += [format_value(m, indexed.at[(side.key, task.name), m.name]) for m in columns]
        rows.append(cells)
    return markdown_table(header, rows)


def sides_table(results: Results) -> str:
    """One row per side: how it runs, its folder, and the model sha256 that identifies the files it ran."""
    rows = [
        [
            cell(side.name),
            ROLE_WORDS[side.role],
            f"`{side.folder}`",
            f"`{side.sha256[:16]}` (from {side.hash_from}{f', {side.scheme}' if side.scheme else ''})",
            f"{side.records_scored} / {side.records_reused}",
        ]
        for side in results.sides
    ]
    header = ["side", "runs as", "folder", "model sha256", "records scored / reused"]
    return markdown_table(header, rows, "llllr")


# -- intervals ------------------------------------------------------------------------------------------------

INDISTINGUISHABLE = "indistinguishable: the interval covers 0, so these records cannot tell the two apart"


def with_interval(metric: Metric, value: float, low: float, high: float) -> str:
    """`72.2% [61.1%, 81.9%]`: a value and its interval, in the metric's format."""
    return f"{format_value(metric, value)} [{format_value(metric, low)}, {format_value(metric, high)}]"


def signed(metric: Metric, value: float) -> str:
    """A difference: `+4.2 pts` for a percentage, `-1.3e-03` otherwise."""
    if metric.percent:
        return f"{100 * value:+.1f} pts"
    return f"{value:+.2e}"


def verdict(metric: Metric, a: str, b: str, difference: float, distinguishable: bool) -> str:
    """What a difference says, in words."""
    if not distinguishable:
        return INDISTINGUISHABLE
    better = a if (difference > 0) == (metric.direction == "higher") else b
    return f"{better} {'more accurate' if not metric.compares else 'closer to bf16'}"


def floor_words(results: Results, side: ResultSide, task: str = ALL) -> str:
    """Whether a candidate can be told from the noise floor by its agreement interval."""
    at_floor = results.at_floor(side, task)
    if at_floor is None:
        return "n/a"
    if at_floor:
        return "at the floor: its agreement interval overlaps the noise floor's"
    return "below the floor: its agreement interval lies under the noise floor's"


def intervals_table(results: Results, frame: pd.DataFrame, task: str = ALL) -> str:
    """One row per side: every metric with an interval, as `value [low, high]`; a candidate's floor verdict."""
    indexed = frame[frame["task"] == task].set_index(["side_key", "metric"])
    metrics = [METRIC_BY_NAME[name] for name in dict.fromkeys(frame["metric"])]
    rows = []
    for side in results.sides:
        cells = [cell(side.name)]
        for metric in metrics:
            if not measures(side, metric) or (side.key, metric.name) not in indexed.index:
                cells.append("—")
                continue
            row = indexed.loc[(side.key, metric.name)]
            cells.append(with_interval(metric, row["value"], row["low"], row["high"]))
        cells.append(floor_words(results, side, task) if side.is_candidate else "—")
        rows.append(cells)
    header = ["side", *[cell(f"{m.title} {ARROWS[m.direction]}") for m in metrics], "against the noise floor"]
    return markdown_table(header, rows, "l" + "r" * len(metrics) + "l")


def differences_table(differences: pd.DataFrame, task: str = ALL, side: str | None = None) -> str:
    """Paired differences of one task (All by default): every pair, or only the pairs of side key `side`, turned
    so that `side` comes first."""
    rows = []
    for d in differences[differences["task"] == task].itertuples():
        a, b, low, high, difference = d.a, d.b, d.low, d.high, d.difference
        if side is not None:
            if side not in (d.a_key, d.b_key):
                continue
            if d.b_key == side:
                a, b, low, high, difference = d.b, d.a, -d.high, -d.low, -d.difference
        metric = METRIC_BY_NAME[d.metric]
        rows.append(
            [
                cell(f"{a} − {b}"),
                cell(metric.title),
                signed(metric, difference),
                f"[{signed(metric, low)}, {signed(metric, high)}]",
                cell(verdict(metric, a, b, difference, bool(d.distinguishable))),
            ]
        )
    return markdown_table(["difference", "metric", "value", "95% interval", "what it says"], rows, "llrrl")
