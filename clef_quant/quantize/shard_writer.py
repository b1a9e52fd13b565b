"""Write quantized shards in the background and hash each one right after it is written.

The manifest needs every file's sha256; hashing a 10 GB backbone after saving it was a fifth of a quantize run.
Here a writer thread saves each shard with safetensors' `save_file`, which writes straight from the tensors'
memory (no serialized copy of the shard), and a hasher thread then reads the file back while it is still in the
page cache. Both run while the caller quantizes the next shard, so the hash costs only the last shard's. At most
one shard waits to be written besides the one being quantized (`submit` blocks until the previous write is
done), which keeps memory to a few shards.
"""

from __future__ import annotations

import contextlib
import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from clef_quant.quantize.output_errors import shard_write_error

# The hash buffer is resident for the whole run: at 64 MiB it was most of what streaming a small model added to
# memory. sha256 reads as fast from 4 MiB chunks, and a cancelled hash stops within one.
CHUNK_BYTES = 4 * 2**20


class WriteCancelled(Exception):
    """The run stopped (an error or a signal) while a shard was being hashed."""


class HashingShardWriter:
    """`submit(name, tensors)` writes `folder/name` in the background; `close()` returns the manifest entries."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._cancelled = False
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-write")
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-hash")
        self._pending: Future[None] | None = None
        self._hashes: dict[str, Future[dict[str, Any]]] = {}

    def submit(self, name: str, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
        """Queue one shard (tensors on any device; they are copied to the host one by one as they are written);
        waits for the previous write first (and raises what it raised)."""
        self._wait()
        self._pending = self._writer.submit(self._write, name, tensors, metadata)

    def close(self) -> dict[str, dict[str, Any]]:
        """Wait for the last write and every hash; `{name: {"sha256", "size"}}` of every shard written."""
        self._wait()
        entries = {name: digest.result() for name, digest in self._hashes.items()}
        self._shutdown()
        return entries

    def cancel(self) -> None:
        """Stop hashing at the next chunk and wait for the write in flight (`save_file` cannot be stopped
        part way), so nothing writes into a folder being removed."""
        self._cancelled = True
        pending, self._pending = self._pending, None
        # The error already raised is the one to report; the background work's own end does not matter.
        with contextlib.suppress(Exception):
            if pending is not None:
                pending.result()
        self._shutdown()

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._hasher.shutdown(wait=True)

    def _write(self, name: str, tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        if self._cancelled:
            raise WriteCancelled(name)
        path = self.folder / name
        try:
            save_file(tensors, path, metadata=metadata)
        except SafetensorError as exc:  # a full disk, in safetensors' words and without the file's name
            raise shard_write_error(exc, path) from exc
        tensors.clear()  # the caller dropped its reference: this frees the shard now, not when the job is gone
        self._hashes[name] = self._hasher.submit(self._hash, path)

    def _hash(self, path: Path) -> dict[str, Any]:
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        with open(path, "rb", buffering=0) as handle:
            while read := handle.readinto(buffer):
                if self._cancelled:
                    raise WriteCancelled(path.name)
                digest.update(view[:read])  # hashlib releases the GIL on large buffers
                size += read
        return {"sha256": digest.hexdigest(), "size": size}
