"""DATA folders: evaluation and calibration records built from the task files, and reading them back.

Rows come from `datasets.load_dataset`, always: with the real Hub ids (`source="hub"`, the revision a task file
names, e.g. the Parquet export of script datasets), or with the `parquet` builder pointed at a local copy laid
out as the Hub's Parquet export (`<source>/<dataset id>/<config>/<split>/*.parquet`, as `eval/fixtures/` is;
`source="fixtures"` names that shipped copy wherever clef-quant is installed).

Sampling is deterministic: each task and split has its own `random.Random` seeded from text (stable across Python
processes, unlike `hash()`), rows are visited in that shuffled order and the first valid ones are kept, then
written in dataset order. Evaluation records come from the held-out split, calibration records from the training
split; a calibration row whose state equals an evaluation record's state (datasets repeat texts across splits)
is skipped, so the two sets never overlap in content either.

A DATA folder:
    eval/<task>.jsonl     {"id", "task", "request", "gold"} per line; gold maps question id -> option id
    calibration.jsonl     plain SystemOne requests (with "id"), for `clef-quant quantize --calibration`
    summary.json          counts, lengths, seed, source, task file hashes
It is written as DATA.partial and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.evaluation.errors import DataError, DatasetError, RowError, TaskFileError
from clef_quant.evaluation.tasks import LabelNames, Task, check_gold, gold_index
from clef_vllm.encoding import DEFAULT_MAX_LENGTH, Tokenizer, encode_request, render
from clef_vllm.errors import RequestError
from clef_vllm.request import ClefRequest, parse_request

HUB = "hub"
FIXTURES = "fixtures"  # the synthetic rows shipped with clef-quant (eval/fixtures/)
DATA_FORMAT = "clef-quant-eval-data/1"
EVAL_DIR = "eval"
CALIBRATION_FILE = "calibration.jsonl"
SUMMARY_FILE = "summary.json"
DEFAULT_PER_TASK = 200
DEFAULT_CALIBRATION = 512
MAX_LISTED_PROBLEMS = 3


# -- reading datasets ------------------------------------------------------------------------------------------


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


def _check_local_source(source: Path, tasks: Sequence[Task], *, calibration: bool) -> None:
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


# -- building --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildConfig:
    out: Path
    per_task: int = DEFAULT_PER_TASK
    calibration: int = DEFAULT_CALIBRATION
    seed: int = 0
    source: str = HUB
    tokenizer: Path | None = None  # a release folder: lengths in tokens instead of characters
    overwrite: bool = False


@dataclass(frozen=True)
class Record:
    id: str
    task: str
    request: dict[str, Any]
    gold: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSample:
    task: Task
    eval_records: list[Record]
    calibration_records: list[Record]
    eval_rows: int  # rows in the eval split
    calibration_rows: int
    skipped: dict[str, int]  # reason -> rows skipped


@dataclass(frozen=True)
class BuildResult:
    out: Path
    summary: dict[str, Any]


def calibration_quotas(tasks: Sequence[Task], total: int) -> dict[str, int]:
    """`total` calibration records spread as evenly as possible, the remainder to the first tasks by name."""
    share, extra = divmod(total, len(tasks))
    return {task.name: share + (i < extra) for i, task in enumerate(tasks)}


def _shuffled(count: int, seed: int, task: str, split: str) -> list[int]:
    order = list(range(count))
    random.Random(f"clef-quant/{seed}/{task}/{split}").shuffle(order)
    return order


def _state_key(body: dict[str, Any]) -> str:
    return hashlib.sha256(render(body["state"]).encode("utf-8")).hexdigest()


def _draw(
    task: Task,
    dataset: Any,
    split: str,
    wanted: int,
    seed: int,
    *,
    with_gold: bool,
    exclude_states: set[str],
    skipped: dict[str, int],
) -> list[Record]:
    """The first `wanted` usable rows in the split's shuffled order, returned in dataset order."""
    names = label_names(dataset)
    chosen: list[tuple[int, Record]] = []
    first_problem = ""
    for index in _shuffled(len(dataset), seed, task.name, split):
        if len(chosen) == wanted:
            break
        record_id = f"{task.name}/{split}/{index}"
        try:
            body, gold = task.record(dataset[index], names, record_id)
        except RowError as exc:
            # Real splits hold a few rows a task cannot use (an ARC question with one choice, an unlabelled row).
            first_problem = first_problem or str(exc)
            _count(skipped, f"{split}: row does not fit the task")
            continue
        if _state_key(body) in exclude_states:
            _count(skipped, f"{split}: same state as an eval record")
            continue
        chosen.append((index, Record(record_id, task.name, body, gold if with_gold else {})))
    if not chosen and len(dataset) and first_problem:
        raise TaskFileError(f"no row of {task.dataset.id} {split} fits task {task.name}; the first: {first_problem}")
    return [record for _, record in sorted(chosen, key=lambda pair: pair[0])]


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def sample_task(
    task: Task, *, per_task: int, calibration: int, seed: int, source: str, exclude_states: set[str]
) -> TaskSample:
    """Evaluation and calibration records of one task; `exclude_states` grows with this task's eval states."""
    spec = task.dataset
    skipped: dict[str, int] = {}
    eval_set = load_split(task, spec.eval_split, source)
    eval_records = _draw(
        task, eval_set, spec.eval_split, per_task, seed, with_gold=True, exclude_states=set(), skipped=skipped
    )
    exclude_states.update(_state_key(r.request) for r in eval_records)
    calibration_records: list[Record] = []
    calibration_rows = 0
    if calibration > 0:
        train_set = load_split(task, spec.calibration_split, source)
        calibration_rows = len(train_set)
        calibration_records = _draw(
            task,
            train_set,
            spec.calibration_split,
            calibration,
            seed,
            with_gold=False,
            exclude_states=exclude_states,
            skipped=skipped,
        )
    return TaskSample(task, eval_records, calibration_records, len(eval_set), calibration_rows, skipped)


