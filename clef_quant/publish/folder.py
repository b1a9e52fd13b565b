"""What `card` adds to a quantized release folder, and how the manifest keeps covering every file.

`card` owns a fixed set of paths in DIR: `README.md`, `assets/` (the plots), `vllm_plugin/` (the clef-vllm
package source) and `scripts/`. Everything else was written by `quantize` and is never touched here.

The manifest stays the one list of the folder's files: the files `card` writes go into its `files` map with their
sha256 like every other file, so `inspect`'s manifest check and `upload`'s hash check cover them without knowing
about cards, and a `card` section records which files the card added, from which results, with which tools. A card
is rebuilt by running `card` again: the owned paths are replaced whole (stale plots do not linger) and their
manifest entries with them. Before that, the files `quantize` wrote must still match their hashes, so a card never
re-blesses a tampered folder.

The new files are first written into a sibling `DIR.card.partial` (claimed like any `.partial`, so two card runs on
one folder never undo each other, and removed on Ctrl-C or SIGTERM) and moved in only when complete; the manifest
is replaced atomically last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from clef_quant import shipped
from clef_quant.publish.errors import PublishError
from clef_quant.release_folder.manifest import (
    CARD_OWNED_PATHS,
    COPIED_TREES,
    MANIFEST_FILE,
    FileProblem,
    Manifest,
    hash_files,
    is_card_owned,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from clef_quant.release_folder.staged import scratch_folder

STAGING_SUFFIX = ".card.partial"

# What a user of the model repo needs of a copied tree to serve the folder; a tree not named here is copied whole.
# Of scripts/ only the CPU fix that `pip install ./vllm_plugin[cpu]` needs: the rest builds clef-quant's own
# development environment (from files a release does not hold) or runs its demo and fixtures.
SERVING_FILES = {shipped.SCRIPTS: ("patch_torchvision.py",)}

# Never part of a copied tree: build and cache leftovers that differ from machine to machine.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")


def require_manifest(folder: Path) -> Manifest:
    manifest = read_manifest(folder)
    if manifest is None:
        raise PublishError(f"{folder} has no {MANIFEST_FILE}: make it with clef-quant quantize")
    return manifest


def quantize_problems(folder: Path, manifest: Manifest) -> list[FileProblem]:
    """Differences between the folder and its manifest, leaving out the paths a card run replaces anyway."""
    return [p for p in verify_manifest(folder, manifest) if not is_card_owned(p.file)]


def tree_files(root: Path) -> list[str]:
    """Files of a source tree to copy, relative POSIX paths, sorted, without caches and build leftovers."""
    found = []
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.endswith(_SKIP_SUFFIXES) for part in parts):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(path.relative_to(root).as_posix())
    return sorted(found)


def copy_trees(staging: Path, trees: Iterable[str] = COPIED_TREES) -> list[str]:
    """Copy each shipped tree (only its SERVING_FILES, where named) into `staging`; returns the copied files
    (staging-relative)."""
    copied = []
    for tree in trees:
        with resources.as_file(shipped.folder(tree)) as source:
            if not source.is_dir():
                raise PublishError(f"cannot find {tree}/ in clef-quant's shipped data ({source}): reinstall clef-quant")
            for name in SERVING_FILES.get(tree) or tree_files(source):
                target = staging / tree / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / name, target)
                copied.append(f"{tree}/{name}")
    return copied


@contextmanager
def staging_dir(folder: Path) -> Iterator[Path]:
    """A freshly claimed sibling `DIR.card.partial`, removed whatever happens (its files are moved out on success)."""
    with scratch_folder(folder.with_name(folder.name + STAGING_SUFFIX), command="card") as staging:
        yield staging


def install_card_files(folder: Path, staging: Path, manifest: Manifest, card_section: dict[str, Any]) -> Manifest:
    """Replace the owned paths of `folder` with those in `staging`, then rewrite the manifest; returns it."""
    for owned in CARD_OWNED_PATHS:
        target = folder / owned
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    added = staged_card_files(staging)
    for owned in CARD_OWNED_PATHS:
        if (staging / owned).exists():
            os.replace(staging / owned, folder / owned)

    files: dict[str, Any] = {name: entry for name, entry in manifest.files.items() if not is_card_owned(name)}
    files.update(hash_files(folder, added))
    updated = manifest.with_card(files, {**card_section, "files": added})
    write_manifest(folder, updated)
    return updated


def staged_card_files(staging: Path) -> list[str]:
    """The card's files in `staging`, relative POSIX paths, sorted (the staging folder's writer marker is not one)."""
    return sorted(
        name
        for path in staging.rglob("*")
        if path.is_file() and is_card_owned(name := path.relative_to(staging).as_posix())
    )
