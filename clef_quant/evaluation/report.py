"""results.json (everything), results.csv (every metric, one row per side and task) and results.md (for reading).

results.json is the run's `ResultsFile` serialized; results.csv and results.md are rendered from the same model
and its values frame, the ones `load_results` returns and the model card reads, so no file can disagree with
another.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clef_quant.evaluation.frames import differences_frame, intervals_frame, metric_names, values_frame
from clef_quant.evaluation.metrics import QUALITY_METRICS, SPEED_METRICS, Metric
from clef_quant.evaluation.results import ALL, RESULTS_JSON, ResultsFile
from clef_quant.evaluation.tables import (
    ARROWS,
    differences_table,
    interval_words,
    intervals_table,
    metric_table,
    sides_table,
    tasks_table,
    undecided,
)
from clef_quant.release_folder.atomic import write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
CSV_COLUMNS = ("side", "role", "folder", "task", "records", "questions")
# results.md's sections: a title, what its tables show, and one table per metric.
METRIC_GROUPS = (
    (
        "Quality",
        "One table per metric: a row per task and for All over every question, a column per side. Metrics that "
        "compare with the bf16 reference leave the reference out (it would be compared with itself). The noise "
        "floor is the bf16 folder itself through the plugin, so a candidate's distance from the reference is "
        "quantization damage only where it exceeds the noise floor's.",
        QUALITY_METRICS,
    ),
    (
        "Speed",
        "Model time while scoring, encoding excluded. Reused records keep the time measured when they were "
        "scored. Noul questions count as two options.",
        SPEED_METRICS,
    ),
)


def write_results(results: ResultsFile, out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frame = values_frame(results)
    paths = [out / RESULTS_JSON, out / RESULTS_CSV, out / RESULTS_MD]
    write_json_atomic(paths[0], results.to_json())
    write_text_atomic(paths[1], render_csv(results, frame))
    write_text_atomic(paths[2], render_markdown(results, frame))
    return paths


def render_csv(results: ResultsFile, frame: pd.DataFrame) -> str:
    """Every metric of every side and task (and All); six significant digits, empty where there is no value."""
    columns = [*CSV_COLUMNS, *metric_names(results)]
    return frame[columns].to_csv(index=False, float_format="%.6g", na_rep="", lineterminator="\n")


def _metric_section(results: ResultsFile, frame: pd.DataFrame, metric: Metric) -> list[str]:
    # A speed's aggregation (records / seconds) only repeats its description; a quality's (mean, max) does not.
    how = f" ({metric.aggregation})" if metric.level == "question" else ""
    return [
        f"### {metric.title} {ARROWS[metric.direction]}",
        "",
        f"{metric.description[:1].upper()}{metric.description[1:]}{how}.",
        "",
        metric_table(results, frame, metric),
        "",
    ]


def interval_section(results: ResultsFile) -> list[str]:
    """All's values with their 95% intervals, each candidate against the noise floor, and every pair's difference."""
    settings = results.intervals
    if settings is None:
        return []
    why = undecided(results, ALL)
    return [
        "## How sure: 95% intervals",
        "",
        f"{interval_words(settings)} A difference whose interval covers 0 is one these records cannot tell from "
        "chance: another draw of the data could reverse it. A candidate is at the noise floor when its agreement "
        "interval overlaps the noise floor's. Every task's intervals are in `results.json` (`bounds`, "
        "`differences`).",
        "",
        *(
            [f"**{why[:1].upper()}{why[1:]}**: no interval is drawn over All and no difference is decided.", ""]
            if why
            else []
        ),
        f"**{ALL}, every side:**",
        "",
        intervals_table(results, intervals_frame(results)),
        "",
        f"**{ALL}, every pair of sides run through the plugin (the first minus the second):**",
        "",
        differences_table(results, differences_frame(results)),
        "",
    ]


def _known(value: object) -> str:
    """A fact of the DATA summary, or `?` where an older summary does not have it."""
    return "?" if value is None else str(value)


def render_markdown(results: ResultsFile, frame: pd.DataFrame) -> str:
    summary = results.data.summary
    counts = summary.counts
    tasks = results.tasks
    smallest = min((t.records for t in tasks), default=0)
    tools = ", ".join(f"{name} {version}" for name, version in results.tools.items() if version)
    lines = [
        "# Evaluation against the bf16 reference",
        "",
        f"{results.created}. DATA `{results.data.folder}`: {_known(counts.eval_records)} records, "
        f"{_known(counts.eval_questions)} questions from {len(tasks)} tasks "
        f"(source {_known(summary.source)}, seed {_known(summary.seed)}). "
        f"Maximum length {results.config.max_model_len} tokens. Tools: {tools}. "
        f"Every number is also in `{RESULTS_CSV}` (one row per side and task).",
        "",
        sides_table(results),
        "",
        tasks_table(results),
        "",
    ]
    for title, intro, metrics in METRIC_GROUPS:
        lines += [f"## {title}", "", intro, ""]
        for metric in metrics:
            lines += _metric_section(results, frame, metric)
        if metrics is QUALITY_METRICS:
            lines += interval_section(results)
    lines += [
        f"What these numbers do not show: with {smallest} records in the smallest task, one record moves that "
        f"task's accuracy by {100 / max(smallest, 1):.1f} points; agreement and KL say how close a candidate stays "
        "to bf16, not whether bf16 is right; speed on a shared CPU says little about a GPU.",
        "",
    ]
    return "\n".join(lines)
