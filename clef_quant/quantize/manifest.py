"""`clef_quant.json`: what a quantized release was made from and how, and the sha256 of every file in it.

The manifest is written last, after every other file is in place, and lists every file of the folder except
itself. `verify_manifest` re-hashes the folder and names each file that is missing, changed or unlisted.
Hashing runs on a thread pool: hashlib releases the GIL on large buffers, so a 10 GB release hashes at disk
speed rather than one core's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST_FILE = "clef_quant.json"
MANIFEST_FORMAT = "clef-quant-manifest/1"
CHUNK = 16 * 1024 * 1024
HASH_THREADS = min(8, os.cpu_count() or 1)

# Distributions whose versions decide the output.
TOOL_DISTRIBUTIONS = ("clef-quant", "clef-vllm", "llmcompressor", "compressed-tensors", "torch", "transformers")


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TOOL_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_files(folder: Path) -> list[str]:
    """Every regular file under `folder` as a POSIX relative path, sorted, the manifest itself excluded."""
    files = [
        path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file() and not path.is_symlink()
    ]
    return sorted(f for f in files if f != MANIFEST_FILE)


def hash_files(
    folder: Path, names: Iterable[str], on_done: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]]:
    """`{name: {"sha256", "size"}}` for files of `folder`, hashed in parallel."""
    names = list(names)

    def one(name: str) -> tuple[str, dict[str, Any]]:
        path = folder / name
        entry = {"sha256": sha256_file(path), "size": path.stat().st_size}
        if on_done is not None:
            on_done(name)
        return name, entry

    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        return dict(pool.map(one, names))


def build_manifest(
    folder: Path,
    *,
    source: dict[str, Any],
    scheme: str,
    recipe: dict[str, Any],
    calibration: dict[str, Any],
    run: dict[str, Any],
    on_hashed: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The manifest of a complete folder (everything but the manifest must already be written)."""
    return {
        "format": MANIFEST_FORMAT,
        "source": source,
        "scheme": scheme,
        "recipe": recipe,
        "tools": tool_versions(),
        "calibration": calibration,
        "run": run,
        "files": hash_files(folder, folder_files(folder), on_hashed),
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of `folder`, or None when it has none."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class FileProblem:
    file: str
    problem: str  # "missing", "sha256 mismatch", "size mismatch", "not in manifest"

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


def verify_manifest(folder: Path, manifest: dict[str, Any] | None = None) -> list[FileProblem]:
    """Every difference between the folder and its manifest; empty when all hashes match."""
    folder = Path(folder)
    manifest = manifest if manifest is not None else read_manifest(folder)
    if manifest is None:
        return [FileProblem(MANIFEST_FILE, "missing")]
    listed: dict[str, dict[str, Any]] = manifest.get("files") or {}
    present = set(folder_files(folder))
    problems = [FileProblem(name, "missing") for name in sorted(listed.keys() - present)]
    problems += [FileProblem(name, "not in manifest") for name in sorted(present - listed.keys())]
    to_hash = sorted(listed.keys() & present)
    # A size difference settles it without reading the file.
    same_size = []
    for name in to_hash:
        if (folder / name).stat().st_size != listed[name].get("size"):
            problems.append(FileProblem(name, "size mismatch"))
        else:
            same_size.append(name)
    hashes = hash_files(folder, same_size)
    problems += [
        FileProblem(name, "sha256 mismatch")
        for name in same_size
        if hashes[name]["sha256"] != listed[name].get("sha256")
    ]
    return sorted(problems, key=lambda p: p.file)
