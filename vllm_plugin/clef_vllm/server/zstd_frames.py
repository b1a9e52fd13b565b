"""Where the first zstd frame of a body ends, read from its headers alone (RFC 8878, section 3.1.1).

zstandard's streaming decompressor runs on from one frame into the next and never says where a frame ends,
so the body's frame is delimited here: the frame header gives its own length, each block header gives the
length of the bytes after it and says whether it is the last block, and a 4-byte checksum may follow the
last one. Nothing is decompressed; the cost is a few operations per block of up to 128 KiB.
"""

from __future__ import annotations

from collections.abc import Callable

MAGIC = b"\x28\xb5\x2f\xfd"
_DICTIONARY_ID_BYTES = (0, 1, 2, 4)
_CONTENT_SIZE_BYTES = (0, 2, 4, 8)  # for flag 0 it is 1 byte when the frame is a single segment
_RLE_BLOCK, _RESERVED_BLOCK = 1, 3


class NotOneFrame(ValueError):
    """The bytes do not begin with a zstd frame whose headers can be followed."""


class FrameScanner:
    """Fed a body chunk by chunk; `feed` says how many bytes of each chunk still belong to the first frame."""

    def __init__(self) -> None:
        self.done = False
        self._checksum = False
        self._buffer = bytearray()
        self._collect = True  # gather the bytes of a header, or else skip the bytes of a block's content
        self._need = len(MAGIC) + 1  # the magic number and the frame header descriptor
        self._step: Callable[[], None] = self._on_frame_start

    def feed(self, data: bytes) -> int:
        """The number of leading bytes of `data` that are part of the frame; fewer than all once it ended."""
        position = 0
        while not self.done and position < len(data):
            take = min(self._need, len(data) - position)
            if self._collect:
                self._buffer += data[position : position + take]
            position += take
            self._need -= take
            while self._need == 0 and not self.done:
                self._step()
        return position

    def _next(self, need: int, collect: bool, step: Callable[[], None]) -> None:
        self._buffer.clear()
        self._need, self._collect, self._step = need, collect, step

    def _on_frame_start(self) -> None:
        if bytes(self._buffer[:4]) != MAGIC:
            raise NotOneFrame("not a zstd frame")
        descriptor = self._buffer[4]
        if descriptor & 0x08:
            raise NotOneFrame("reserved bit set in the zstd frame header")
        single_segment = bool(descriptor & 0x20)
        self._checksum = bool(descriptor & 0x04)
        content_size = _CONTENT_SIZE_BYTES[descriptor >> 6] or (1 if single_segment else 0)
        rest = (0 if single_segment else 1) + _DICTIONARY_ID_BYTES[descriptor & 0x03] + content_size
        self._next(rest, False, self._on_block_header_next)

    def _on_block_header_next(self) -> None:
        self._next(3, True, self._on_block_header)

    def _on_block_header(self) -> None:
        header = int.from_bytes(self._buffer, "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == _RESERVED_BLOCK:
            raise NotOneFrame("reserved block type in the zstd frame")
        after = self._on_last_block if last else self._on_block_header_next
        self._next(1 if kind == _RLE_BLOCK else size, False, after)

    def _on_last_block(self) -> None:
        self._next(4 if self._checksum else 0, False, self._on_frame_end)

    def _on_frame_end(self) -> None:
        self.done = True
