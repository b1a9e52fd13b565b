"""`clef_quant.json`: what a quantized release was made from and how, and the sha256 of every file in it.

The manifest is written last, after every other file is in place, and lists every file of the folder except
itself. `verify_manifest` re-hashes the folder and names each file that is missing, changed or unlisted.
Hashing runs on a thread pool: hashlib releases the GIL on large buffers, so a 10 GB release hashes at disk
speed rather than one core's.

`Manifest` (`clef_vllm.format.manifest`, where the server reads it too) is the one shape of the file: `quantize` builds
it, `card` extends it, and every reader takes its attributes. Reading validates it (pydantic): a file that does
not parse, or whose `files` map is not `{relative path: {"sha256": 64 hex, "size": int}}`, is a `ManifestError`
with one line saying where, never a traceback deep in a later step. Paths must stay inside the folder (no
absolute paths, no `..`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.documents import parse_json
from clef_quant.release_folder.atomic import write_json_atomic
from clef_quant.release_folder.versions import tool_versions
from clef_vllm.format.manifest import CARD_SECTION as CARD_SECTION
from clef_vllm.format.manifest import MANIFEST_FILE as MANIFEST_FILE
from clef_vllm.format.manifest import MANIFEST_FORMAT as MANIFEST_FORMAT
from clef_vllm.format.manifest import CalibrationEntry as CalibrationEntry
from clef_vllm.format.manifest import CardEntry as CardEntry
from clef_vllm.format.manifest import CardResultsEntry as CardResultsEntry
from clef_vllm.format.manifest import FileEntry as FileEntry
from clef_vllm.format.manifest import IncludedEntry as IncludedEntry
from clef_vllm.format.manifest import Manifest as Manifest
from clef_vllm.format.manifest import ManifestError as ManifestError
from clef_vllm.format.manifest import RecipeEntry as RecipeEntry
from clef_vllm.format.manifest import RunEntry as RunEntry
from clef_vllm.format.manifest import SourceEntry as SourceEntry
from clef_vllm.format.manifest import validated

CHUNK = 16 * 1024 * 1024
HASH_THREADS = min(8, os.cpu_count() or 1)

# What `card` adds to a release and owns there (it replaces these paths whole when run again): the card, its plots,
# and trees of this repository that travel with every release, so it serves (clef-vllm) and reproduces (scripts)
# alone. Their files are in the manifest like every other file; fingerprints of what a model answers leave them out.
CARD_FILE = "README.md"
ASSETS_DIR = "assets"
COPIED_TREES = (shipped.VLLM_PLUGIN, shipped.SCRIPTS)
CARD_OWNED_PATHS = (CARD_FILE, ASSETS_DIR, *COPIED_TREES)


def is_card_owned(name: str) -> bool:
    """True for a folder-relative POSIX path that `card` writes (and may replace)."""
    top = name.split("/", 1)[0]
    return name == CARD_FILE or (top in CARD_OWNED_PATHS and top != CARD_FILE and "/" in name)


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


def not_regular(folder: Path) -> dict[str, str]:
    """`{relative path: what it is}` for every entry under `folder` that is neither a regular file nor a folder: a
    symlink (to a file or a folder; linked folders are not entered), a named pipe, a socket, a device. A release
    holds regular files only: a link would make readers (and an upload) read whatever it points at, which no
    manifest hash covers, and a pipe or a device blocks or streams whatever its other end writes."""
    folder = Path(folder)
    found = {}
    for parent, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = Path(parent) / name
            if path.is_symlink():
                found[path.relative_to(folder).as_posix()] = f"a symlink (to {os.readlink(path)})"
            elif not (path.is_dir() or stat.S_ISREG(path.lstat().st_mode)):
                found[path.relative_to(folder).as_posix()] = _kind_of(path.lstat().st_mode)
    return dict(sorted(found.items()))


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def hash_files(
    folder: Path,
    names: Iterable[str],
    on_done: Callable[[str], None] | None = None,
    hashed: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """`{name: {"sha256", "size"}}` for files of `folder`, hashed in parallel; `hashed` holds entries of files
    already hashed as they were written, taken as they are."""
    names = list(names)
    known = dict(hashed or {})

    def one(name: str) -> tuple[str, dict[str, Any]]:
        path = folder / name
        entry = known.get(name) or {"sha256": sha256_file(path), "size": path.stat().st_size}
        if on_done is not None:
            on_done(name)
        return name, entry

    pool = ThreadPoolExecutor(max_workers=HASH_THREADS)
    try:
        return dict(pool.map(one, names))
    except BaseException:
        # Ctrl-C must not wait for every queued file of a 20 GB folder to be hashed before cleanup runs.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def build_manifest(
    folder: Path,
    *,
    source: Mapping[str, Any],
    scheme: str,
    recipe: Mapping[str, Any],
    calibration: Mapping[str, Any],
    run: Mapping[str, Any],
    included: list[dict[str, str]] | None = None,
    exclude: Iterable[str] = (),
    on_hashed: Callable[[str], None] | None = None,
    hashed: Mapping[str, dict[str, Any]] | None = None,
) -> Manifest:
    """The manifest of a complete folder (everything but the manifest must already be written); `exclude`
    names files that are not part of the release (the writer marker); `hashed` holds entries computed while the
    files were written (see `hash_files`)."""
    skipped = set(exclude)
    data = {
        "format": MANIFEST_FORMAT,
        "source": source,
        "scheme": scheme,
        "recipe": recipe,
        "tools": tool_versions(),
        "calibration": calibration,
        "run": run,
        "included": list(included or []),
        "files": hash_files(folder, [f for f in folder_files(folder) if f not in skipped], on_hashed, hashed),
    }
    return validated(data, f"refusing to write an invalid {MANIFEST_FILE}")


def write_manifest(folder: Path, manifest: Manifest | Mapping[str, Any]) -> Path:
    """Validate `manifest` and write it atomically, mode 0644; a manifest that would not read back is never written."""
    if not isinstance(manifest, Manifest):
        manifest = validated(manifest, f"refusing to write an invalid {MANIFEST_FILE}")
    path = Path(folder) / MANIFEST_FILE
    write_json_atomic(path, manifest.to_json())
    return path


def parse_manifest(text: str, where: str = MANIFEST_FILE) -> Manifest:
    """Validate a manifest's text, or raise ManifestError in one line."""
    data = parse_json(text, where=where, error=ManifestError)
    if not isinstance(data, dict):
        raise ManifestError(f"{where} is not a manifest: a JSON {type(data).__name__}, not an object")
    return validated(data, f"{where} is not a valid manifest")


