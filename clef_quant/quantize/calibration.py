"""Calibration records: SystemOne requests encoded exactly as serving encodes them.

Each record is a request body (one JSON object per line of a JSONL file; a line may also wrap the body as
`{"request": {...}}`, the shape evaluation data uses). It is validated with `parse_request` and encoded with
`encode_request` at the calibration length, so the token ids llm-compressor runs through the model are the ones
the server would run: same prompt pieces, same state cut. llm-compressor gets a DataLoader of those ids (one
record per batch, no padding), which skips its own tokenization.

Records with images or videos are skipped for now (the tiny default and the eval text tasks have none) and
counted in the summary; requests whose schema alone exceeds the calibration length are skipped and counted too.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.documents import parse_json_line
from clef_quant.formatting import first_few
from clef_quant.progress import NoProgress, Progress
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.task_names import ENCODING
from clef_vllm.errors import RequestError, SchemaTooLongError, not_valid_json
from clef_vllm.format.encoding import Tokenizer, encode_request
from clef_vllm.format.request import parse_request

# Shipped synthetic requests so the tiny flow runs offline; real data comes from the eval data builder.
DEFAULT_CALIBRATION_FILE = shipped.calibration_file()
DEFAULT_RECORDS = 512
DEFAULT_MAX_SEQ_LEN = 2048
SAMPLE_SEED = 0  # the records drawn from a larger file are the same on every run
MAX_LISTED_PROBLEMS = 3


@dataclass(frozen=True)
class CalibrationSummary:
    """What calibration saw; recorded in the manifest."""

    source: str | None  # the file given, "default:<path>" for the shipped file, None when not used
    sha256: str | None
    records: int
    tokens: int
    max_seq_len: int
    requested: int | None  # --calibration-records, if given
    available: int  # valid records in the file
    truncated: int  # records whose state was cut to fit max_seq_len
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    seed: int = SAMPLE_SEED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def unused(cls, max_seq_len: int) -> CalibrationSummary:
        """For schemes that need no data (FP8_DYNAMIC, NVFP4A16)."""
        return cls(None, None, 0, 0, max_seq_len, None, 0, 0)


@dataclass(frozen=True)
class CalibrationSet:
    input_ids: list[list[int]]
    summary: CalibrationSummary


def read_request_bodies(path: Path | Traversable) -> list[dict[str, Any]]:
    """The request bodies of a JSONL file; every broken line is reported at once, as one line."""
    return read_calibration_file(path)[0]


def read_calibration_file(path: Path | Traversable) -> tuple[list[dict[str, Any]], str]:
    """The request bodies of a JSONL file and the sha256 of the bytes they were parsed from (what a manifest or
    scan records must be what was used, not a later read of the file)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise QuantizeError(f"cannot read calibration file {path}: {exc.strerror}") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise QuantizeError(f"calibration file {not_valid_json(str(path), exc)}") from None
    bodies: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = parse_json_line(line, where=f"line {number}", error=QuantizeError)
        except QuantizeError as exc:
            problems.append(str(exc))
            continue
        if isinstance(value, dict) and "questions" not in value and isinstance(value.get("request"), dict):
            value = value["request"]
        try:
            parse_request(value)
        except RequestError as exc:
            problems.append(f"line {number}: {exc}")
            continue
        bodies.append(value)
    if problems:
        shown = first_few(problems, MAX_LISTED_PROBLEMS)
        raise QuantizeError(f"calibration file {path}: {len(problems)} invalid record(s): {shown}")
    if not bodies:
        raise QuantizeError(f"calibration file {path} holds no requests")
    return bodies, hashlib.sha256(raw).hexdigest()


def draw(count: int, requested: int | None) -> list[int]:
    """Indices of the records to use: all of them up to the request, else a fixed-seed sample in file order."""
    wanted = DEFAULT_RECORDS if requested is None else requested
    if wanted >= count:
        return list(range(count))
    return sorted(random.Random(SAMPLE_SEED).sample(range(count), wanted))


def check_calibration_settings(records: int | None, max_seq_len: int) -> None:
    """The one rule for `--calibration-records` and `--max-seq-len` (quantize, scan, bench quantize)."""
    if records is not None and records < 1:
        raise QuantizeError("--calibration-records must be at least 1")
    if max_seq_len < 1:
        raise QuantizeError("--max-seq-len must be at least 1")


def build_calibration(
    tokenizer: Tokenizer,
    *,
    file: Path | None = None,
    records: int | None = None,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    progress: Progress | None = None,
) -> CalibrationSet:
    """Encode the calibration records: from `file`, or from the shipped default file."""
    check_calibration_settings(records, max_seq_len)
    progress = progress or NoProgress()
    path: Path | Traversable = Path(file) if file is not None else DEFAULT_CALIBRATION_FILE
    bodies, file_sha256 = read_calibration_file(path)
    chosen = [bodies[i] for i in draw(len(bodies), records)]

    input_ids: list[list[int]] = []
    skipped: dict[str, int] = {}
    truncated = 0
    progress.start(ENCODING, len(chosen))
    for body in chosen:
        request = parse_request(body)
        progress.advance(ENCODING)
        if request.has_media:
            skipped["media"] = skipped.get("media", 0) + 1
            continue
        try:
            encoding = encode_request(request, tokenizer, max_length=max_seq_len)
        except SchemaTooLongError:
            skipped["schema longer than max_seq_len"] = skipped.get("schema longer than max_seq_len", 0) + 1
            continue
        truncated += encoding.truncated
        input_ids.append(encoding.input_ids)
    progress.finish(ENCODING)
    if not input_ids:
        reasons = ", ".join(f"{n} {why}" for why, n in skipped.items())
        raise QuantizeError(f"no usable calibration record in {path} ({reasons})")

    source = str(file) if file is not None else f"default:{shipped.display(path)}"
    summary = CalibrationSummary(
        source=source,
        sha256=file_sha256,
        records=len(input_ids),
        tokens=sum(len(ids) for ids in input_ids),
        max_seq_len=max_seq_len,
        requested=records,
        available=len(bodies),
        truncated=truncated,
        skipped=skipped,
    )
    return CalibrationSet(input_ids=input_ids, summary=summary)


def as_dataloader(calibration: CalibrationSet) -> Any:
    """A torch DataLoader of `{"input_ids", "attention_mask"}` batches of one record each, as llm-compressor takes."""
    import torch
    from torch.utils.data import DataLoader

    def one_record(ids: list[int]) -> dict[str, torch.Tensor]:
        tensor = torch.tensor([ids], dtype=torch.long)
        return {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}

    # batch_size=None: each item is already a batch of one; no padding ever enters the model.
    return DataLoader(calibration.input_ids, batch_size=None, shuffle=False, collate_fn=one_record)
