"""A write of `quantize`'s output that fails (a full disk, a quota, a read-only file system) as one line naming it.

Everything goes into `OUT.partial`, which `staged_folder` removes on any error, so what is left to do here is
saying what failed. Failures come as OSError from Python's own writes (with the file where Python knew it) and
as safetensors' own exception type from `save_file`, whose message carries the OS error as `(os error N)`; the
shard writer turns that into an OSError naming the shard (`shard_write_error`). An OSError that is not about the
output (a source file that cannot be read) is left as it is: it is not this module's to word.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_quant.quantize.errors import QuantizeError
from clef_quant.release_folder.writer import partial_of

# Errors that only a write gives, wherever Python left the file name unset (a write or flush on an open file).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_SERIALIZING = "Error while serializing"


def shard_write_error(exc: Exception, path: Path) -> OSError:
    """safetensors' failure to write `path` as the OSError it reports in words."""
    found = _OS_ERROR.search(str(exc))
    if found is None:
        return OSError(errno.EIO, " ".join(str(exc).split()), str(path))
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(path))


def _within(path: str, folder: Path) -> str | None:
    """`path` relative to `folder` (`.` for the folder itself), or None when it is elsewhere."""
    try:
        return Path(path).absolute().relative_to(folder).as_posix()
    except ValueError:
        return None


@contextmanager
def output_write_errors(out: Path) -> Iterator[None]:
    """A failed write into `out` (staged as `OUT.partial`) ends in one line naming the file where known."""
    from safetensors import SafetensorError

    out = Path(out).expanduser().absolute()
    partial = partial_of(out)
    try:
        yield
    except OSError as exc:
        where = None
        for name in (exc.filename, exc.filename2):
            if name is not None and where is None:
                where = _within(os.fsdecode(name), partial) or _within(os.fsdecode(name), out)
        if where is None and not (exc.filename is None and exc.errno in WRITE_ERRNOS):
            raise
        target = out if where in (None, ".") else out / where
        raise QuantizeError(f"cannot write {target}: {exc.strerror or exc}") from None
    except SafetensorError as exc:
        # Reads of the source are checked and worded before this (source_shards); a failed save is what is left.
        if not str(exc).startswith(_SERIALIZING):
            raise
        reason = shard_write_error(exc, out).strerror
        raise QuantizeError(f"cannot write the quantized backbone into {out}: {reason}") from None
