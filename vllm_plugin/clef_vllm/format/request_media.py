"""The images and videos of a SystemOne body as `MediaData`, in either wire form (a string or a `MediaObject`),
with multipart parts looked up and assets put in the order the prompt references them. Nothing is decoded here
(`clef_vllm.format.media` decodes while encoding); errors are `RequestError`s naming the item."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from clef_vllm.errors import RequestError
from clef_vllm.format.media import MediaData
from clef_vllm.format.wire_models import MediaObject

VideoData = MediaData | tuple[MediaData, ...]  # a video file, or frames already sampled


def media_data(
    item: str | MediaObject, where: str, parts: Mapping[str, bytes], kind: Literal["image", "video"]
) -> MediaData:
    """One image, video file or frame (an image), validated in either wire form."""
    if isinstance(item, str):
        return MediaData(where, item)
    if item.type is not None and item.type != kind:
        raise RequestError(f'{where} has type "{item.type}" where {kind} data belongs', f"{where}.type")
    sources = {
        name: source
        for name, source in (
            ("data", item.data),
            ("base64", item.base64_data),
            ("data_base64", item.data_base64),
            ("part", item.part),
        )
        if source is not None
    }
    if len(sources) != 1:
        raise RequestError(f"{where} needs exactly one of data, base64, data_base64 or part", where)
    media_type = item.media_type or item.content_type or item.format
    ((name, source),) = sources.items()
    if name != "part":
        return MediaData(where, source, media_type)
    if source not in parts:
        raise RequestError(f'{where} names part "{source[:60]}", which the multipart request does not have', where)
    return MediaData(where, parts[source], media_type)


def video_data(value: str | MediaObject | list[str | MediaObject], where: str, parts: Mapping[str, bytes]) -> VideoData:
    """One video: a file, or a list of frames (each an image)."""
    if isinstance(value, list):
        return tuple(media_data(frame, f"{where}[{j}]", parts, "image") for j, frame in enumerate(value))
    return media_data(value, where, parts, "video")


def asset_images(assets: dict[str, str | MediaObject], prompt: str, parts: Mapping[str, bytes]) -> list[MediaData]:
    """Assets as images, in the order their placeholders first appear in `prompt` (the prompt's text); the
    release has a single place for media (before the state), so the placeholders themselves stay in the text as
    written. Assets that no string references come after the referenced ones, in the order given."""

    def first_reference(name: str) -> tuple[int, int]:
        position = prompt.find(name) if name else -1
        return (0, position) if position >= 0 else (1, list(assets).index(name))

    order = sorted(assets, key=first_reference)
    return [media_data(assets[name], f"assets.{name}", parts, "image") for name in order]
