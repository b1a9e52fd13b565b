"""Decoding the images and videos of a request, with limits checked before anything large is decoded.

Images: PNG, JPEG, WebP or GIF (first frame), as RGB. The pixel count is read from the file header and
checked before the pixels are decoded, so a small file that would expand to a huge bitmap costs nothing.

Videos: MP4, WebM or MOV files decoded with PyAV (FFmpeg), or lists of frames taken as already sampled.
A file is sampled the way the checkpoint's video processor samples a file: its `sample_frames` picks frame
indices from the total frame count and the frame rate (Qwen3-VL / Qwen3.5: 2 frames per second, at least 4,
at most 768, evenly spread), and only those frames are kept while the file streams through the decoder.
Frame lists are described to the processor as frames sampled at its own rate, so their timestamps are the
ones a file sampled by it would get. Clef-Omni samples files its own way (`boundary_frames`) and reads every
frame at most `OMNI_FRAME_PIXELS` pixels (`cap_frame_pixels`).

Errors are `RequestError`s naming the item (`images[0]`, `videos[1]`, `assets.logo`).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clef_vllm.errors import RequestError

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
SAMPLED_FRAME_RATE = 2.0
MIN_VIDEO_FRAMES = 2  # one temporal patch of the vision tower
VIDEO_CONTAINERS = ("mov", "mp4", "webm", "matroska")  # FFmpeg demuxer names (MOV/MP4 share one)


@dataclass(frozen=True)
class MediaLimits:
    """Limits on one item, all checked before the item is decoded in full."""

    max_image_pixels: int = 4096 * 4096  # the processor's own ceiling for one image (longest_edge 16,777,216)
    max_video_frames: int = 768  # the Qwen3-VL video processor never samples more
    max_video_pixels: int = 1 << 26  # sampled frames x height x width per video (192 MiB of RGB)
    max_video_source_frames: int = 36_000  # frames decoded from one file (20 minutes at 30 fps)


DEFAULT_MEDIA_LIMITS = MediaLimits()


@dataclass(frozen=True)
class MediaData:
    """One image, video file or video frame as the request gave it; `where` names it in errors."""

    where: str
    data: str | bytes  # base64 text or a data: URL, or raw bytes (a multipart part)
    media_type: str | None = None


@dataclass(frozen=True)
class DecodedVideo:
    """Sampled RGB frames [frames, height, width, 3] and what the processor needs to place them in time."""

    frames: np.ndarray
    fps: float  # frame rate of the source the indices refer to
    total_num_frames: int
    frames_indices: list[int]
    has_soundtrack: bool = False  # a file with an audio stream (frame lists have none)

    def metadata(self) -> dict[str, Any]:
        """The processor's `video_metadata` (transformers and vLLM read the same keys); frames are presampled."""
        return {
            "fps": self.fps,
            "total_num_frames": self.total_num_frames,
            "duration": self.total_num_frames / self.fps,
            "frames_indices": list(self.frames_indices),
            "height": int(self.frames.shape[1]),
            "width": int(self.frames.shape[2]),
            "do_sample_frames": False,
        }


# (total_num_frames, fps) -> indices of the frames to keep, as the checkpoint's video processor picks them
FrameSampler = Callable[[int, float], Sequence[int]]


def boundary_frames(total_num_frames: int, fps: float, rate: float = SAMPLED_FRAME_RATE) -> list[int]:
    """Clef-Omni's sampling of a file: the first frame at or after each 1/`rate` second boundary (frame i shows at
    i / fps seconds), then the last one repeated to an even count, one temporal patch of the vision tower per two
    frames. The tolerance keeps a boundary that lands on a frame's time on that frame despite float rounding."""
    step = fps / rate
    indices = []
    index = 0
    while index < total_num_frames:
        indices.append(index)
        index = math.ceil(len(indices) * step - 1e-6)
    if len(indices) % 2:
        indices.append(indices[-1])
    return indices


# The most pixels Clef-Omni reads of one video frame (256 of the vision tower's merged 32 x 32 patches).
OMNI_FRAME_PIXELS = 256 * 32 * 32


def cap_frame_pixels(frames: np.ndarray, max_pixels: int = OMNI_FRAME_PIXELS) -> np.ndarray:
    """Frames [n, h, w, 3] (uint8) shrunk to at most about `max_pixels` each, as Clef-Omni reads them: the aspect
    kept, each side rounded to an even size, bilinear without antialiasing, rounded back to uint8. Smaller frames
    are returned as they are."""
    height, width = frames.shape[1:3]
    if height * width <= max_pixels:
        return frames
    import torch
    import torch.nn.functional as F

    scale = math.sqrt(max_pixels / (width * height))
    size = (max(2, round(height * scale / 2) * 2), max(2, round(width * scale / 2) * 2))
    channels_first = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    resized = F.interpolate(channels_first, size=size, mode="bilinear").round().to(torch.uint8)
    return resized.permute(0, 2, 3, 1).contiguous().numpy()


# Fields SDKs send audio clips in. The release format's media are images and videos; Clef-Omni's audio tower would
# hear a clip only as decoded and resampled by whatever backend vLLM finds installed, which nothing here can
# reproduce or check, so a clip is refused rather than left unheard.
AUDIO_FIELDS = ("audio", "audios")


def refuse_audio(body: dict[str, Any]) -> None:
    """A request body that carries an audio clip is a `RequestError` naming the field (null, "" or [] carry none)."""
    for name in AUDIO_FIELDS:
        if body.get(name) not in (None, [], ""):
            raise RequestError(f"{name}: audio is not read here; send images and videos only", name)


