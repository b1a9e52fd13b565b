"""Per-record probabilities kept between eval runs, so a rerun with the same inputs scores nothing again.

One JSONL file per side (`RESULTS/probs/<side key>.jsonl`). The side key hashes what decides that side's numbers:
the model folder's content (the sha256 list of its `clef_quant.json` manifest, or the files themselves when it
has none), how it runs (transformers or the plugin, dtype, device, engine settings) and the versions of the
tools. Each line's key also hashes the record's encoding (token ids, question types and spans), so a changed
task file, tokenizer or maximum length is scored again while everything else is reused. Lines are appended
after every batch: an interrupted run keeps what it scored.

Every line carries two hashes, of what produced it and of its content, and nothing is reused that does not verify
(see `ProbabilityStore`): an edited, NaN, wrong-shape or torn line is scored again and reported, never averaged in.
The hashes are plain sha256 with no secret: they catch torn files and edits made by hand or by a tool that knows
nothing of them, not someone who can write the folder and recompute them. A key kept outside the folder would
also refuse every RESULTS folder moved to another machine (where `card` reads the stored probabilities), so the
limit is stated (docs/evaluate.md, `eval --help`) instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.evaluation.errors import DataError
from clef_quant.formatting import first_few
from clef_quant.release_folder import versions as release_versions
from clef_quant.release_folder.atomic import write_text_atomic
from clef_quant.release_folder.fingerprints import FolderFingerprint, json_digest
from clef_quant.release_folder.versions import SCORING_TOOLS
from clef_vllm.format.encoding import Encoding

# The versions that can change scores: side keys and results.json record them.
tool_versions = functools.partial(release_versions.tool_versions, SCORING_TOOLS)


def side_key(name: str, fingerprint: FolderFingerprint, settings: dict[str, Any]) -> str:
    """`<name>-<12 hex>`: readable in a listing, and new whenever the folder, settings or tool versions change."""
    digest = json_digest({"folder": fingerprint.sha256, "settings": settings, "tools": tool_versions()})
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "side"
    return f"{slug}-{digest[:12]}"


def record_key(side: str, encoding: Encoding) -> str:
    schema = encoding.schema()
    return json_digest(
        {
            "side": side,
            "input_ids": encoding.input_ids,
            "types": list(schema.question_types),
            "questions": [list(span) for span in schema.question_spans],
            "options": [[list(span) for span in spans] for spans in schema.option_spans],
            **({"media": _media_digest(encoding)} if encoding.media_inputs else {}),
        }
    )


def _media_digest(encoding: Encoding) -> str:
    """Images of the same size expand to the same ids; their pixels tell records apart."""
    digest = hashlib.sha256()
    for name in sorted(encoding.media_inputs):
        value = encoding.media_inputs[name]
        if hasattr(value, "numpy"):
            digest.update(name.encode())
            digest.update(value.float().numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class StoredRecord:
    key: str
    id: str
    task: str
    tokens: int
    seconds: float  # this record's share of its batch's model time
    probabilities: list[list[float]]  # per question, model order


# How far a stored distribution may sum from 1 (float32 softmax, rounded by JSON: ~1e-7).
SUM_TOLERANCE = 1e-3
SHOWN_IDS = 5  # ids of stored records that did not verify, named in results.json and on the terminal


@dataclass(frozen=True)
class Rejected:
    id: str  # the record id, or "line N" when the line is too broken to name one
    reason: str

    def __str__(self) -> str:
        return f"{self.id} ({self.reason})"


def producer_digest(key: str, producer: dict[str, Any]) -> str:
    """The hash of what produced a record's probabilities: the record (its key hashes the encoding), the model
    fingerprint and the engine settings."""
    return json_digest({"record": key, **producer})


def content_digest(entry: dict[str, Any]) -> str:
    """The hash of a stored line's content (id, task, tokens, seconds and the probabilities)."""
    return json_digest({name: entry.get(name) for name in ("key", "id", "task", "tokens", "seconds", "probs")})


def _check_distributions(probs: Any) -> str | None:
    """Why `probs` is not a list of probability distributions, or None."""
    if not isinstance(probs, list) or not probs:
        return "not a list of distributions"
    for row in probs:
        if not isinstance(row, list) or not row or not all(type(p) in (int, float) for p in row):
            return "not a list of distributions"
        if not all(math.isfinite(p) for p in row):
            return "NaN or infinite probability"
        if any(p < 0 or p > 1 for p in row) or abs(sum(row) - 1) > SUM_TOLERANCE:
            return "not a probability distribution"
    return None


_ID_FIELD = re.compile(r'"id":\s*"((?:[^"\\]|\\.)*)"')


def _torn_id(line: str) -> str | None:
    """The record id at the start of a torn line (lines begin with key and id), when it survived."""
    match = _ID_FIELD.search(line)
    if match is None:
        return None
    try:
        return str(json.loads(f'"{match.group(1)}"'))
    except json.JSONDecodeError:
        return None


