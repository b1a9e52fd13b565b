"""Evaluation harness: task files -> SystemOne records (build-data), and bf16 vs candidates through the plugin (eval).

build-data: `tasks` (task files and the small expression language they use), `sources` (dataset splits from the
Hub or a local Parquet copy), `sampling` (records drawn from the splits), `build` (writing a DATA folder), `data`
(the DATA folder layout and reading it back).
eval: `config` (what a run compares), `sides` (reference, noise floor, candidates), `engines` (the plugin's
engines), `scoring` (probabilities through transformers or the plugin), `store` (per-record probabilities kept
between runs, and their one parser), `metrics` (the one metric registry), `comparison` (sides against the
reference), `runner` (the run itself), `results` (results.json's one typed form, `ResultsFile`: built by the runner,
written by the report, read by every reader), `frames` (the results as pandas DataFrames), `tables` (markdown
tables from them), `report` (results.json / .csv / .md).

`load_results(path)` reads an eval output back as DataFrames, `load_intervals(path)` its 95% intervals; see
`frames` for the columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clef_quant.evaluation.frames import IntervalFrames, ResultFrames, load_intervals, load_results

__all__ = ["IntervalFrames", "ResultFrames", "load_intervals", "load_results"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the package's other modules (errors, tasks) load on every CLI start and need none of
    # what reading results pulls in (the release resolver, the Hub client).
    if name in __all__:
        from clef_quant.evaluation import frames

        return getattr(frames, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