def _processor_for_media(records: Sequence[Record], tokenizer: Any) -> Any:
    """The processor of the tokenizer's folder, only when some record has images (it expands them)."""
    if not any(r.request.get("images") or r.request.get("videos") for r in records):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tokenizer.name_or_path)


def _lengths(records: Sequence[Record], tokenizer: Tokenizer | None) -> dict[str, Any]:
    """Prompt lengths in tokens (the real encoding, uncut) or, without a tokenizer, characters of state + questions."""
    if not records:
        return {}
    if tokenizer is not None:
        unit = "tokens"
        processor = _processor_for_media(records, tokenizer)
        values = [
            encode_request(parse_request(r.request), tokenizer, processor=processor, max_length=10**9).num_tokens
            for r in records
        ]
    else:
        unit = "characters (state + questions as JSON)"
        values = [len(render(r.request["state"])) + len(render(r.request["questions"])) for r in records]
    ordered = sorted(values)
    result: dict[str, Any] = {
        "unit": unit,
        "min": ordered[0],
        "mean": round(statistics.fmean(ordered), 1),
        "p50": ordered[len(ordered) // 2],
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "max": ordered[-1],
    }
    if tokenizer is not None:
        result["over_default_max_length"] = sum(v > DEFAULT_MAX_LENGTH for v in values)
    return result


def _write_jsonl(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def build_data(
    config: BuildConfig,
    tasks: Sequence[Task],
    on_task: Callable[[str, str], None] | None = None,
) -> BuildResult:
    """Sample every task, write DATA.partial and rename it to DATA. `on_task(task, stage)` reports progress."""
    if config.source == FIXTURES:
        # datasets opens the Parquet files itself, so it needs them as real files.
        with resources.as_file(shipped.fixtures()) as folder:
            return build_data(replace(config, source=str(folder)), tasks, on_task)
    if config.per_task < 1:
        raise DataError("--per-task must be at least 1")
    if config.calibration < 0:
        raise DataError("--calibration must be 0 or more")
    out = Path(config.out)
    if out.exists() and not config.overwrite:
        raise DataError(f"{out} already exists; pass --overwrite to replace it")
    if config.source != HUB:
        _check_local_source(Path(config.source), tasks, calibration=config.calibration > 0)
    tokenizer = None
    if config.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)

    notify = on_task or (lambda _task, _stage: None)
    quotas = calibration_quotas(tasks, config.calibration)
    exclude: set[str] = set()
    samples = []
    for task in tasks:
        notify(task.name, "sampling")
        samples.append(
            sample_task(
                task,
                per_task=config.per_task,
                calibration=quotas[task.name],
                seed=config.seed,
                source=config.source,
                exclude_states=exclude,
            )
        )
        notify(task.name, "done")

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / EVAL_DIR).mkdir(parents=True)
    summary_tasks = {}
    for sample in samples:
        spec = sample.task.dataset
        _write_jsonl(
            partial / EVAL_DIR / f"{sample.task.name}.jsonl",
            [{"id": r.id, "task": r.task, "request": r.request, "gold": r.gold} for r in sample.eval_records],
        )
        summary_tasks[sample.task.name] = {
            "title": sample.task.body.title,
            "task_file": {
                "path": shipped.display(sample.task.path),
                "version": sample.task.body.version,
                "sha256": sample.task.sha256,
            },
            "dataset": {"id": spec.id, "config": spec.config, "revision": spec.revision},
            "eval": {
                "split": spec.eval_split,
                "rows": sample.eval_rows,
                "records": len(sample.eval_records),
                "questions": sum(len(r.request["questions"]) for r in sample.eval_records),
                "lengths": _lengths(sample.eval_records, tokenizer),
            },
            "calibration": {
                "split": spec.calibration_split,
                "rows": sample.calibration_rows,
                "records": len(sample.calibration_records),
                "lengths": _lengths(sample.calibration_records, tokenizer),
            },
            "skipped": sample.skipped,
        }
    calibration = [r.request for sample in samples for r in sample.calibration_records]
    _write_jsonl(partial / CALIBRATION_FILE, calibration)
    summary = {
        "format": DATA_FORMAT,
        "created": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "source": config.source if config.source == HUB else shipped.display(Path(config.source)),
        "seed": config.seed,
        "per_task": config.per_task,
        "calibration_requested": config.calibration,
        "length_unit": "tokens" if tokenizer is not None else "characters",
        "tokenizer": str(config.tokenizer) if config.tokenizer else None,
        "counts": {
            "tasks": len(samples),
            "eval_records": sum(len(s.eval_records) for s in samples),
            "eval_questions": sum(t["eval"]["questions"] for t in summary_tasks.values()),
            "calibration_records": len(calibration),
        },
        "tasks": summary_tasks,
    }
    (partial / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return BuildResult(out=out, summary=summary)


# -- reading a DATA folder back --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation record of a DATA folder; `origin` is `file:line` for error messages."""

    id: str
    task: str
    body: dict[str, Any]
    request: ClefRequest
    gold: dict[str, str]
    gold_index: list[int]  # per question, in request order, the gold option's position in model order
    origin: str


@dataclass(frozen=True)
class EvalData:
    folder: Path
    records: list[EvalRecord]
    summary: dict[str, Any]
    files: dict[str, str]  # relative path -> sha256

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.records))


