"""`clef-quant eval`: score a DATA folder with the bf16 reference and with every candidate through the plugin.

Sequence:
1. Read and validate every line of DATA (a bad line stops here with file:line, before any model loads).
2. Fingerprint each side's folder and encode every record with that side's tokenizer (a record too long for
   --max-model-len also stops here). Sides, in order: the reference (transformers, bf16: the release's own path),
   the noise floor (the same bf16 folder through the vLLM plugin) and each candidate (through the plugin).
3. For each side, look every record up in its probability store; score only the missing ones, one side at a time
   (one model in memory), task by task, appending to the store after every batch.
4. Compare each side with the reference per task and for All, with every metric of the registry.
The noise floor row tells quantization damage from what the serving engine alone changes.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from clef_quant.evaluation.data import EvalData, EvalRecord, read_eval_data
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.metrics import METRICS, QuestionObservation, RecordObservation, compute
from clef_quant.evaluation.store import (
    FolderFingerprint,
    ProbabilityStore,
    Rejected,
    StoredRecord,
    folder_fingerprint,
    record_key,
    side_key,
    tool_versions,
)
from clef_quant.quantize.progress import NoProgress, Progress
from clef_quant.release import resolve_release
from clef_vllm.answers import split_logits
from clef_vllm.encoding import DEFAULT_MAX_LENGTH, Encoding, encode_request
from clef_vllm.errors import CheckpointError, RequestError

RESULTS_FORMAT = "clef-quant-eval-results/1"
PROBS_DIR = "probs"
ALL = "All"
# Records handed to vLLM per call. vLLM forms its own batches inside a call (max_num_seqs); the chunk only sets how
# often progress moves and probabilities are saved.
PLUGIN_CHUNK = 256

Role = Literal["reference", "noise-floor", "candidate"]
REFERENCE_NAME = "bf16 reference"
NOISE_FLOOR_NAME = "noise floor (bf16 via plugin)"
SHOWN_REJECTED = 5  # ids of stored records that did not verify, named in results.json and on the terminal


class EngineProvider(Protocol):
    """Gives the runner a ClefEngine for a folder; `settings` (what changes the numbers) join the side key."""

    settings: dict[str, Any]

    def open(self, folder: Path) -> Any:
        """A context manager yielding a `ClefEngine` over `folder`."""


class FreshEngines:
    """One new ClefEngine per side, freed before the next starts, so two engines never share the memory."""

    def __init__(
        self, *, max_model_len: int = DEFAULT_MAX_LENGTH, batch_invariant: bool = True, **engine_kwargs: Any
    ) -> None:
        self.max_model_len = max_model_len
        # Part of the settings (and so of the side keys): probabilities of a batch-variant engine are other numbers.
        self.engine_kwargs = {"batch_invariant": batch_invariant, **engine_kwargs}
        self.settings = {
            "max_model_len": max_model_len,
            **{k: repr(v) for k, v in sorted(self.engine_kwargs.items())},
        }

    @contextmanager
    def open(self, folder: Path) -> Iterator[Any]:
        from clef_vllm.engine import ClefEngine

        holder = [ClefEngine(folder, max_model_len=self.max_model_len, **self.engine_kwargs)]
        try:
            yield holder[0]
        finally:
            holder[0].close()  # stop the engine core now, not whenever garbage collection gets to it
            holder.clear()
            gc.collect()


@dataclass(frozen=True)
class EvalConfig:
    reference: str  # bf16 release folder (or Hub id)
    candidates: Sequence[str]
    data: Path
    out: Path
    max_model_len: int = DEFAULT_MAX_LENGTH
    batch_size: int = 8  # reference forward batch
    device: str = "cpu"  # where the reference runs; the plugin runs where vLLM runs


@dataclass
class Side:
    key: str
    name: str
    role: Role
    runner: Literal["transformers", "plugin"]
    folder: Path
    fingerprint: FolderFingerprint
    settings: dict[str, Any]
    encodings: list[Encoding] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    scored: int = 0
    reused: int = 0
    seconds_scored: float = 0.0
    rejected: list[Rejected] = field(default_factory=list)  # stored lines that did not verify (scored again)

    def producer(self) -> dict[str, Any]:
        """What produces this side's probabilities, hashed into every stored line."""
        return {"model": self.fingerprint.sha256, "settings": self.settings}

    def option_counts(self, index: int) -> list[int]:
        return [len(options) for options in self.encodings[index].option_ids]