def read_manifest(folder: Path) -> Manifest | None:
    """The validated manifest of `folder`, or None when it has none; ManifestError when it is broken."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from None
    return parse_manifest(text, str(path))


def is_shipped_recipe(recipe: RecipeEntry) -> bool:
    """True for the recipe a `--scheme` ships with clef-quant."""
    if recipe.shipped is not None:
        return recipe.shipped
    # Older manifests recorded only the path: a shipped recipe's resolves into clef-quant's recipes/ folder.
    return shipped.display(Path(recipe.file)).startswith(f"{shipped.RECIPES}/")


@dataclass(frozen=True)
class FileProblem:
    file: str
    problem: str  # "missing", "sha256 mismatch", "size mismatch", "not in manifest"

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


def verify_manifest(folder: Path, manifest: Manifest | None = None) -> list[FileProblem]:
    """Every difference between the folder and its manifest; empty when all hashes match."""
    folder = Path(folder)
    manifest = manifest if manifest is not None else read_manifest(folder)
    if manifest is None:
        return [FileProblem(MANIFEST_FILE, "missing")]
    listed = manifest.files
    present = set(folder_files(folder))
    problems = [FileProblem(name, "missing") for name in sorted(listed.keys() - present)]
    problems += [FileProblem(name, "not in manifest") for name in sorted(present - listed.keys())]
    to_hash = sorted(listed.keys() & present)
    # A size difference settles it without reading the file.
    same_size = []
    for name in to_hash:
        if (folder / name).stat().st_size != listed[name].size:
            problems.append(FileProblem(name, "size mismatch"))
        else:
            same_size.append(name)
    hashes = hash_files(folder, same_size)
    problems += [
        FileProblem(name, "sha256 mismatch") for name in same_size if hashes[name]["sha256"] != listed[name].sha256
    ]
    return sorted(problems, key=lambda p: p.file)
