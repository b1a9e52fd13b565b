"""results.json (everything), results.csv (one row per side and task) and results.md (the model-card tables).

The tables of results.md are rendered from the results dict alone (`sides_table`, `quality_table`, `speed_table`),
so the model card renders the same tables from results.json and the two cannot drift apart.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from clef_quant.evaluation.comparison import ALL
from clef_quant.evaluation.metrics import QUALITY_METRICS, SPEED_METRICS, Metric, format_value
from clef_quant.release_folder.atomic import write_json_atomic, write_text_atomic

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
ARROWS = {"higher": "↑", "lower": "↓"}
ROLE_WORDS = {
    "reference": "reference: transformers, bf16 (the release's own path)",
    "noise-floor": "noise floor: the same bf16 folder through the vLLM plugin",
    "candidate": "candidate, through the vLLM plugin",
}


def write_results(results: dict[str, Any], out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / RESULTS_JSON, out / RESULTS_CSV, out / RESULTS_MD]
    write_json_atomic(paths[0], results)
    write_text_atomic(paths[1], render_csv(results))
    write_text_atomic(paths[2], render_markdown(results))
    return paths


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Task rows then All, each with its counts."""
    rows = [dict(task) for task in results["tasks"]]
    rows.append(
        {
            "name": ALL,
            "title": ALL,
            "records": sum(t["records"] for t in rows),
            "questions": sum(t["questions"] for t in rows),
        }
    )
    return rows


def render_csv(results: dict[str, Any]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    metrics = [m["name"] for m in results["metrics"]]
    writer.writerow(["side", "role", "folder", "task", "records", "questions", *metrics])
    for side in results["sides"]:
        for row in _rows(results):
            values = results["values"][side["key"]][row["name"]]
            writer.writerow(
                [
                    side["name"],
                    side["role"],
                    side["folder"],
                    row["name"],
                    row["records"],
                    row["questions"],
                    *["" if values[m] is None else f"{values[m]:.6g}" for m in metrics],
                ]
            )
    return buffer.getvalue()


def _group_columns(side: dict[str, Any], metrics: tuple[Metric, ...]) -> list[Metric]:
    # Comparing the reference with itself gives 100% / 0 by construction; the table shows only what it measures.
    return [m for m in metrics if side["role"] != "reference" or not m.compares]


def _table(results: dict[str, Any], metrics: tuple[Metric, ...]) -> str:
    groups = [(side, _group_columns(side, metrics)) for side in results["sides"]]
    header = ["task", "records", "questions"]
    for side, columns in groups:
        header += [_cell(f"{side['name']} · {m.title} {ARROWS[m.direction]}") for m in columns]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in _rows(results):
        title = f"**{row['title']}**" if row["name"] == ALL else _cell(row["title"])
        cells = [title, str(row["records"]), str(row["questions"])]
        for side, columns in groups:
            values = results["values"][side["key"]][row["name"]]
            cells += [format_value(m, _nan(values[m.name])) for m in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def quality_table(results: dict[str, Any]) -> str:
    """The Quality table: one column group per side, one row per task and All."""
    return _table(results, QUALITY_METRICS)


def speed_table(results: dict[str, Any]) -> str:
    """The Speed table: model time per side while scoring."""
    return _table(results, SPEED_METRICS)


def sides_table(results: dict[str, Any]) -> str:
    """One row per side: how it runs, its folder, and the model sha256 that identifies the files it ran."""
    lines = [
        "| side | runs as | folder | model sha256 | records scored / reused |",
        "|---|---|---|---|---:|",
    ]
    for side in results["sides"]:
        model_hash = side["model_hash"]
        scheme = f", {model_hash['scheme']}" if model_hash.get("scheme") else ""
        lines.append(
            f"| {_cell(side['name'])} | {ROLE_WORDS[side['role']]} | `{side['folder']}` | "
            f"`{model_hash['sha256'][:16]}` (from {model_hash['from']}{scheme}) | "
            f"{side['records_scored']} / {side['records_reused']} |"
        )
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Markdown table cell text: a bare `|` (as in `max |dp|`) would end the cell."""
    return text.replace("|", "\\|")


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def render_markdown(results: dict[str, Any]) -> str:
    data = results["data"]
    summary = data.get("summary") or {}
    counts = summary.get("counts") or {}
    config = results["config"]
    smallest = min((t["records"] for t in results["tasks"]), default=0)
    tools = ", ".join(f"{name} {version}" for name, version in results["tools"].items() if version)
    lines = [
        "# Evaluation against the bf16 reference",
        "",
        f"{results['created']}. DATA `{data['folder']}`: {counts.get('eval_records', '?')} records, "
        f"{counts.get('eval_questions', '?')} questions from {len(results['tasks'])} tasks "
        f"(source {summary.get('source', '?')}, seed {summary.get('seed', '?')}). "
        f"Maximum length {config['max_model_len']} tokens. Tools: {tools}.",
        "",
        sides_table(results),
    ]
    lines += [
        "",
        "## Quality",
        "",
        "Per task, and for All over every question. Every column group compares one side with the bf16 "
        "reference; the noise floor group is the bf16 folder itself through the plugin, so a candidate's "
        "distance from the reference is quantization damage only where it exceeds the noise floor's.",
        "",
        *[f"- {_cell(m.title)}: {m.description} ({m.aggregation})." for m in QUALITY_METRICS],
        "",
        quality_table(results),
        "",
        "## Speed",
        "",
        *[f"- {m.title}: {m.description}." for m in SPEED_METRICS],
        "- Reused records keep the time measured when they were scored. Noul questions count as two options.",
        "",
        speed_table(results),
        "",
        f"What these numbers do not show: with {smallest} records in the smallest task, one record moves that "
        f"task's accuracy by {100 / max(smallest, 1):.1f} points; agreement and KL say how close a candidate stays "
        "to bf16, not whether bf16 is right; speed on a shared CPU says little about a GPU.",
        "",
    ]
    return "\n".join(lines)