def _check_line(value: Any) -> tuple[str, str, dict[str, Any], ClefRequest, dict[str, str]]:
    if not isinstance(value, dict):
        raise DataError("a line must be a JSON object")
    missing = [key for key in ("id", "task", "request", "gold") if key not in value]
    if missing:
        raise DataError(f"missing {', '.join(missing)}")
    record_id, task, body, gold = value["id"], value["task"], value["request"], value["gold"]
    if not isinstance(record_id, str) or not record_id:
        raise DataError("id must be a non-empty string")
    if not isinstance(task, str) or not task:
        raise DataError("task must be a non-empty string")
    if not isinstance(gold, dict) or not all(isinstance(v, str) for v in gold.values()):
        raise DataError("gold must be an object of question id -> option id (strings)")
    try:
        request = parse_request(body)
    except RequestError as exc:
        raise DataError(f"request: {exc}") from None
    try:
        check_gold(request, gold)
    except TaskFileError as exc:
        raise DataError(str(exc)) from None
    return record_id, task, body, request, gold


def read_eval_data(folder: Path) -> EvalData:
    """Every evaluation record of a DATA folder, each line validated; all problems are reported together."""
    folder = Path(folder)
    eval_dir = folder / EVAL_DIR
    files = sorted(eval_dir.glob("*.jsonl")) if eval_dir.is_dir() else []
    if not files:
        raise DataError(f"{folder} holds no {EVAL_DIR}/*.jsonl; build it with: clef-quant build-data --out {folder}")
    summary_path = folder / SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{summary_path} is missing or not JSON ({type(exc).__name__})") from None

    records: list[EvalRecord] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for path in files:
        raw = path.read_bytes()
        hashes[f"{EVAL_DIR}/{path.name}"] = hashlib.sha256(raw).hexdigest()
        for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            origin = f"{path}:{number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{origin}: not JSON ({exc.msg})")
                continue
            try:
                record_id, task, body, request, gold = _check_line(value)
            except DataError as exc:
                problems.append(f"{origin}: {exc}")
                continue
            if record_id in seen:
                problems.append(f"{origin}: id {record_id!r} repeats {seen[record_id]}")
                continue
            seen[record_id] = origin
            records.append(EvalRecord(record_id, task, body, request, gold, gold_index(request, gold), origin))
    if problems:
        shown = "; ".join(problems[:MAX_LISTED_PROBLEMS])
        more = f" (and {len(problems) - MAX_LISTED_PROBLEMS} more)" if len(problems) > MAX_LISTED_PROBLEMS else ""
        raise DataError(f"{len(problems)} invalid line(s) in {folder}: {shown}{more}")
    return EvalData(folder=folder, records=records, summary=summary, files=hashes)
