"""What identifies a release folder's content: one sha256 over its files' sha256s.

Results and stored probabilities are keyed on it, so a result is never shown for a folder it was not measured on.
A manifest's file hashes are trusted (`clef-quant inspect` checks them); a folder without one (an original bf16
release) has every file hashed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.release_folder.manifest import Manifest, folder_files, hash_files, is_card_owned, read_manifest


@dataclass(frozen=True)
class FolderFingerprint:
    sha256: str
    source: str  # "manifest" (hashes listed in clef_quant.json) or "files" (every file hashed now)
    scheme: str | None  # the manifest's scheme, when there is one


def json_digest(value: Any) -> str:
    """sha256 of `value` as canonical JSON (sorted keys, no spaces): equal values, equal digests."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def manifest_fingerprint(manifest: Manifest) -> str:
    """The hash of a manifest's file list, without the files `card` adds: a card, its plots and the copied
    sources change no answer, so writing one must not invalidate stored probabilities or results."""
    files = {name: entry.sha256 for name, entry in manifest.files.items() if not is_card_owned(name)}
    return json_digest(files)


def folder_fingerprint(folder: Path) -> FolderFingerprint:
    """The content hash of a release folder, from its manifest when it has one."""
    manifest = read_manifest(folder)
    if manifest is not None and manifest.files:
        return FolderFingerprint(manifest_fingerprint(manifest), "manifest", manifest.scheme)
    # No manifest: hash every file; a 19 GB folder takes ~10-20 s on a fast disk.
    hashed = hash_files(folder, folder_files(folder))
    return FolderFingerprint(json_digest({name: entry["sha256"] for name, entry in hashed.items()}), "files", None)
