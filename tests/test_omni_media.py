"""Clef-Omni's images and videos, read as its release reads them: what vLLM 0.32's own clef_omni code states (its
`JointSchemaStrategy` for `/v1/systemone`, the `clef_omni` video backend, the frame cap of its processor), checked
against that code itself, and answered by the engine (whose prompt ids are compared with ours on every output)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from media_files import b64, image_b64, image_bytes, video_b64, video_bytes

from clef_vllm.engine.pooling_contract import pooling_schema
from clef_vllm.errors import RequestError
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.media import boundary_frames, cap_frame_pixels
from clef_vllm.format.media_encoding import FLASH, OMNI, media_text
from clef_vllm.format.request import parse_request

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=80)

QUESTIONS = {
    "damaged": {"type": "noul", "instructions": "Is the parcel damaged?"},
    "colour": {"type": "choice", "instructions": "Main colour?", "criteria": {"red": "Red.", "blue": "Blue."}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
}


def body(**media) -> dict:
    return {"state": {"ticket": 1432, "text": "the parcel arrived like this"}, "questions": QUESTIONS, **media}


@pytest.fixture
def omni(family_dir, clef_engine, monkeypatch: pytest.MonkeyPatch):
    """The session's Omni engine (its core in its own process: see test_family.own_engine_process)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    return clef_engine(family_dir("omni-tiny"))


def test_omni_answers_video_files_and_frame_lists(omni) -> None:
    """vLLM's Omni processor drops a video's metadata and, with a video processor that samples by default, took
    our frames for a 24 fps clip and kept 4 of them: every video file and every list of more than 4 frames was a
    500 (the engine ran other token ids than the encoding)."""
    bodies = [
        body(videos=[video_b64(3.0, 10)]),  # 6 frames at 2 fps
        body(videos=[video_b64(2.5, 7, width=640, height=480)]),  # 5 frames, padded to 6; each over the pixel cap
        body(videos=[[image_b64(64, 48, (40 * i, 20, 20)) for i in range(5)]]),
        body(images=[image_b64(), image_b64(1400, 1000)], videos=[video_b64(2.0, 8), [image_b64()] * 2]),
    ]
    for answered in omni.score(bodies):
        assert set(answered["answers"]) == set(QUESTIONS)
        assert sum(answered["answers"]["colour"]["probabilities"].values()) == pytest.approx(1, abs=2e-4)


@pytest.mark.parametrize(
    ("seconds", "rate", "fmt", "codec"),
    [(3.0, 10, "mp4", "mpeg4"), (2.5, 7, "mp4", "mpeg4"), (1.0, 30, "mov", "mpeg4"), (2.0, 8, "webm", "libvpx")],
)
def test_video_files_are_sampled_as_vllms_clef_omni_backend_samples_them(
    family_dir, seconds: float, rate: int, fmt: str, codec: str
) -> None:
    from vllm.multimodal.media import ImageMediaIO, VideoMediaIO

    raw = video_bytes(seconds, rate, fmt=fmt, codec=codec)
    _, reference = VideoMediaIO(ImageMediaIO(), num_frames=-1, fps=2, video_backend="clef_omni").load_bytes(raw)
    encoding = Encoder(family_dir("omni-tiny")).encode(parse_request(body(videos=[b64(raw)])))
    ((frames, metadata),) = encoding.multi_modal_data["video"]
    assert metadata["frames_indices"] == reference["frames_indices"] and len(frames) % 2 == 0
    assert encoding.mm_processor_kwargs["do_sample_frames"] is False  # vLLM reads the frames as sampled too


def test_boundary_frames_are_vllms_sampling() -> None:
    from vllm.model_executor.models.clef_omni import MAX_FRAME_PIXELS
    from vllm.multimodal.video import ClefOmniVideoBackend
    from vllm.multimodal.video_decoders.base import VideoSourceMetadata, VideoTargetMetadata

    assert OMNI.frame_pixels == MAX_FRAME_PIXELS
    for total, fps in [(30, 10.0), (18, 7.0), (300, 29.97), (7, 2.0), (5, 1.0), (1000, 23.976), (2, 60.0)]:
        source = VideoSourceMetadata(total_frames_num=total, original_fps=fps, duration=total / fps)
        target = VideoTargetMetadata(num_frames=-1, fps=2, max_duration=300)
        indices = ClefOmniVideoBackend.compute_frames_index_to_sample(source, target)
        padded = indices + indices[-1:] if len(indices) % 2 else indices  # what its load_bytes adds
        assert boundary_frames(total, fps) == padded, (total, fps)


