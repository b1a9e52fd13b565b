"""The media part of a prompt: the placeholder text, the checkpoint's processor run on the decoded media, and what
the engine needs to expand the same placeholders itself.

Two layouts, told apart by the checkpoint's processor:
- Clef-Flash and clef (Qwen3.5; `clef-format.md`): every image placeholder, then every video placeholder, then one
  newline. A video file is sampled by the processor's own `sample_frames`, and its frames are described to the
  processor with their times (Qwen3.5 writes each frame's time into the prompt).
- Clef-Omni (the Qwen3-Omni thinker, whose processor also reads audio): every placeholder followed by its own
  newline; an image is read at most 1,048,576 pixels; a video file is sampled at each half-second boundary and
  padded to an even count (`media.boundary_frames`), each frame is read at most 262,144 pixels, and the frames are
  read as sampled; a video's soundtrack is heard with it when every video of the request has one. These are the
  facts vLLM 0.32 implements for the release (its clef_omni model: `JointSchemaStrategy`, `ClefOmniVideoBackend`,
  `ClefOmniMultiModalProcessor`). Audio is not read here, so a request whose videos all have soundtracks is
  refused rather than read without them.

The engine gets the ids with one pad token per item, the decoded media and the processor settings used here
(`mm_processor_kwargs`), and vLLM's own processor expands them; every output's ids are compared with ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clef_vllm.errors import RequestError
from clef_vllm.format.media import (
    OMNI_FRAME_PIXELS,
    DecodedVideo,
    FrameSampler,
    MediaData,
    MediaLimits,
    boundary_frames,
    cap_frame_pixels,
    decode_frames,
    decode_image,
    decode_video,
)
from clef_vllm.format.request import ClefRequest

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


@dataclass(frozen=True)
class MediaLayout:
    """How one model of the family places and reads its media."""

    name: str
    newline_each: bool  # a newline after every placeholder, not one after all of them
    image_size: dict[str, int] | None  # the processor's image `size` for this model; None keeps its own
    frame_pixels: int | None  # the most pixels of a video frame read; None: the processor decides
    hears_soundtracks: bool  # whether the release reads a video's audio stream with it


FLASH = MediaLayout("Clef-Flash", newline_each=False, image_size=None, frame_pixels=None, hears_soundtracks=False)
OMNI = MediaLayout(
    "Clef-Omni",
    newline_each=True,
    image_size={"shortest_edge": 65_536, "longest_edge": 1_048_576},
    frame_pixels=OMNI_FRAME_PIXELS,
    hears_soundtracks=True,
)


def media_layout(processor: Any) -> MediaLayout:
    """The layout of the model a checkpoint's processor belongs to: Qwen-Omni processors carry an audio token,
    Qwen3.5's have none."""
    return OMNI if getattr(processor, "audio_token", None) else FLASH


def media_text(num_images: int, num_videos: int, layout: MediaLayout = FLASH) -> str:
    """The placeholder text that goes right after the prompt's prefix."""
    placeholders = [IMAGE_PLACEHOLDER] * num_images + [VIDEO_PLACEHOLDER] * num_videos
    if layout.newline_each:
        return "".join(f"{placeholder}\n" for placeholder in placeholders)
    return "".join(placeholders) + "\n"


@dataclass
class MediaEncoding:
    ids: list[int] = field(default_factory=list)  # placeholders expanded by the processor
    unexpanded_ids: list[int] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    multi_modal_data: dict[str, list[Any]] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)

    def place_token_types(self, offset: int, total: int) -> None:
        """The processor types only the media text; the model reads them at the media's place in the prompt."""
        import torch

        types = self.inputs.get("mm_token_type_ids")
        if types is None:
            return
        full = torch.zeros((1, total), dtype=types.dtype)
        full[0, offset : offset + types.shape[-1]] = types[0]
        self.inputs["mm_token_type_ids"] = full


