"""Reading what the card shows from other commands' outputs: `clef-quant eval`'s RESULTS folder and the JSON of a
`clef-quant bench throughput` report. Only JSON is read; the card's tables are rendered from it by the modules
that render the markdown reports (`evaluation.tables`, `throughput_report`), so their numbers match.

RESULTS holds `results.json` (every number, the sides with their model fingerprints) and `probs/<side key>.jsonl`
(per-record probabilities, for the scatter plot), both read through `clef_quant.evaluation` (`ResultsFile`, the
frames).

The card is for one candidate: the side whose model fingerprint equals DIR's. That fingerprint is the sha256 of the
manifest's file list (see `clef_quant.evaluation.store`); it is computed here over the files `quantize` wrote, so
it still matches after `card` has added its own files to the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant import shipped
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.frames import differences_frame, intervals_frame, probabilities_frame, values_frame
from clef_quant.evaluation.metrics import METRIC_BY_NAME, QUALITY_METRICS, SPEED_METRICS, format_value
from clef_quant.evaluation.results import ALL, RESULTS_JSON, MetricEntry, ResultsFile, SideEntry, TaskEntry
from clef_quant.evaluation.results import read_results as read_eval_results
from clef_quant.evaluation.summary import DataSummary
from clef_quant.evaluation.tables import (
    differences_table,
    floor_words,
    interval_words,
    intervals_table,
    side_groups_table,
    sides_table,
    undecided,
    with_interval,
)
from clef_quant.publish.errors import PublishError
from clef_quant.release_folder.fingerprints import manifest_fingerprint
from clef_quant.release_folder.manifest import Manifest
from clef_quant.throughput_report import ThroughputResult, json_path, read_report
from clef_vllm.errors import ClefError

if TYPE_CHECKING:
    import pandas as pd

HUB_SOURCE = "hub"


@dataclass
class EvalResults:
    """RESULTS as the card uses it: its results.json, and which of its candidates DIR is."""

    folder: Path
    results: ResultsFile
    this: SideEntry  # the side that is DIR
    summary_rows: list[dict[str, str]] = field(default_factory=list)

    @property
    def json_sha256(self) -> str:
        """Of results.json's bytes as read, which the card cites; empty for results not read from a file."""
        return self.results.file_sha256 or ""

    @property
    def sides(self) -> list[SideEntry]:
        return self.results.sides

    @property
    def tasks(self) -> list[TaskEntry]:
        """The tasks in results.json order, then All."""
        return self.results.task_rows

    @property
    def metrics(self) -> list[MetricEntry]:
        return self.results.metrics

    @property
    def data_summary(self) -> DataSummary:
        return self.results.data.summary

    @property
    def reference(self) -> SideEntry:
        reference = self.results.reference
        assert reference is not None  # read_results refuses results without one
        return reference

    @property
    def noise_floor(self) -> SideEntry | None:
        return self.results.noise_floor

    @property
    def candidates(self) -> list[SideEntry]:
        return self.results.candidates

    @property
    def from_hub(self) -> bool:
        return self.data_summary.from_hub

    @property
    def datasets(self) -> list[str]:
        """Hub dataset ids for the card's front matter; none when the rows were local fixtures."""
        if not self.from_hub:
            return []
        ids = [task.dataset.id for task in self.data_summary.tasks.values()]
        return sorted({i for i in ids if i})

    @cached_property
    def media_tasks(self) -> list[str]:
        """Titles of the evaluated tasks whose requests carry images (their shipped task file says so)."""
        from clef_quant.evaluation.tasks import load_task

        found = []
        for name, task in self.data_summary.tasks.items():
            path = task.task_file.path or ""
            if not path.startswith(f"{shipped.EVAL}/"):  # a task file outside clef-quant: not read again here
                continue
            try:
                body = load_task(shipped.folder(shipped.EVAL).joinpath(path.split("/", 1)[1])).body
            except (ClefError, OSError):  # renamed or removed since: nothing to tell
                continue
            if "images" in body.request:
                found.append(task.get("title", name))
        return found

    def value(self, side: SideEntry, task: str, metric: str) -> float:
        return self.results.value(side, task, metric)

    @cached_property
    def frame(self) -> pd.DataFrame:
        return values_frame(self.results)

    # The card keeps the one-table-per-level form (a column group per side) that it has always shown.
    @property
    def quality_table(self) -> str:
        return side_groups_table(self.results, self.frame, QUALITY_METRICS)

    @property
    def sides_table(self) -> str:
        return sides_table(self.results)

    @property
    def speed_table(self) -> str:
        return side_groups_table(self.results, self.frame, SPEED_METRICS)

    # -- intervals (none in results.json written before them: the card then leaves their section out) ----------

    @property
    def intervals(self) -> dict[str, Any] | None:
        """How the intervals were drawn (method, confidence, minimum of records), or None without intervals."""
        settings = self.results.intervals
        return settings.model_dump() if settings is not None else None

    @property
    def interval_words(self) -> str:
        return interval_words(self.results.intervals) if self.results.intervals else ""

    @property
    def undecided(self) -> str:
        """Why All's intervals decide nothing (too few records), or empty."""
        return undecided(self.results, ALL) or ""

    @property
    def intervals_table(self) -> str:
        return intervals_table(self.results, intervals_frame(self.results))

    @property
    def differences_table(self) -> str:
        """This release against the noise floor and every other candidate, All."""
        return differences_table(self.results, differences_frame(self.results), side=self.this.key)

    @property
    def floor_verdict(self) -> str:
        """Whether this release can be told from the noise floor, in words (All)."""
        return floor_words(self.results, self.this)

    @property
    def example_interval(self) -> str:
        """This release's KL over All with its interval: the card's example of how to read one."""
        bound = self.results.bound(self.this, ALL, "kl")
        if bound is None:
            return ""
        return with_interval(METRIC_BY_NAME["kl"], self.value(self.this, ALL, "kl"), *bound)

    @cached_property
    def stored(self) -> pd.DataFrame:
        """Every side's verified stored probabilities, read once for all the plots that compare them."""
        try:
            return probabilities_frame(self.results, self.folder, list(self.sides))
        except DataError as exc:
            raise PublishError(str(exc)) from None

    def pairs(self, side: SideEntry) -> tuple[list[float], list[float]]:
        """Every option probability of every question: (reference, side), records matched by id."""
        stored = self.stored
        own = stored[stored["side_key"] == side.key].set_index("id")["probs"]
        reference = stored[stored["side_key"] == self.reference.key].set_index("id")["probs"]
        xs: list[float] = []
        ys: list[float] = []
        for record_id in sorted(set(reference.index) & set(own.index)):
            for ref_q, own_q in zip(reference[record_id], own[record_id], strict=False):
                if len(ref_q) == len(own_q):
                    xs.extend(ref_q)
                    ys.extend(own_q)
        return xs, ys