@dataclass(frozen=True)
class EvalRun:
    results: dict[str, Any]
    sides: list[Side]

    @property
    def scored(self) -> int:
        return sum(side.scored for side in self.sides)

    @property
    def reused(self) -> int:
        return sum(side.reused for side in self.sides)

    @property
    def rejected(self) -> int:
        return sum(len(side.rejected) for side in self.sides)


# -- scoring helpers (shared with `clef-quant bench throughput`) -----------------------------------------------


def probabilities(encoding: Encoding, logits: torch.Tensor) -> list[list[float]]:
    counts = [len(options) for options in encoding.option_ids]
    return [p.tolist() for p in split_logits(logits.float().cpu(), counts)]


def score_reference(
    scorer: Any, encodings: Sequence[Encoding], batch_size: int, on_batch: Callable[[int], None] | None = None
) -> list[tuple[list[list[float]], float]]:
    """Probabilities and seconds of each record through transformers; a batch's time is shared by its records."""
    out: list[tuple[list[list[float]], float]] = []
    for start in range(0, len(encodings), batch_size):
        batch = list(encodings[start : start + batch_size])
        began = time.perf_counter()
        logits = [x.float().cpu() for x in scorer.logits(batch)]  # .cpu() waits for the device
        seconds = (time.perf_counter() - began) / len(batch)
        out.extend((probabilities(e, x), seconds) for e, x in zip(batch, logits, strict=True))
        if on_batch is not None:
            on_batch(len(batch))
    return out


def score_plugin(
    engine: Any, encodings: Sequence[Encoding], chunk: int = PLUGIN_CHUNK, on_chunk: Callable[[int], None] | None = None
) -> list[tuple[list[list[float]], float]]:
    """Probabilities and seconds of each record through the vLLM plugin; a call's time is shared by its records."""
    out: list[tuple[list[list[float]], float]] = []
    for start in range(0, len(encodings), chunk):
        part = list(encodings[start : start + chunk])
        began = time.perf_counter()
        logits = engine.logits(part)
        seconds = (time.perf_counter() - began) / len(part)
        out.extend((probabilities(e, x), seconds) for e, x in zip(part, logits, strict=True))
        if on_chunk is not None:
            on_chunk(len(part))
    return out


# -- the run ---------------------------------------------------------------------------------------------------


def _fingerprint(source: str, progress: Progress) -> tuple[Path, FolderFingerprint]:
    folder = resolve_release(source)
    step = f"fingerprint {folder.name}"  # a bf16 folder without a manifest is hashed whole
    progress.start(step, None)
    fingerprint = folder_fingerprint(folder)
    progress.finish(step)
    return folder, fingerprint


def plan_sides(config: EvalConfig, engine_settings: dict[str, Any], progress: Progress | None = None) -> list[Side]:
    """Reference, noise floor and candidates with their keys; every folder is checked before anything loads."""
    progress = progress or NoProgress()
    if not config.candidates:
        raise DataError("give at least one --candidate folder")
    reference, reference_fp = _fingerprint(config.reference, progress)
    reference_settings = {
        "runner": "transformers",
        "dtype": "bfloat16",
        "device": config.device,
        "max_length": config.max_model_len,
    }
    plugin_settings = {"runner": "plugin", **engine_settings, "max_length": config.max_model_len}
    sides = [
        Side(
            side_key("reference", reference_fp, reference_settings),
            REFERENCE_NAME,
            "reference",
            "transformers",
            reference,
            reference_fp,
            reference_settings,
        ),
        Side(
            side_key(f"plugin-{reference.name}", reference_fp, plugin_settings),
            NOISE_FLOOR_NAME,
            "noise-floor",
            "plugin",
            reference,
            reference_fp,
            plugin_settings,
        ),
    ]
    names = {side.name for side in sides}
    for source in config.candidates:
        folder, fingerprint = _fingerprint(source, progress)
        if fingerprint.sha256 == reference_fp.sha256:
            raise DataError(f"candidate {source} is the reference itself; its plugin row is the noise floor already")
        key = side_key(f"plugin-{folder.name}", fingerprint, plugin_settings)
        if any(side.key == key for side in sides):
            raise DataError(f"candidate {source} is given twice")
        name = folder.name
        while name in names:
            name += "'"
        names.add(name)
        sides.append(Side(key, name, "candidate", "plugin", folder, fingerprint, plugin_settings))
    return sides


