"""Small generated images and videos for the media tests (a few KiB each, made on the fly)."""

from __future__ import annotations

import base64
import io

import numpy as np


def image_bytes(width: int = 64, height: int = 48, color=(200, 40, 40), fmt: str = "PNG") -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    image = Image.new("RGB", (width, height), color)
    # a gradient, so that pixels (and therefore the vision tower's output) differ across the image
    for x in range(0, width, 4):
        image.paste((x * 3 % 256, color[1], color[2]), (x, 0, x + 2, height))
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def image_b64(*args, **kwargs) -> str:
    return b64(image_bytes(*args, **kwargs))


def video_frames(count: int, width: int = 64, height: int = 48) -> np.ndarray:
    """RGB frames that change over time (each frame a different brightness and stripe)."""
    frames = np.zeros((count, height, width, 3), dtype=np.uint8)
    for i in range(count):
        frames[i, :, :, 0] = (i * 23) % 256
        frames[i, :, (i * 4) % width :, 1] = 180
    return frames


def video_bytes(
    seconds: float = 3.0,
    rate: int = 10,
    width: int = 64,
    height: int = 48,
    fmt: str = "mp4",
    codec: str = "mpeg4",
    soundtrack: bool = False,
) -> bytes:
    """An MP4 / WebM / MOV file encoded with PyAV; with `soundtrack`, an AAC tone of the same length beside it."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio = container.add_stream("aac", rate=16000) if soundtrack else None
        packets = []
        for frame in video_frames(round(seconds * rate), width, height):
            packets += stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24"))
        packets += stream.encode()
        if audio is not None:
            audio.layout = "mono"
            tone = (0.3 * np.sin(np.arange(round(seconds * 16000)) / 8)).astype(np.float32)[None]
            samples = av.AudioFrame.from_ndarray(tone, format="flt", layout="mono")
            samples.sample_rate = 16000
            packets += [*audio.encode(samples), *audio.encode()]
        for packet in packets:
            container.mux(packet)
    return buffer.getvalue()


def video_b64(*args, **kwargs) -> str:
    return b64(video_bytes(*args, **kwargs))


def decode_all_frames(raw: bytes) -> tuple[np.ndarray, float]:
    """Every frame of a file and its frame rate, decoded independently of clef_vllm.format.media."""
    import av

    with av.open(io.BytesIO(raw)) as container:
        rate = float(container.streams.video[0].average_rate)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames), rate
