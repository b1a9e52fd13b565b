"""A folder that is complete or absent: written as `OUT.partial`, renamed to `OUT` only when everything is in it.

`staged_folder` is the one way quantize, make-tiny and build-data write their output, and `scratch_folder` the
way card stages the files it moves into a release. Both claim their folder with a writer marker (see `writer`: a
folder another live run owns is never touched), turn SIGINT and SIGTERM into `Interrupted` while the block runs,
and remove the folder when the block raises anything. SIGKILL cannot be caught: its leftover is removed by the
next run, once its writer is provably gone.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_quant.release_folder.atomic import normalize_modes
from clef_quant.release_folder.signals import signals_ignored, signals_raise
from clef_quant.release_folder.writer import claim, partial_of, publish, remove_partial


@contextmanager
def staged_folder(out: Path, *, command: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield `OUT.partial` to write into; on success give every file 0644 and rename it to `OUT`.

    `OUT` must not exist unless `overwrite` (an old `OUT` is replaced only by a complete new one). `command`
    names the run in messages about a `.partial` in the way."""
    out = Path(out).expanduser().absolute()
    old: Path | None = None
    with _claimed(partial_of(out), command=command, out=out, overwrite=overwrite) as partial:
        yield partial
        normalize_modes(partial)
        # Both renames or neither: a signal between them would leave no OUT at all.
        with signals_ignored():
            old = publish(partial, out, overwrite)
    if old is not None:
        # OUT is complete already; the replaced release goes whole, so no half-deleted copy is left beside it.
        with signals_ignored():
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def scratch_folder(path: Path, *, command: str) -> Iterator[Path]:
    """Yield a freshly claimed folder at `path` that is removed when the block ends, whether it succeeds or not."""
    with _claimed(Path(path).expanduser().absolute(), command=command) as folder:
        yield folder
        with signals_ignored():
            remove_partial(folder)


@contextmanager
def _claimed(partial: Path, *, command: str, out: Path | None = None, overwrite: bool = False) -> Iterator[Path]:
    with signals_raise():
        # Claimed outside the cleanup below: a `.partial` that another live run owns must never be removed here.
        claim(partial, command=command, out=out, overwrite=overwrite)
        try:
            yield partial
        except BaseException:
            # A second Ctrl-C must not cut the cleanup short.
            with signals_ignored():
                remove_partial(partial)
            raise
