"""Reading what the card shows from other commands' outputs: `clef-quant eval`'s RESULTS folder and a
`clef-quant bench throughput` report.

RESULTS holds `results.json` (every number, the sides with their model fingerprints), `results.md` (the tables,
copied into the card verbatim) and `probs/<side key>.jsonl` (per-record probabilities, for the scatter plot).
The card is for one candidate: the side whose model fingerprint equals DIR's. That fingerprint is the sha256 of the
manifest's file list (see `clef_quant.evaluation.store`); it is computed here over the files `quantize` wrote, so
it still matches after `card` has added its own files to the manifest.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.evaluation.store import manifest_fingerprint
from clef_quant.publish.errors import PublishError

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_FORMAT = "clef-quant-eval-results/1"
QUALITY_HEADING = "Quality"
SPEED_HEADING = "Speed"
ALL = "All"
HUB_SOURCE = "hub"


@dataclass
class Side:
    key: str
    name: str
    role: str  # "reference", "noise-floor" or "candidate"
    folder: str
    fingerprint: str
    probabilities: str  # RESULTS-relative path of the per-record store

    @property
    def is_candidate(self) -> bool:
        return self.role == "candidate"


@dataclass
class EvalResults:
    """RESULTS as the card uses it; `values[side key][task or All][metric]` as in results.json."""

    folder: Path
    raw: dict[str, Any]
    json_sha256: str
    table: str  # the Quality table of results.md, verbatim
    sides_table: str  # the table of sides (folders, model hashes) of results.md, verbatim
    speed_table: str | None  # the Speed table of results.md, verbatim (the card's fallback throughput table)
    sides: list[Side]
    this: Side  # the side that is DIR
    tasks: list[dict[str, Any]]  # name, title, records, questions (results.json order), then All
    values: dict[str, dict[str, dict[str, float | None]]]
    metrics: list[dict[str, Any]]
    data_summary: dict[str, Any]
    summary_rows: list[dict[str, str]] = field(default_factory=list)

    @property
    def reference(self) -> Side:
        return next(s for s in self.sides if s.role == "reference")

    @property
    def noise_floor(self) -> Side | None:
        return next((s for s in self.sides if s.role == "noise-floor"), None)

    @property
    def candidates(self) -> list[Side]:
        return [s for s in self.sides if s.is_candidate]

    @property
    def from_hub(self) -> bool:
        return self.data_summary.get("source") == HUB_SOURCE

    @property
    def datasets(self) -> list[str]:
        """Hub dataset ids for the card's front matter; none when the rows were local fixtures."""
        if not self.from_hub:
            return []
        ids = [((t.get("dataset") or {}).get("id")) for t in (self.data_summary.get("tasks") or {}).values()]
        return sorted({i for i in ids if i})

    @property
    def data_line(self) -> str:
        counts = self.data_summary.get("counts") or {}
        tasks = self.data_summary.get("tasks") or {}
        line = (
            f"Measured on {counts.get('eval_records', '?')} records ({counts.get('eval_questions', '?')} questions) "
            f"of {len(tasks)} tasks, sampled with seed {self.data_summary.get('seed', '?')}"
        )
        if self.from_hub:
            return line + " from the held-out splits of the datasets on the Hub."
        # Said in bold: numbers from stand-in rows must never pass for numbers on the real datasets.
        return (
            line + f". **The rows are the synthetic stand-ins in `{self.data_summary.get('source')}`, written in "
            "each dataset's format, not the datasets themselves.**"
        )

    @property
    def tasks_line(self) -> str:
        tasks = self.data_summary.get("tasks") or {}
        described = []
        for name, task in tasks.items():
            dataset = (task.get("dataset") or {}).get("id", "?")
            described.append(f"{task.get('title', name)} (`{dataset}`, {(task.get('eval') or {}).get('split')})")
        return f"Tasks (dataset, split): {', '.join(described)}."

    @property
    def metrics_line(self) -> str:
        quality = [m for m in self.metrics if m.get("level") == "question"]
        return (
            "Columns: "
            + "; ".join(
                f"{m['title']}: {m['description']} ({m['aggregation']}, {m['direction']} is better)" for m in quality
            )
            + "."
        )

    def pairs(self, side: Side) -> tuple[list[float], list[float]]:
        """Every option probability of every question: (reference, side), records matched by id."""
        reference = _read_store(self.folder / self.reference.probabilities)
        own = _read_store(self.folder / side.probabilities)
        xs: list[float] = []
        ys: list[float] = []
        for record_id in sorted(reference.keys() & own.keys()):
            for ref_q, own_q in zip(reference[record_id], own[record_id], strict=False):
                if len(ref_q) == len(own_q):
                    xs.extend(ref_q)
                    ys.extend(own_q)
        return xs, ys