def read_results(results_dir: Path, folder: Path, manifest: Manifest) -> EvalResults:
    """RESULTS for the card of `folder`; refuses results that did not evaluate this folder."""
    results_dir = Path(results_dir)
    results_json = results_dir / RESULTS_JSON
    if not results_json.is_file():
        raise PublishError(f"{results_json} is missing: --results takes the RESULTS folder of clef-quant eval")
    try:
        results = read_eval_results(results_json)
    except DataError as exc:
        raise PublishError(str(exc)) from None

    fingerprint = manifest_fingerprint(manifest)
    this = next((s for s in results.candidates if s.model_hash.sha256 == fingerprint), None)
    if this is None:
        evaluated = ", ".join(f"{s.name} ({s.model_hash.sha256[:12]})" for s in results.candidates) or "none"
        raise PublishError(
            f"{results_dir} did not evaluate {folder} (model fingerprint {fingerprint[:12]}); its candidates: "
            f"{evaluated}; run clef-quant eval --candidate {folder} ... --out {results_dir}"
        )
    if results.reference is None:
        raise PublishError(f"{results_json} has no reference side")

    result = EvalResults(results_dir, results, this)
    result.summary_rows = summary_rows(result)
    return result


def summary_rows(results: EvalResults) -> list[dict[str, str]]:
    """The card's short table: this release next to the bf16 reference and the noise floor, per task."""

    def shown(side: SideEntry | None, task: str, metric: str) -> str:
        if side is None:
            return ""
        return format_value(METRIC_BY_NAME[metric], results.value(side, task, metric))

    floor = results.noise_floor
    rows = []
    for task in results.tasks:
        rows.append(
            {
                "task": f"**{ALL}**" if task.name == ALL else task.label,
                "reference_acc": shown(results.reference, task.name, "accuracy"),
                "acc": shown(results.this, task.name, "accuracy"),
                "agree": shown(results.this, task.name, "agreement"),
                "kl": shown(results.this, task.name, "kl"),
                "floor_agree": shown(floor, task.name, "agreement"),
                "floor_kl": shown(floor, task.name, "kl"),
            }
        )
    return rows


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
