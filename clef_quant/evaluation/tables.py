"""Markdown tables of an eval run, rendered from its `ResultsFile` and their values frame.

results.md shows one table per metric (a row per task and All, a column per side); the model card keeps its one
wide table per metric level (a column group per side), and both read their numbers from `frames.values_frame`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clef_quant.evaluation.metrics import METRIC_BY_NAME, Metric, format_value
from clef_quant.evaluation.results import ALL, IntervalSettings, ResultsFile, SideEntry
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


def measures(side: SideEntry, metric: Metric) -> bool:
    # Comparing the reference with itself gives 100% / 0 by construction; tables show only what a side measures.
    return side.role != "reference" or not metric.compares


def _task_cell(title: str, name: str) -> str:
    return f"**{title}**" if name == ALL else cell(title)


def _by_side_and_task(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(["side_key", "task"])


def metric_table(results: ResultsFile, frame: pd.DataFrame, metric: Metric) -> str:
    """One metric: a row per task and All, a column per side that measures it (results.md)."""
    values = _by_side_and_task(frame)[metric.name]
    sides = [side for side in results.sides if measures(side, metric)]
    rows = [
        [_task_cell(task.label, task.name), *[format_value(metric, values[side.key, task.name]) for side in sides]]
        for task in results.task_rows
    ]
    return markdown_table(["task", *[cell(side.name) for side in sides]], rows)


def tasks_table(results: ResultsFile) -> str:
    """Records and questions per task: how much one record moves a task's numbers."""
    rows = [[_task_cell(t.label, t.name), str(t.records), str(t.questions)] for t in results.task_rows]
    return markdown_table(["task", "records", "questions"], rows)


def side_groups_table(results: ResultsFile, frame: pd.DataFrame, metrics: Sequence[Metric]) -> str:
    """Every metric of `metrics` in one table, a column group per side (the model card's form)."""
    indexed = _by_side_and_task(frame)
    groups = [(side, [m for m in metrics if measures(side, m)]) for side in results.sides]
    header = ["task", "records", "questions"]
    for side, columns in groups:
        header += [cell(f"{side.name} · {m.title} {ARROWS[m.direction]}") for m in columns]
    rows = []
    for task in results.task_rows:
        cells = [_task_cell(task.label, task.name), str(task.records), str(task.questions)]
        for side, columns in groups:
            cells += [format_value(m, indexed.at[(side.key, task.name), m.name]) for m in columns]
        rows.append(cells)
    return markdown_table(header, rows)


def sides_table(results: ResultsFile) -> str:
    """One row per side: how it runs, its folder, and the model sha256 that identifies the files it ran."""
    rows = [
        [
            cell(side.name),
            ROLE_WORDS[side.role],
            f"`{side.folder}`",
            f"`{side.model_hash.sha256[:16]}` (from {_hash_source(side)})",
            f"{side.records_scored} / {side.records_reused}",
        ]
        for side in results.sides
    ]
    header = ["side", "runs as", "folder", "model sha256", "records scored / reused"]
    return markdown_table(header, rows, "llllr")


def _hash_source(side: SideEntry) -> str:
    scheme = side.model_hash.scheme
    return f"{side.model_hash.from_}, {scheme}" if scheme else side.model_hash.from_


# -- intervals ------------------------------------------------------------------------------------------------

INDISTINGUISHABLE = "indistinguishable: the interval covers 0, so these records cannot tell the two apart"


def interval_words(settings: IntervalSettings) -> str:
    """How results.json's intervals were drawn, in words (a bootstrap in files written before the t-interval)."""
    paired = (
        "with the same records for every side; a difference of two sides is measured on those same records, so it "
        "can be narrower than the two intervals side by side suggest."
    )
    if settings.resamples is not None:
        return (
            f"Each interval is the middle {settings.confidence:.0%} of {settings.resamples} resamples of the records "
            f"(bootstrap, seed {settings.seed}, every task keeps its size), {paired}"
        )
    floor = f" A task (or All) of fewer than {settings.min_records} records has none." if settings.min_records else ""
    return (
        f"Each interval is a {settings.confidence:.0%} t-interval over the records (a record's questions count as "
        f"one unit; n - 1 degrees of freedom), {paired}{floor}"
    )