def _encode_all(side: Side, records: Sequence[EvalRecord], encode: Callable[[Any], Encoding]) -> None:
    problems = []
    for record in records:
        try:
            encoding = encode(record.request)
        except RequestError as exc:
            problems.append(f"{record.origin}: {exc}")
            continue
        side.encodings.append(encoding)
        side.keys.append(record_key(side.key, encoding))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DataError(
            f"{len(problems)} record(s) cannot be encoded for {side.folder}: {'; '.join(problems[:3])}{more}"
        )


def _by_task(records: Sequence[EvalRecord]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(record.task, []).append(index)
    return groups


def _score_side(
    side: Side,
    records: Sequence[EvalRecord],
    store: ProbabilityStore,
    score: Callable[[list[Encoding], Callable[[int], None]], list[tuple[list[list[float]], float]]],
    progress: Progress,
) -> None:
    """Score one side's missing records task by task; reused records complete their bar at once."""
    for task, indices in _by_task(records).items():
        bar = f"{side.name} · {task}"
        progress.start(bar, len(indices))
        missing = [i for i in indices if store.get(side.keys[i], side.option_counts(i)) is None]
        side.reused += len(indices) - len(missing)
        progress.advance(bar, len(indices) - len(missing))
        if missing:
            scored = score([side.encodings[i] for i in missing], lambda n, bar=bar: progress.advance(bar, n))
            store.add(
                [
                    StoredRecord(side.keys[i], records[i].id, task, side.encodings[i].num_tokens, seconds, probs)
                    for i, (probs, seconds) in zip(missing, scored, strict=True)
                ]
            )
            side.scored += len(missing)
            side.seconds_scored += sum(seconds for _, seconds in scored)
        progress.finish(bar)
    side.rejected = list(store.rejected)


def run_eval(
    config: EvalConfig,
    *,
    engines: EngineProvider | None = None,
    progress: Progress | None = None,
    data: EvalData | None = None,
) -> EvalRun:
    """Score, compare and return the results (the caller writes them with `report.write_results`).

    `data` is `read_eval_data(config.data)` when the caller has already read (and so validated) it.
    """
    from clef_quant.reference import ReferenceScorer

    progress = progress or NoProgress()
    if config.batch_size < 1:
        raise DataError("--batch-size must be at least 1")
    data = data or read_eval_data(config.data)
    engines = engines or FreshEngines(max_model_len=config.max_model_len)
    try:
        sides = plan_sides(config, engines.settings, progress)
    except CheckpointError as exc:
        raise DataError(str(exc)) from None

    scorer = ReferenceScorer(
        sides[0].folder, dtype=torch.bfloat16, device=config.device, max_length=config.max_model_len
    )  # loads the tokenizer now, the model on first use
    _encode_all(sides[0], data.records, scorer.encode)
    from transformers import AutoProcessor, AutoTokenizer

    tokenizers: dict[Path, Any] = {}
    with_media = any(record.request.has_media for record in data.records)
    for side in sides[1:]:
        if side.folder not in tokenizers:
            processor = AutoProcessor.from_pretrained(side.folder) if with_media else None
            tokenizers[side.folder] = (AutoTokenizer.from_pretrained(side.folder), processor)
        tokenizer, processor = tokenizers[side.folder]
        _encode_all(
            side,
            data.records,
            lambda request, t=tokenizer, p=processor: encode_request(
                request, t, processor=p, max_length=config.max_model_len
            ),
        )

    probs_dir = Path(config.out) / PROBS_DIR
    stores = {side.key: ProbabilityStore(probs_dir / f"{side.key}.jsonl", side.producer()) for side in sides}
    _score_side(sides[0], data.records, stores[sides[0].key], _reference_scoring(scorer, config.batch_size), progress)
    del scorer  # the backbone's memory goes back before any engine starts
    gc.collect()
    for side in sides[1:]:
        store = stores[side.key]
        if all(store.get(key, side.option_counts(i)) is not None for i, key in enumerate(side.keys)):
            _score_side(side, data.records, store, _never, progress)  # all reused: no engine starts
            continue
        with engines.open(side.folder) as engine:
            _score_side(side, data.records, store, _plugin_scoring(engine), progress)
        gc.collect()

    values = compare(sides, data, stores)
    return EvalRun(results=_results(config, data, sides, engines.settings, values), sides=sides)


def _reference_scoring(scorer: Any, batch_size: int) -> Callable[..., list[tuple[list[list[float]], float]]]:
    def score(encodings: list[Encoding], advance: Callable[[int], None]) -> list[tuple[list[list[float]], float]]:
        return score_reference(scorer, encodings, batch_size, advance)

    return score


def _plugin_scoring(engine: Any) -> Callable[..., list[tuple[list[list[float]], float]]]:
    def score(encodings: list[Encoding], advance: Callable[[int], None]) -> list[tuple[list[list[float]], float]]:
        return score_plugin(engine, encodings, on_chunk=advance)

    return score


def _never(encodings: list[Encoding], advance: Callable[[int], None]) -> list[tuple[list[list[float]], float]]:
    raise AssertionError("nothing should be scored here")


def compare(
    sides: Sequence[Side], data: EvalData, stores: dict[str, ProbabilityStore]
) -> dict[str, dict[str, dict[str, float]]]:
    """`{side key: {task or All: {metric: value}}}`, every side against the first (the reference)."""
    reference = [stores[sides[0].key].get(key) for key in sides[0].keys]
    values: dict[str, dict[str, dict[str, float]]] = {}
    for side in sides:
        stored = [stores[side.key].get(key) for key in side.keys]
        values[side.key] = compare_records(data.records, reference, stored)
    return values


def compare_records(
    records: Sequence[EvalRecord], reference: Sequence[StoredRecord | None], side: Sequence[StoredRecord | None]
) -> dict[str, dict[str, float]]:
    """Metrics per task and for All of one side's stored probabilities against the reference's."""
    questions: dict[str, list[QuestionObservation]] = {}
    timings: dict[str, list[RecordObservation]] = {}
    for record, ref, own in zip(records, reference, side, strict=True):
        if ref is None or own is None:
            raise RuntimeError(f"record {record.id} has no stored probabilities")
        for ref_p, own_p, gold in zip(ref.probabilities, own.probabilities, record.gold_index, strict=True):
            questions.setdefault(record.task, []).append(
                QuestionObservation(np.asarray(ref_p), np.asarray(own_p), gold)
            )
        timings.setdefault(record.task, []).append(RecordObservation(own.tokens, own.seconds))
    result = {task: compute(questions[task], timings[task]) for task in questions}
    result[ALL] = compute(
        [q for task in questions for q in questions[task]], [t for task in timings for t in timings[task]]
    )
    return result


def _results(
    config: EvalConfig,
    data: EvalData,
    sides: Sequence[Side],
    engine_settings: dict[str, Any],
    values: dict[str, dict[str, dict[str, float]]],
) -> dict[str, Any]:
    titles = {name: task.get("title", name) for name, task in (data.summary.get("tasks") or {}).items()}
    tasks = []
    for task, indices in _by_task(data.records).items():
        tasks.append(
            {
                "name": task,
                "title": titles.get(task, task),
                "records": len(indices),
                "questions": sum(len(data.records[i].request.questions) for i in indices),
            }
        )
    return {
        "format": RESULTS_FORMAT,
        "created": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "tools": tool_versions(),
        "config": {
            "reference": str(config.reference),
            "candidates": [str(c) for c in config.candidates],
            "max_model_len": config.max_model_len,
            "batch_size": config.batch_size,
            "reference_device": config.device,
            "engine": engine_settings,
        },
        "data": {"folder": str(data.folder), "files": data.files, "summary": data.summary},
        "tasks": tasks,
        "metrics": [
            {
                "name": m.name,
                "title": m.title,
                "description": m.description,
                "direction": m.direction,
                "level": m.level,
                "aggregation": m.aggregation,
                "compares_with_reference": m.compares,
            }
            for m in METRICS
        ],
        "sides": [
            {
                "key": side.key,
                "name": side.name,
                "role": side.role,
                "runner": side.runner,
                "folder": str(side.folder),
                "model_hash": {
                    "sha256": side.fingerprint.sha256,
                    "from": side.fingerprint.source,
                    "scheme": side.fingerprint.scheme,
                },
                "settings": side.settings,
                "records_scored": side.scored,
                "records_reused": side.reused,
                "records_rejected": len(side.rejected),
                "rejected": [str(r) for r in side.rejected[:SHOWN_REJECTED]],
                "seconds_scored": round(side.seconds_scored, 3),
                "probabilities": f"{PROBS_DIR}/{side.key}.jsonl",
            }
            for side in sides
        ],
        "values": {
            key: {task: {m: _json_number(v) for m, v in row.items()} for task, row in per_task.items()}
            for key, per_task in values.items()
        },
    }


def _json_number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value