def _parse_line(line: str, producer: dict[str, Any]) -> tuple[StoredRecord | None, Rejected | None]:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return None, None  # a torn line: named by its number
    if not isinstance(entry, dict):
        return None, None
    record_id = str(entry.get("id", "?"))
    try:
        record = StoredRecord(
            str(entry["key"]),
            str(entry["id"]),
            str(entry["task"]),
            int(entry["tokens"]),
            float(entry["seconds"]),
            entry["probs"],
        )
    except (KeyError, TypeError, ValueError):
        return None, Rejected(record_id, "fields missing")
    if entry.get("sha256") != content_digest(entry):
        return None, Rejected(record_id, "edited: content hash differs")
    if entry.get("made_by") != producer_digest(record.key, producer):
        return None, Rejected(record_id, "made by another model, record or settings")
    problem = _check_distributions(record.probabilities)
    if problem is not None:
        return None, Rejected(record_id, problem)
    return record, None


@dataclass(frozen=True)
class StoreLines:
    lines: list[tuple[str, StoredRecord]]  # every verified line with its record, in file order
    rejected: list[Rejected]
    ends_cleanly: bool  # False when the last line was cut short (no newline)


def read_store(path: Path, producer: dict[str, Any]) -> StoreLines:
    """Every line of a store file, verified against `producer` (what `ProbabilityStore` trusts); reads only.

    The one parser of the store format: the runner's `ProbabilityStore`, `load_results` and the card read through it.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines: list[tuple[str, StoredRecord]] = []
    rejected: list[Rejected] = []
    for number, line in enumerate(text.splitlines(), start=1):
        record, problem = _parse_line(line, producer)
        if record is None:
            if line.strip():
                rejected.append(problem or Rejected(_torn_id(line) or f"line {number}", "torn or not JSON"))
            continue
        lines.append((line, record))
    return StoreLines(lines, rejected, not text or text.endswith("\n"))


class ProbabilityStore:
    """The stored records of one side, each verified before it is trusted.

    A line is used only when its two hashes verify: `made_by` (the record, model fingerprint and engine settings
    that produced it, so a line of another model or setting never passes for this one) and `sha256` (its content,
    so an edited probability is caught); its probabilities must be finite distributions, and `get` checks their
    shape against the record's option counts. Everything else is dropped, listed in `rejected`, and scored again
    by the runner. On opening, a file holding rejected or torn lines is rewritten (atomically) with the good ones
    only, so the next append starts on a fresh line and never joins a torn tail.
    """

    def __init__(self, path: Path, producer: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.producer = producer or {}
        self.records: dict[str, StoredRecord] = {}
        self.rejected: list[Rejected] = []
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        read = read_store(self.path, self.producer)
        self.rejected.extend(read.rejected)
        good: dict[str, str] = {}
        for line, record in read.lines:
            good[record.key] = line  # a later line for the same record (a rescore) replaces the earlier
            self.records[record.key] = record
        if read.rejected or not read.ends_cleanly:
            self._rewrite(list(good.values()))

    def _rewrite(self, lines: list[str]) -> None:
        write_text_atomic(self.path, "".join(line + "\n" for line in lines))

    def get(self, key: str, option_counts: list[int] | None = None) -> StoredRecord | None:
        """The verified record under `key`; one whose shape differs from `option_counts` is rejected (None)."""
        record = self.records.get(key)
        if record is None or option_counts is None:
            return record
        if [len(row) for row in record.probabilities] != list(option_counts):
            del self.records[key]
            shape = [len(row) for row in record.probabilities]
            self.rejected.append(Rejected(record.id, f"wrong shape: {shape} options, expected {list(option_counts)}"))
            return None
        return record

    def add(self, records: list[StoredRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for record in records:
            entry: dict[str, Any] = {
                "key": record.key,
                "id": record.id,
                "task": record.task,
                "tokens": record.tokens,
                "seconds": record.seconds,
                "probs": record.probabilities,
            }
            problem = _check_distributions(record.probabilities)
            if problem is not None:  # a model that gives NaN must not leave it for the next run to trust
                raise DataError(f"record {record.id}: the model gave {problem}; nothing of it was stored")
            entry["made_by"] = producer_digest(record.key, self.producer)
            entry["sha256"] = content_digest(entry)
            lines.append(json.dumps(entry, separators=(",", ":")) + "\n")
            self.records[record.key] = record
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write("".join(lines))  # one write per batch: a kill tears at most the last line


def describe_rejected(rejected: list[Rejected]) -> str:
    """`N (id (why), ...)`: the count and the first few, for a report line."""
    return f"{len(rejected)}: {first_few(rejected, SHOWN_IDS, separator=', ')}"
