"""A release's tokenizer and processor, loaded once, and the requests encoded with them.

Every front end (the offline engine, both servers, the transformers reference, eval, the benchmarks,
`clef-quant encode`) loads a release's encoder here, so they all read the same files the same way and encode
through `encode_request`. The processor only matters for images and videos: it is loaded when the first request
with media arrives, unless the caller asks for it up front (a server, whose threads then share it) or never
(media are off, and a request with media is refused as for a checkpoint without one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH, Encoding, Tokenizer, encode_request, prepare_request
from clef_vllm.format.limits import Limits
from clef_vllm.format.media import DEFAULT_MEDIA_LIMITS, MediaLimits
from clef_vllm.format.request import ClefRequest, parse_request


def load_tokenizer(model: str | Path) -> Any:
    """The release's tokenizer (a folder or a Hub id)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


def load_processor(model: str | Path) -> Any:
    """The release's processor: it expands image and video placeholders and returns the pixel inputs."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model))


class Encoder:
    """Encodes requests for one release, at `max_length` tokens unless a call says otherwise.

    `media`: True loads the processor now, False never, None (the default) with the first request that has media.
    `tokenizer`: one already loaded (an engine's own, or a wrapper around the release's) instead of loading it.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        media: bool | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.model = str(model)
        self.max_length = max_length
        self.tokenizer: Any = tokenizer if tokenizer is not None else load_tokenizer(model)
        self._media = media
        self._processor: Any = load_processor(model) if media else None

    @property
    def processor(self) -> Any:
        """The processor, loading it now if media are allowed and it has not been loaded; None when media are off."""
        if self._processor is None and self._media is None:
            self._processor = load_processor(self.model)
        return self._processor

    def processor_for(self, request: ClefRequest) -> Any:
        """What `encode_request` needs for `request`: the processor only when it has media."""
        return self.processor if request.has_media else None

    def encode(
        self,
        request: ClefRequest,
        *,
        max_length: int | None = None,
        media_limits: MediaLimits = DEFAULT_MEDIA_LIMITS,
    ) -> Encoding:
        """`request` as the release reads it (`encode_request`), with the processor when it has media."""
        return encode_request(
            request,
            self.tokenizer,
            processor=self.processor_for(request),
            max_length=self.max_length if max_length is None else max_length,
            media_limits=media_limits,
        )

    def prepare(
        self,
        body: Any,
        limits: Limits,
        parts: Mapping[str, bytes] | None = None,
        processor_lock: contextlib.AbstractContextManager[Any] | None = None,
    ) -> tuple[ClefRequest, Encoding]:
        """A request body checked against a server's `limits` and encoded (`prepare_request`)."""
        request = body if isinstance(body, ClefRequest) else parse_request(body, limits, parts)
        processor = self.processor_for(request)
        max_length = self.max_length
        return prepare_request(request, limits, self.tokenizer, processor, max_length, processor_lock=processor_lock)