def read_results(results_dir: Path, folder: Path, manifest: dict[str, Any]) -> EvalResults:
    """RESULTS for the card of `folder`; refuses results that did not evaluate this folder."""
    results_dir = Path(results_dir)
    json_path, md_path = results_dir / RESULTS_JSON, results_dir / RESULTS_MD
    for path in (json_path, md_path):
        if not path.is_file():
            raise PublishError(f"{path} is missing: --results takes the RESULTS folder of clef-quant eval")
    raw_bytes = json_path.read_bytes()
    try:
        raw = json.loads(raw_bytes)
    except json.JSONDecodeError as exc:
        raise PublishError(f"{json_path} is not valid JSON: {exc.msg}") from None
    if raw.get("format") != RESULTS_FORMAT:
        raise PublishError(f"{json_path} has format {raw.get('format')!r}; this card reads {RESULTS_FORMAT}")

    sides = [
        Side(
            key=s["key"],
            name=s["name"],
            role=s["role"],
            folder=s["folder"],
            fingerprint=(s.get("model_hash") or {}).get("sha256", ""),
            probabilities=s.get("probabilities", ""),
        )
        for s in raw["sides"]
    ]
    fingerprint = manifest_fingerprint(manifest)
    this = next((s for s in sides if s.is_candidate and s.fingerprint == fingerprint), None)
    if this is None:
        evaluated = ", ".join(f"{s.name} ({s.fingerprint[:12]})" for s in sides if s.is_candidate) or "none"
        raise PublishError(
            f"{results_dir} did not evaluate {folder} (model fingerprint {fingerprint[:12]}); its candidates: "
            f"{evaluated}; run clef-quant eval --candidate {folder} ... --out {results_dir}"
        )
    if not any(s.role == "reference" for s in sides):
        raise PublishError(f"{json_path} has no reference side")

    text = md_path.read_text(encoding="utf-8")
    table = section_table(text, QUALITY_HEADING)
    if table is None:
        raise PublishError(f"{md_path} has no table under '## {QUALITY_HEADING}'")
    sides_table = first_table(text) or ""
    tasks = [*raw["tasks"], {"name": ALL, "title": ALL}]
    result = EvalResults(
        folder=results_dir,
        raw=raw,
        json_sha256=hashlib.sha256(raw_bytes).hexdigest(),
        table=table,
        sides_table=sides_table,
        speed_table=section_table(text, SPEED_HEADING),
        sides=sides,
        this=this,
        tasks=tasks,
        values=raw["values"],
        metrics=raw.get("metrics") or [],
        data_summary=(raw.get("data") or {}).get("summary") or {},
    )
    result.summary_rows = summary_rows(result)
    return result


def summary_rows(results: EvalResults) -> list[dict[str, str]]:
    """The card's short table: this release next to the bf16 reference and the noise floor, per task."""
    from clef_quant.evaluation.metrics import METRIC_BY_NAME, format_value

    def shown(side: Side | None, task: str, metric: str) -> str:
        if side is None:
            return ""
        value = results.values.get(side.key, {}).get(task, {}).get(metric)
        return format_value(METRIC_BY_NAME[metric], float("nan") if value is None else value)

    floor = results.noise_floor
    rows = []
    for task in results.tasks:
        name = task["name"]
        rows.append(
            {
                "task": f"**{ALL}**" if name == ALL else task.get("title", name),
                "reference_acc": shown(results.reference, name, "accuracy"),
                "acc": shown(results.this, name, "accuracy"),
                "agree": shown(results.this, name, "agreement"),
                "kl": shown(results.this, name, "kl"),
                "floor_agree": shown(floor, name, "agreement"),
                "floor_kl": shown(floor, name, "kl"),
            }
        )
    return rows


def _read_store(path: Path) -> dict[str, list[list[float]]]:
    """Record id -> probabilities per question; a later line for the same id (a rescored record) wins."""
    if not path.is_file():
        raise PublishError(f"{path} is missing: the per-record probabilities of clef-quant eval")
    found: dict[str, list[list[float]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            found[str(entry["id"])] = entry["probs"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a torn last line of an interrupted run
    return found


# -- markdown tables ------------------------------------------------------------------------------------------


def tables(text: str) -> list[str]:
    """Every pipe table of a markdown text, each verbatim (lines joined with newlines)."""
    found: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if len(current) >= 2 and re.match(r"^\|[\s:|-]+\|$", current[1]):
            found.append("\n".join(current))
        current = []
    return found


def first_table(text: str) -> str | None:
    found = tables(text)
    return found[0] if found else None


def section_table(text: str, heading: str) -> str | None:
    """The first table after the `## heading` line of a markdown text."""
    match = re.search(rf"^##\s+{re.escape(heading)}\s*$", text, flags=re.MULTILINE)
    if match is None:
        return None
    return first_table(text[match.end() :])


@dataclass
class ThroughputReport:
    name: str  # the report's file name, as the card links it
    title: str
    summary: str  # e.g. "machine ..., date ..."
    tables: list[str]


def read_throughput(path: Path) -> ThroughputReport:
    """A `bench throughput` markdown report: its title, the key/value facts, and its result tables verbatim."""
    path = Path(path)
    if not path.is_file():
        raise PublishError(f"--throughput {path} is not a file")
    text = path.read_text(encoding="utf-8")
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), path.stem)
    facts: dict[str, str] = {}
    results = []
    for table in tables(text):
        lines = table.splitlines()
        if lines[0].replace(" ", "") == "|||":  # the report's key/value header table
            for line in lines[2:]:
                cells = [c.strip() for c in line.strip("|").split("|")]
                if len(cells) == 2:
                    facts[cells[0]] = cells[1]
        else:
            results.append(table)
    if not results:
        raise PublishError(f"{path} has no results table")
    wanted = [key for key in ("machine", "device", "date", "records") if key in facts]
    summary = "; ".join(f"{key}: {facts[key]}" for key in wanted) or title
    return ThroughputReport(path.name, title, summary, results)
