"""Write serialized shards in the background and hash each one while it is written.

The manifest needs every file's sha256; hashing a 10 GB backbone after saving it was a fifth of a quantize run.
Here each shard's bytes are written and hashed by two threads at once while the caller quantizes the next shard,
so the hash costs nothing but the last shard's tail. At most one shard waits in memory besides the one being
quantized (`submit` blocks until the previous write is done), which keeps memory to a few shards.
"""

from __future__ import annotations

import contextlib
import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

CHUNK_BYTES = 64 * 2**20  # a cancelled write stops within one chunk


class WriteCancelled(Exception):
    """The run stopped (an error or a signal) while a shard was being written."""


class HashingShardWriter:
    """`submit(name, data)` writes `folder/name` in the background; `close()` returns the manifest entries."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.entries: dict[str, dict[str, Any]] = {}
        self._cancelled = False
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-write")
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-hash")
        self._pending: Future[None] | None = None

    def submit(self, name: str, data: bytes) -> None:
        """Queue one shard; waits for the previous one first (and raises what its write raised)."""
        self._wait()
        self._pending = self._writer.submit(self._write, name, data)

    def close(self) -> dict[str, dict[str, Any]]:
        """Wait for the last write; `{name: {"sha256", "size"}}` of every shard written."""
        self._wait()
        self._shutdown()
        return dict(self.entries)

    def cancel(self) -> None:
        """Stop the write in flight at its next chunk and wait for it, so nothing writes into a folder being
        removed."""
        self._cancelled = True
        pending, self._pending = self._pending, None
        if pending is not None:
            # The error already raised is the one to report; this write's own end does not matter.
            with contextlib.suppress(Exception):
                pending.result()
        self._shutdown()

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._hasher.shutdown(wait=True)

    def _write(self, name: str, data: bytes) -> None:
        view = memoryview(data)
        digest = self._hasher.submit(_sha256, view)  # hashlib releases the GIL on large buffers
        with open(self.folder / name, "wb") as handle:
            for start in range(0, len(view), CHUNK_BYTES):
                if self._cancelled:
                    raise WriteCancelled(name)
                handle.write(view[start : start + CHUNK_BYTES])
        self.entries[name] = {"sha256": digest.result(), "size": len(view)}


def _sha256(view: memoryview) -> str:
    return hashlib.sha256(view).hexdigest()
