"""Where a command may put its output folder, and what `--overwrite` may replace there.

Each command that writes a folder recognises its own kind by one file every such folder holds at its top:
quantize a release (`clef_quant.json`), build-data a DATA folder (`summary.json`), make-tiny its random-weight
folder (`README.md` whose front matter carries make-tiny's mark: any model folder has a `config.json`, and a
release or a real checkpoint must never be replaced by random weights). `--overwrite` replaces an empty folder or
one of the command's own kind, never a regular file, a symlink or a folder of something else: a mistyped `--out`
must not cost a user their data. scan and eval write into their folder and resume there (scan's `--overwrite`
replaces only its own `scan.json`).

The place is checked before any work starts, by making (and removing) an empty folder there, so a path under a
regular file, on a read-only disk or in /proc fails at once with one line.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clef_quant.families import MAKE_TINY_MARK
from clef_quant.release_folder.errors import ReleaseFolderError
from clef_quant.release_folder.manifest import MANIFEST_FILE

# The front matter key of the card make-tiny writes ({"size", "seed"} of the run); `tiny/card.py` writes it.


@dataclass(frozen=True)
class OutputKind:
    what: str  # how messages name a folder of this kind
    marker: str  # the file at the top of every folder of this kind
    mark: str | None = None  # a key the marker's front matter must hold, where the file alone says too little

    def owns(self, folder: Path) -> bool:
        path = folder / self.marker
        if not path.is_file():
            return False
        if self.mark is None:
            return True
        from huggingface_hub.repocard import metadata_load

        try:
            return self.mark in (metadata_load(path) or {})
        except Exception:  # a card that does not parse carries no mark
            return False

    def missing(self) -> str:
        return f"it has no {self.marker}" if self.mark is None else f"its {self.marker} has no make-tiny mark"


OUTPUT_KINDS = {
    "make-tiny": OutputKind("folder make-tiny wrote", "README.md", MAKE_TINY_MARK),
    "quantize": OutputKind("quantized release", MANIFEST_FILE),
    "build-data": OutputKind("DATA folder", "summary.json"),
}


def check_output(out: Path, command: str, overwrite: bool) -> None:
    """Refuse, in one line, an `out` that `command` cannot create where it is or may not replace."""
    out = Path(out).expanduser().absolute()
    check_replaceable(out, command, overwrite)
    check_place(out)


def check_replaceable(out: Path, command: str, overwrite: bool) -> None:
    """An existing `out` needs `overwrite`, and even then must be empty or a folder of `command`'s own kind."""
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise ReleaseFolderError(f"{out} already exists; pass --overwrite to replace it")
    kind = OUTPUT_KINDS[command]
    if out.is_symlink() or not out.is_dir():
        raise ReleaseFolderError(f"{out} is not a folder; --overwrite replaces only a {kind.what}")
    if not kind.owns(out) and any(out.iterdir()):
        raise ReleaseFolderError(
            f"{out} is not a {kind.what} ({kind.missing()}); --overwrite replaces only a {kind.what}"
        )


def check_place(out: Path) -> None:
    """`out`'s nearest existing parent is a folder this process can create folders in."""
    parent = out.parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise ReleaseFolderError(f"cannot write {out}: {parent} is not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".clef-quant-probe-", dir=parent)
    except OSError as exc:
        raise ReleaseFolderError(f"cannot write {out}: cannot create a folder in {parent} ({exc.strerror})") from None
    os.rmdir(probe)


def check_output_folder(out: Path) -> None:
    """For a command that writes into its folder and resumes there (scan, eval): `out` is a folder or can be made."""
    out = Path(out).expanduser().absolute()
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise ReleaseFolderError(f"{out} is not a folder")
        return
    check_place(out)
