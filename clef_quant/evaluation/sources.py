"""Rows of the tasks' datasets: one split as a `datasets.Dataset`, from the Hub or a local Parquet copy.

Rows come from `datasets.load_dataset`, always: with the real Hub ids (`source="hub"`, the revision a task file
names, e.g. the Parquet export of script datasets), or with the `parquet` builder pointed at a local copy laid
out as the Hub's Parquet export (`<source>/<dataset id>/<config>/<split>/*.parquet`, as `eval/fixtures/` is;
`source="fixtures"` names that shipped copy wherever clef-quant is installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clef_quant.evaluation.errors import DataError, DatasetError
from clef_quant.evaluation.tasks import LabelNames, Task

HUB = "hub"
FIXTURES = "fixtures"  # the synthetic rows shipped with clef-quant (eval/fixtures/)


def load_split(task: Task, split: str, source: str = HUB) -> Any:
    """One split of a task's dataset as a `datasets.Dataset`, its declared columns checked."""
    import datasets

    spec = task.dataset
    where = f"{spec.id} ({spec.config}, split {split})"
    try:
        if source == HUB:
            where += f" at revision {spec.revision}" if spec.revision else ""
            dataset = datasets.load_dataset(spec.id, spec.config, split=split, revision=spec.revision)
        else:
            folder = Path(source) / spec.id / spec.config / split
            files = sorted(folder.glob("*.parquet"))
            if not files:
                raise DatasetError(
                    f"no Parquet files for {where} in {folder}; a local source is laid out as the Hub's Parquet "
                    f"export: <source>/<dataset id>/<config>/<split>/0000.parquet"
                )
            dataset = datasets.load_dataset("parquet", data_files={split: [str(f) for f in files]}, split=split)
    except DatasetError:
        raise
    except Exception as exc:  # datasets raises many types (network, missing split, script); all mean "cannot read"
        hint = f" ({spec.revision_reason})" if spec.revision_reason else ""
        raise DatasetError(
            f"cannot read {where}{hint}: {type(exc).__name__}: {_first_line(exc)}; "
            f"offline, use --source {FIXTURES} (synthetic rows in the same format)"
        ) from None
    missing = [c for c in spec.columns if c not in dataset.column_names]
    if missing:
        raise DatasetError(f"{where} lacks column(s) {', '.join(missing)}; it has {', '.join(dataset.column_names)}")
    return dataset


def label_names(dataset: Any) -> LabelNames:
    """Class names of every ClassLabel column (the Parquet files carry the features, so the Hub and local agree)."""
    from datasets import ClassLabel

    return {name: list(feature.names) for name, feature in dataset.features.items() if isinstance(feature, ClassLabel)}


def check_local_source(source: Path, tasks: Sequence[Task], *, calibration: bool) -> None:
    """Every split the tasks read has Parquet files under `source`; all missing ones are named at once."""
    if not source.is_dir():
        raise DataError(f"--source {source} is neither '{HUB}', '{FIXTURES}' nor a folder")
    missing = []
    for task in tasks:
        spec = task.dataset
        for split in (spec.eval_split, spec.calibration_split) if calibration else (spec.eval_split,):
            where = f"{spec.id}/{spec.config}/{split}"
            if where not in missing and not any((source / where).glob("*.parquet")):
                missing.append(where)
    if missing:
        raise DatasetError(
            f"{source} has no Parquet files for {len(missing)} split(s): {', '.join(missing)}; a local source is "
            "laid out as the Hub's Parquet export: <source>/<dataset id>/<config>/<split>/0000.parquet"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "no message"