def raw_bytes(item: MediaData, what: str) -> bytes:
    """The bytes of an item: base64 (plain or in a data: URL) decoded, multipart bytes as they are."""
    if isinstance(item.data, bytes):
        return item.data
    text = item.data.strip()
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise RequestError(f"{item.where} is a data: URL without ';base64,' data", item.where)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{item.where} is not base64 {what} data or a data: URL", item.where) from None
    if not raw:
        raise RequestError(f"{item.where} is empty", item.where)
    return raw


def decode_image(item: MediaData, limits: MediaLimits = DEFAULT_MEDIA_LIMITS) -> Any:
    """An item as an RGB PIL image (a GIF's first frame)."""
    from PIL import Image, UnidentifiedImageError

    raw = raw_bytes(item, "image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)
        pixels = image.width * image.height
        if pixels > limits.max_image_pixels:
            raise RequestError(
                f"{item.where} is {image.width}x{image.height} pixels; at most {limits.max_image_pixels:,} "
                "pixels per image",
                item.where,
            )
        image.load()
        return image.convert("RGB")
    except Image.DecompressionBombError:
        raise RequestError(
            f"{item.where} is larger than {limits.max_image_pixels:,} pixels per image", item.where
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        raise RequestError(
            f"{item.where} is not a readable image (PNG, JPEG, WebP or GIF), or the file is cut short", item.where
        ) from None


def image_to_frame(item: MediaData, limits: MediaLimits) -> np.ndarray:
    return np.asarray(decode_image(item, limits))


def decode_frames(
    frames: Sequence[MediaData], where: str, limits: MediaLimits, frame_rate: float = SAMPLED_FRAME_RATE
) -> DecodedVideo:
    """A list of frames taken as already sampled at `frame_rate` (the processor's rate)."""
    if len(frames) < MIN_VIDEO_FRAMES:
        raise RequestError(f"{where} has {len(frames)} frames; a video needs at least {MIN_VIDEO_FRAMES}", where)
    if len(frames) > limits.max_video_frames:
        raise RequestError(f"{where} has {len(frames)} frames; at most {limits.max_video_frames}", where)
    decoded = [image_to_frame(frame, limits) for frame in frames]
    if len({f.shape for f in decoded}) != 1:
        raise RequestError(f"{where}: all frames of a video must have the same size", where)
    _check_video_pixels(where, len(decoded), decoded[0].shape[0], decoded[0].shape[1], limits)
    return DecodedVideo(np.stack(decoded), frame_rate, len(decoded), list(range(len(decoded))))


def decode_video(item: MediaData, sampler: FrameSampler, limits: MediaLimits = DEFAULT_MEDIA_LIMITS) -> DecodedVideo:
    """A video file decoded and sampled by `sampler`; nothing but the sampled frames is kept."""
    import av

    raw = raw_bytes(item, "video")
    where = item.where
    unreadable = f"{where} is not a readable video (MP4, WebM or MOV), or the file is cut short"
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not set(container.format.name.split(",")) & set(VIDEO_CONTAINERS):
                raise RequestError(unreadable, where)
            if not container.streams.video:
                raise RequestError(f"{where} has no video stream", where)
            stream = container.streams.video[0]
            has_soundtrack = bool(container.streams.audio)
            width, height = stream.codec_context.width, stream.codec_context.height
            rate = stream.average_rate or stream.guessed_rate
            if not width or not height or not rate:
                raise RequestError(unreadable, where)
            if width * height > limits.max_image_pixels:
                raise RequestError(
                    f"{where} is {width}x{height} pixels per frame; at most {limits.max_image_pixels:,}", where
                )
            # WebM headers carry no frame count; counting packets reads no pixels.
            total = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
            if total < MIN_VIDEO_FRAMES:
                raise RequestError(f"{where} has {total} frames; a video needs at least {MIN_VIDEO_FRAMES}", where)
            if total > limits.max_video_source_frames:
                raise RequestError(
                    f"{where} has {total:,} frames; at most {limits.max_video_source_frames:,} per video file", where
                )
            indices = [int(i) for i in sampler(total, float(rate))]
            if len(indices) > limits.max_video_frames:
                raise RequestError(
                    f"{where} samples to {len(indices)} frames; at most {limits.max_video_frames}", where
                )
            _check_video_pixels(where, len(indices), height, width, limits)
            frames = _sampled_frames(container, indices)
    except RequestError:
        raise
    except (av.FFmpegError, OSError, ValueError, IndexError, EOFError):
        raise RequestError(unreadable, where) from None
    if len(frames) < len(indices):
        raise RequestError(unreadable, where)
    return DecodedVideo(np.stack(frames), float(rate), total, indices, has_soundtrack)


def _sampled_frames(container: Any, indices: list[int]) -> list[np.ndarray]:
    container.seek(0)
    wanted: dict[int, int] = {}
    for index in indices:
        wanted[index] = wanted.get(index, 0) + 1
    last = max(indices)
    frames: list[np.ndarray] = []
    for position, frame in enumerate(container.decode(video=0)):
        if position in wanted:
            array = frame.to_ndarray(format="rgb24")
            frames.extend([array] * wanted[position])
        if position >= last:
            break
    return frames


def _check_video_pixels(where: str, frames: int, height: int, width: int, limits: MediaLimits) -> None:
    if frames * height * width > limits.max_video_pixels:
        raise RequestError(
            f"{where}: {frames} frames of {width}x{height} exceed {limits.max_video_pixels:,} pixels per video", where
        )