@pytest.mark.parametrize("shape", [(2, 48, 64), (3, 480, 640), (2, 1080, 1920), (2, 777, 333), (1, 512, 513)])
def test_frames_are_capped_as_vllms_omni_processor_caps_them(shape: tuple[int, int, int]) -> None:
    from vllm.model_executor.models.clef_omni import cap_frame_pixels as vllm_cap

    frames = np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8)
    ours, theirs = cap_frame_pixels(frames), vllm_cap(frames)
    assert ours.dtype == np.uint8 and np.array_equal(ours, theirs)


def test_images_are_placed_and_read_as_vllms_joint_schema_strategy_does(omni) -> None:
    """Two and three images, one over Omni's 1,048,576-pixel read: the prompt vLLM's own `/v1/systemone` builds for
    Clef-Omni (each placeholder followed by a newline, images at its size) equals ours token for token, with the
    same spans, and vLLM's processor gets the same pixels from both."""
    from vllm.entrypoints.generate.structured_decisions.protocol import StructuredDecisionRequest
    from vllm.entrypoints.generate.structured_decisions.serving import parse_questions
    from vllm.entrypoints.generate.structured_decisions.strategies import JointSchemaStrategy, ReadContext
    from vllm.renderers.online_renderer import OnlineRenderer

    from clef_vllm.engine.prompt import engine_prompt

    llm = omni.llm
    online = OnlineRenderer(
        llm.llm_engine.model_config,
        llm.renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
    )
    # vLLM's strategy reads only the model's config from its engine client until it sends a read
    context = ReadContext(llm.llm_engine, online, None, "auto", {})
    strategy = JointSchemaStrategy(context)
    assert media_text(2, 1, OMNI) == strategy.PLACEHOLDERS["image"] * 2 + strategy.PLACEHOLDERS["video"]
    assert media_text(2, 1, FLASH).count("\n") == 1  # the Flash release: all placeholders, then one newline

    for images in (
        [("png", image_bytes()), ("jpeg", image_bytes(1400, 1000, fmt="JPEG"))],
        [("png", image_bytes(32, 32)), ("png", image_bytes(96, 64)), ("png", image_bytes(200, 120, (10, 10, 200)))],
    ):
        urls = [f"data:image/{kind};base64,{b64(raw)}" for kind, raw in images]
        request = body(images=urls)
        wire = StructuredDecisionRequest(**json.loads(json.dumps(request)))
        theirs = asyncio.run(strategy._render_media({"image": urls}, None))
        prompt, schema, _ = strategy.encode(
            parse_questions(wire, strategy.limits()), strategy.render_state(wire.state), theirs["prompt_token_ids"]
        )
        _, encoding = omni.encode(request)
        assert encoding.input_ids == prompt
        assert pooling_schema(encoding) == schema
        ours = llm.renderer.process_for_engine(engine_prompt(encoding), 0.0)
        ours_items, their_items = ours["mm_kwargs"]["image"], theirs["mm_kwargs"]["image"]
        assert len(ours_items) == len(their_items) == len(images)
        for mine, vllms in zip(ours_items, their_items, strict=True):
            assert mine["image_grid_thw"].data.tolist() == vllms["image_grid_thw"].data.tolist()
            assert mine["pixel_values"].data.equal(vllms["pixel_values"].data)
            # at most 1,048,576 pixels an image: 1,024 tokens (the 1400x1000 one: 999, not the processor's 1,364)
            assert int(mine["image_grid_thw"].data.prod()) // 4 <= 1024


def test_soundtracks_the_release_would_hear_are_refused(family_dir, tiny_dir: Path) -> None:
    """Clef-Omni hears a video's soundtrack with it when every video of the request has one; this server reads no
    audio, so such a request is a 400 instead of an answer that silently misses the sound."""
    omni = Encoder(family_dir("omni-tiny"))
    with_sound = video_b64(2.0, 8, soundtrack=True)
    with pytest.raises(RequestError) as refused:
        omni.encode(parse_request(body(videos=[with_sound])))
    assert refused.value.field == "videos[0]" and "soundtrack" in refused.value.message
    # one video without a soundtrack: the release hears none, and neither do we
    assert omni.encode(parse_request(body(videos=[with_sound, [image_b64()] * 2]))).num_tokens
    assert Encoder(tiny_dir).encode(parse_request(body(videos=[with_sound]))).num_tokens  # Flash has no audio tower