def encode_media(
    request: ClefRequest,
    processor: Any | None,
    token_ids: Callable[[str], list[int]],
    limits: MediaLimits,
) -> MediaEncoding:
    """The request's images and videos decoded, placed and expanded as its checkpoint's release does.

    `token_ids` tokenizes a text on its own without special tokens (the unexpanded placeholders)."""
    if processor is None:
        raise RequestError("this request has images or videos, but the checkpoint has no processor", "images")
    layout = media_layout(processor)
    images = [decode_image(item, limits) for item in request.images]
    sampler: FrameSampler = boundary_frames if layout is OMNI else _processor_sampler(processor)
    videos: list[DecodedVideo] = [
        decode_video(video, sampler, limits)
        if isinstance(video, MediaData)
        else decode_frames(video, f"videos[{i}]", limits, _frame_rate(processor))
        for i, video in enumerate(request.videos)
    ]
    if layout.hears_soundtracks and videos and all(v.has_soundtrack for v in videos):
        raise RequestError(
            f"videos[0] has a soundtrack, which {layout.name} hears with the video, and this server reads no audio: "
            "send the video without its audio stream (ffmpeg -an) or as a list of frames",
            "videos[0]",
        )
    text = media_text(len(images), len(videos), layout)
    kwargs: dict[str, Any] = {}
    engine_kwargs: dict[str, Any] = {}
    if layout.image_size is not None:
        kwargs["images_kwargs"] = {"size": dict(layout.image_size)}
        engine_kwargs["images_kwargs"] = {"size": dict(layout.image_size)}
    if videos:
        frames = [v.frames for v in videos]
        if layout.frame_pixels is not None:
            frames = [cap_frame_pixels(f, layout.frame_pixels) for f in frames]
        kwargs.update(videos=frames, do_sample_frames=False)
        if layout is FLASH:
            kwargs["video_metadata"] = [_hf_metadata(v) for v in videos]
        else:
            # vLLM's Omni processor drops a video's metadata, and a video processor that samples by default then
            # takes the frames for a 24 fps clip and keeps about one in twelve: the frames are read as sampled.
            engine_kwargs.update(do_sample_frames=False, use_audio_in_video=False)
    outputs = processor(text=[text], images=images or None, return_tensors="pt", **kwargs)
    multi_modal_data: dict[str, list[Any]] = {}
    if images:
        multi_modal_data["image"] = images
    if videos:
        # vLLM caps Omni's frames itself (the same rule), so it gets them as decoded.
        multi_modal_data["video"] = [(v.frames, v.metadata()) for v in videos]
    return MediaEncoding(
        ids=[int(t) for t in outputs["input_ids"][0]],
        unexpanded_ids=token_ids(text),
        inputs={k: v for k, v in outputs.items() if k not in ("input_ids", "attention_mask", "video_metadata")},
        multi_modal_data=multi_modal_data,
        mm_processor_kwargs=engine_kwargs,
    )


def _frame_rate(processor: Any) -> float:
    return float(getattr(processor.video_processor, "fps", None) or 2.0)


def _processor_sampler(processor: Any) -> FrameSampler:
    """Frame indices exactly as the checkpoint's video processor samples a decoded file."""
    from transformers.video_utils import VideoMetadata

    video_processor = processor.video_processor

    def sample(total_num_frames: int, fps: float) -> list[int]:
        metadata = VideoMetadata(total_num_frames=total_num_frames, fps=fps)
        return [int(i) for i in video_processor.sample_frames(metadata)]

    return sample


def _hf_metadata(video: DecodedVideo) -> Any:
    from transformers.video_utils import VideoMetadata

    meta = video.metadata()
    return VideoMetadata(
        total_num_frames=meta["total_num_frames"],
        fps=meta["fps"],
        duration=meta["duration"],
        frames_indices=meta["frames_indices"],
        height=meta["height"],
        width=meta["width"],
    )