def undecided(results: ResultsFile, task: str = ALL) -> str | None:
    """Why the intervals of `task` (or All) decide nothing, or None when they may: below results.json's minimum of
    records an interval is not drawn (`comparison.MIN_RECORDS` says why)."""
    settings = results.intervals
    records = next((t.records for t in results.task_rows if t.name == task), 0)
    if settings is None or settings.min_records is None or records >= settings.min_records:
        return None
    return f"too few records to decide (n = {records} < {settings.min_records})"


def with_interval(metric: Metric, value: float, low: float, high: float) -> str:
    """`72.2% [61.1%, 81.9%]`: a value and its interval, in the metric's format."""
    return f"{format_value(metric, value)} [{format_value(metric, low)}, {format_value(metric, high)}]"


def signed(metric: Metric, value: float) -> str:
    """A difference: `+4.2 pts` for a percentage, `-1.3e-03` otherwise."""
    if metric.percent:
        return f"{100 * value:+.1f} pts"
    return f"{value:+.2e}"


def verdict(metric: Metric, a: str, b: str, difference: float, distinguishable: bool | None) -> str:
    """What a difference says, in words; None: it has no interval to say it with."""
    if distinguishable is None:
        return "no interval: nothing decided"
    if not distinguishable:
        return INDISTINGUISHABLE
    better = a if (difference > 0) == (metric.direction == "higher") else b
    return f"{better} {'more accurate' if not metric.compares else 'closer to bf16'}"


def floor_words(results: ResultsFile, side: SideEntry, task: str = ALL) -> str:
    """Whether a candidate can be told from the noise floor by its agreement interval."""
    at_floor = results.at_floor(side, task)
    if at_floor is None:
        return undecided(results, task) or "n/a"
    if at_floor:
        return "at the floor: its agreement interval overlaps the noise floor's"
    return "below the floor: its agreement interval lies under the noise floor's"


def intervals_table(results: ResultsFile, frame: pd.DataFrame, task: str = ALL) -> str:
    """One row per side: every metric with an interval, as `value [low, high]`; a candidate's floor verdict."""
    indexed = frame[frame["task"] == task].set_index(["side_key", "metric"])
    names = results.intervals.metrics if results.intervals else []
    metrics = [METRIC_BY_NAME[name] for name in names]
    rows = []
    for side in results.sides:
        cells = [cell(side.name)]
        for metric in metrics:
            if not measures(side, metric):
                cells.append("—")
                continue
            if (side.key, metric.name) not in indexed.index:  # too few records: the value without an interval
                cells.append(f"{format_value(metric, results.value(side, task, metric.name))} [no interval]")
                continue
            row = indexed.loc[(side.key, metric.name)]
            cells.append(with_interval(metric, row["value"], row["low"], row["high"]))
        cells.append(floor_words(results, side, task) if side.is_candidate else "—")
        rows.append(cells)
    header = ["side", *[cell(f"{m.title} {ARROWS[m.direction]}") for m in metrics], "against the noise floor"]
    return markdown_table(header, rows, "l" + "r" * len(metrics) + "l")


def differences_table(results: ResultsFile, differences: pd.DataFrame, task: str = ALL, side: str | None = None) -> str:
    """Paired differences of one task (All by default): every pair, or only the pairs of side key `side`, turned
    so that `side` comes first. Below the minimum of records they have no interval and say so."""
    why = undecided(results, task)
    rows = []
    for d in differences[differences["task"] == task].itertuples():
        a, b, low, high, difference = d.a, d.b, d.low, d.high, d.difference
        if side is not None:
            if side not in (d.a_key, d.b_key):
                continue
            if d.b_key == side:
                a, b, low, high, difference = d.b, d.a, -d.high, -d.low, -d.difference
        metric = METRIC_BY_NAME[d.metric]
        decided = None if d.distinguishable is None else bool(d.distinguishable)
        rows.append(
            [
                cell(f"{a} − {b}"),
                cell(metric.title),
                signed(metric, difference),
                "—" if decided is None else f"[{signed(metric, low)}, {signed(metric, high)}]",
                cell(why if decided is None and why else verdict(metric, a, b, difference, decided)),
            ]
        )
    return markdown_table(["difference", "metric", "value", "95% interval", "what it says"], rows, "llrrl")
