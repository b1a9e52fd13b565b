"""Reading a request body: the size cap, `Content-Encoding` and the strict JSON parse.

The cap applies to the bytes read and to the bytes they decompress to. Decompression is streamed chunk by
chunk with a bounded output, so a small compression bomb is refused (413) after at most the cap has been
produced, never held whole. A compressed body is one gzip member, one zlib/deflate stream or one zstd frame:
bytes after its end are refused (400 `trailing_data`) rather than ignored.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

from starlette.requests import Request

from clef_vllm.server.error_shape import ApiError
from clef_vllm.server.zstd_frames import FrameScanner, NotOneFrame

ENCODINGS = ("zstd", "gzip", "deflate")


class Decoder(Protocol):
    def feed(self, chunk: bytes, budget: int) -> bytes: ...

    def finish(self) -> None: ...


class TooLarge(Exception):
    pass


class TrailingData(Exception):
    pass


class EndsEarly(Exception):
    pass


class _Identity:
    def feed(self, chunk: bytes, budget: int) -> bytes:
        if len(chunk) > budget:
            raise TooLarge
        return chunk

    def finish(self) -> None:
        return None


class _Zlib:
    """gzip, and deflate as zlib-wrapped data (RFC 9110) or, as some clients send it, raw."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.inner: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        self.held = b""  # deflate's first byte, until the second one tells zlib-wrapped from raw

    def feed(self, chunk: bytes, budget: int) -> bytes:
        if self.inner is None:
            chunk, self.held = self.held + chunk, b""
            if len(chunk) < 2:
                self.held = chunk
                return b""
            zlib_header = chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
            self.inner = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        if self.inner.eof:
            raise TrailingData
        out = self.inner.decompress(chunk, budget + 1)
        if len(out) > budget or self.inner.unconsumed_tail:
            raise TooLarge
        if self.inner.unused_data:  # a second gzip member, or anything else, after the end of the stream
            raise TrailingData
        return out

    def finish(self) -> None:
        if self.inner is None or not self.inner.eof:
            raise EndsEarly


class _Zstd:
    """One zstd frame; the scanner finds its end, since zstandard's writer would decode any frame after it."""

    def __init__(self) -> None:
        import zstandard

        self.parts: list[bytes] = []
        self.budget = 0
        self.frame = FrameScanner()
        self.writer = zstandard.ZstdDecompressor().stream_writer(self, write_return_read=True)

    def write(self, data: bytes) -> int:  # called by zstandard with each piece of output
        if len(data) > self.budget:
            raise TooLarge
        self.budget -= len(data)
        self.parts.append(bytes(data))
        return len(data)

    def feed(self, chunk: bytes, budget: int) -> bytes:
        self.budget = budget
        inside = self.frame.feed(chunk)
        self.writer.write(chunk if inside == len(chunk) else chunk[:inside])
        if inside < len(chunk):
            raise TrailingData
        out = b"".join(self.parts)
        self.parts.clear()
        return out

    def finish(self) -> None:
        self.writer.flush()
        if not self.frame.done:
            raise EndsEarly


def _decode_errors() -> tuple[type[Exception], ...]:
    import zstandard

    return (zlib.error, zstandard.ZstdError, NotOneFrame, EndsEarly)


def decoder_for(header: str | None) -> Decoder:
    encoding = (header or "identity").strip().lower()
    if encoding in ("", "identity"):
        return _Identity()
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Zlib("gzip" if encoding == "x-gzip" else encoding)
    if encoding == "zstd":
        return _Zstd()
    raise ApiError(
        415,
        "unsupported_content_encoding",
        f"Content-Encoding {encoding[:40]!r} is not supported; use one of {', '.join(ENCODINGS)} or none",
        "Content-Encoding",
    )


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"request body exceeds {limit} bytes, as sent or after decompression",
        None,
        {"Connection": "close"},
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The decompressed body, at most `limit` bytes read and at most `limit` produced; raises `ApiError`
    413/415/400.

    Raises `starlette.requests.ClientDisconnect` when the client leaves mid-upload (nothing is kept).
    """
    decoder = decoder_for(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = read = 0
    try:
        async for chunk in request.stream():
            if chunk:
                read += len(chunk)
                if read > limit:
                    raise TooLarge
                out = decoder.feed(chunk, limit - size)
                size += len(out)
                parts.append(out)
        decoder.finish()
    except TooLarge:
        raise too_large(limit) from None
    except TrailingData:
        encoding = request.headers.get("content-encoding", "").strip().lower()
        message = f"body has data after the end of its {encoding} stream; send one {encoding} stream per body"
        raise ApiError(400, "trailing_data", message, "Content-Encoding", {"Connection": "close"}) from None
    except _decode_errors():
        encoding = request.headers.get("content-encoding", "").strip().lower()
        message = f"body is not valid {encoding} data"
        raise ApiError(400, "invalid_content_encoding", message, "Content-Encoding") from None
    return b"".join(parts)
