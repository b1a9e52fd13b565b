"""Reading what the card shows from other commands' outputs: `clef-quant eval`'s RESULTS folder and the JSON of a
`clef-quant bench throughput` report. Only JSON is read; the card's tables are rendered from it by the functions
that render the markdown reports (`evaluation.report`, `bench.throughput_report`), so they match those reports.

RESULTS holds `results.json` (every number, the sides with their model fingerprints) and `probs/<side key>.jsonl`
(per-record probabilities, for the scatter plot).

The card is for one candidate: the side whose model fingerprint equals DIR's. That fingerprint is the sha256 of the
manifest's file list (see `clef_quant.evaluation.store`); it is computed here over the files `quantize` wrote, so
it still matches after `card` has added its own files to the manifest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.bench.throughput_report import ThroughputResult, json_path, read_report
from clef_quant.evaluation import report
from clef_quant.evaluation.store import manifest_fingerprint
from clef_quant.publish.errors import PublishError
from clef_vllm.errors import ClefError

RESULTS_FORMAT = "clef-quant-eval-results/1"
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

    # The tables of results.md, rendered from results.json by the functions that wrote results.md.
    @property
    def quality_table(self) -> str:
        return report.quality_table(self.raw)

    @property
    def sides_table(self) -> str:
        return report.sides_table(self.raw)

    @property
    def speed_table(self) -> str:
        return report.speed_table(self.raw)

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
    results_json = results_dir / report.RESULTS_JSON
    if not results_json.is_file():
        raise PublishError(f"{results_json} is missing: --results takes the RESULTS folder of clef-quant eval")
    raw_bytes = results_json.read_bytes()
    try:
        raw = json.loads(raw_bytes)
    except json.JSONDecodeError as exc:
        raise PublishError(f"{results_json} is not valid JSON: {exc.msg}") from None
    if raw.get("format") != RESULTS_FORMAT:
        raise PublishError(f"{results_json} has format {raw.get('format')!r}; this card reads {RESULTS_FORMAT}")

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
        raise PublishError(f"{results_json} has no reference side")

    tasks = [*raw["tasks"], {"name": ALL, "title": ALL}]
    result = EvalResults(
        folder=results_dir,
        raw=raw,
        json_sha256=hashlib.sha256(raw_bytes).hexdigest(),
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


def read_throughput(path: Path) -> tuple[ThroughputResult, str]:
    """(numbers, command) of a `bench throughput` report, from its JSON: `path` itself, or the JSON beside it when
    `path` is the markdown report."""
    path = Path(path)
    data = path if path.suffix == ".json" else json_path(path)
    if not data.is_file():
        hint = "" if data == path else f" (the JSON that clef-quant bench throughput writes beside {path})"
        raise PublishError(f"--throughput: {data} is missing{hint}; run clef-quant bench throughput again to write it")
    try:
        return read_report(data)
    except ClefError as exc:
        raise PublishError(f"--throughput: {exc}") from None
