"""Images and videos: encoding against an independent encoding built from the checkpoint's processor, the
reference score against the release's multimodal forward, and every kind of bad media refused by name.

The expectations are built here from the spec's pieces (`test_encoding.expect`) and from the processor called
directly on independently decoded media; nothing from `clef_vllm.format.media` or `_encode_media` builds them.
"""

from __future__ import annotations

import io
import json
import resource
import struct
import zlib

import numpy as np
import pytest
from media_files import b64, decode_all_frames, image_bytes, video_bytes, video_frames
from test_encoding import LONG_STATE, NOUL_FALSE, NOUL_TRUE, Field, check, expect, ids_of

from clef_vllm.errors import RequestError, SchemaTooLongError
from clef_vllm.format.encoding import encode_request
from clef_vllm.format.media import MediaLimits
from clef_vllm.format.request import parse_request

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
CHOICE_OPTIONS = ['{"description":"a cat","option_id":"cat"}', '{"description":"a dog","option_id":"dog"}']
QUESTIONS = {
    "visible": {"type": "noul", "instructions": "Is anything red?"},
    "animal": {"type": "choice", "criteria": {"dog": "a dog", "cat": "a cat"}},
}
FIELDS = [
    Field("visible", "noul", "Is anything red?", [NOUL_TRUE, NOUL_FALSE]),
    Field("animal", "choice", "animal", CHOICE_OPTIONS),
]


def body(state="look", questions=None, **media):
    return {"model": "clef-test", "state": state, "questions": questions or QUESTIONS, **media}


def pil(raw: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(raw)).convert("RGB")


def metadata(total: int, fps: float, indices=None):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, frames_indices=indices)


def processor_ids(processor, text, *, images=None, videos=None, video_metadata=None, sample=True):
    """The processor's own expansion of the media text (it samples files itself when `sample`)."""
    kwargs = {}
    if videos is not None:
        kwargs = {"videos": videos, "video_metadata": video_metadata, "do_sample_frames": sample}
    outputs = processor(text=[text], images=images, return_tensors="pt", **kwargs)
    return [int(t) for t in outputs["input_ids"][0]], outputs


def encode(tokenizer, processor, request_body, **kwargs):
    return encode_request(parse_request(request_body), tokenizer, processor=processor, **kwargs)


def check_media(tokenizer, encoding, media_ids, state="look", fields=FIELDS):
    check(encoding, expect(tokenizer, state, fields, media_ids=media_ids), tokenizer, fields)


# --- encoding equals the processor's --------------------------------------------------------------------------


def test_one_image_in_every_wire_form(tokenizer, processor):
    raw = image_bytes()
    media_ids, outputs = processor_ids(processor, IMAGE + "\n", images=[pil(raw)])
    forms = [
        {"images": [b64(raw)]},
        {"images": [f"data:image/png;base64,{b64(raw)}"]},
        {"images": [{"data_base64": b64(raw), "format": "png"}]},
        {"images": [{"data": b64(raw), "media_type": "image/png"}]},
        {"images": [{"base64": b64(raw), "content_type": "image/png"}]},
    ]
    for media in forms:
        encoding = encode(tokenizer, processor, body(**media))
        check_media(tokenizer, encoding, media_ids)
        assert encoding.media_inputs["pixel_values"].equal(outputs["pixel_values"])
        assert encoding.media_inputs["image_grid_thw"].equal(outputs["image_grid_thw"])
    parts = parse_request(body(images=[{"part": "photo"}]), parts={"photo": raw})
    check_media(tokenizer, encode_request(parts, tokenizer, processor=processor), media_ids)


def test_token_types_sit_at_the_media_offset_and_vllm_gets_unexpanded_placeholders(tokenizer, processor):
    raw = image_bytes()
    media_ids, outputs = processor_ids(processor, IMAGE + "\n", images=[pil(raw)])
    encoding = encode(tokenizer, processor, body(images=[b64(raw)]))
    offset = len(expect(tokenizer, "", []).input_ids) - len(expect(tokenizer, "", [], media_ids=[]).input_ids)
    prefix = len(ids_of(tokenizer, expect.__globals__["PREFIX"])) + offset
    types = encoding.media_inputs["mm_token_type_ids"][0].tolist()
    assert len(types) == encoding.num_tokens
    assert types[prefix : prefix + len(media_ids)] == outputs["mm_token_type_ids"][0].tolist()
    assert sum(types) == sum(outputs["mm_token_type_ids"][0].tolist()) > 0
    assert set(types[:prefix]) == set(types[prefix + len(media_ids) :]) == {0}
    unexpanded = ids_of(tokenizer, IMAGE + "\n")
    assert (
        encoding.prompt_ids == encoding.input_ids[:prefix] + unexpanded + encoding.input_ids[prefix + len(media_ids) :]
    )
    assert [image.size for image in encoding.multi_modal_data["image"]] == [(64, 48)]


def test_two_images_and_gif_jpeg_webp(tokenizer, processor):
    raws = [image_bytes(64, 48), image_bytes(40, 72, (10, 200, 30), "JPEG")]
    media_ids, _ = processor_ids(processor, IMAGE * 2 + "\n", images=[pil(r) for r in raws])
    check_media(tokenizer, encode(tokenizer, processor, body(images=[b64(r) for r in raws])), media_ids)
    for fmt in ("GIF", "WEBP"):
        raw = image_bytes(fmt=fmt)
        media_ids, _ = processor_ids(processor, IMAGE + "\n", images=[pil(raw)])
        check_media(tokenizer, encode(tokenizer, processor, body(images=[b64(raw)])), media_ids)


@pytest.mark.parametrize(
    ("fmt", "codec", "seconds", "rate", "frames"),
    [
        pytest.param("mp4", "mpeg4", 3.0, 10, 6, id="mp4-3s-at-10fps"),
        pytest.param("webm", "libvpx", 3.0, 10, 6, id="webm-3s"),
        pytest.param("mov", "mpeg4", 2.5, 12, 5, id="mov-2.5s-at-12fps"),
        pytest.param("mp4", "mpeg4", 1.0, 10, 4, id="short-clip-gets-the-minimum-4"),
    ],
)
def test_video_file_is_sampled_at_2_fps_as_the_processor_samples_it(
    tokenizer, processor, fmt, codec, seconds, rate, frames
):
    raw = video_bytes(seconds, rate, fmt=fmt, codec=codec)
    decoded, fps = decode_all_frames(raw)
    # the processor samples the whole decoded file itself
    media_ids, outputs = processor_ids(
        processor, VIDEO + "\n", videos=[decoded], video_metadata=[metadata(len(decoded), fps)]
    )
    assert int(outputs["video_grid_thw"][0][0]) == (frames + 1) // 2  # 2 frames per temporal patch, last repeated
    encoding = encode(tokenizer, processor, body(videos=[b64(raw)]))
    check_media(tokenizer, encoding, media_ids)
    assert encoding.media_inputs["pixel_values_videos"].equal(outputs["pixel_values_videos"])
    video, meta = encoding.multi_modal_data["video"][0]
    assert video.shape == (frames, 48, 64, 3)
    assert meta["fps"] == rate and meta["total_num_frames"] == len(decoded) and not meta["do_sample_frames"]


def test_frames_list_is_taken_as_already_sampled_at_2_fps(tokenizer, processor):
    frames = video_frames(6)
    items = [b64(_png(frame)) for frame in frames]
    media_ids, outputs = processor_ids(
        processor, VIDEO + "\n", videos=[frames], video_metadata=[metadata(6, 2.0, list(range(6)))], sample=False
    )
    assert int(outputs["video_grid_thw"][0][0]) == 3
    encoding = encode(tokenizer, processor, body(videos=[items]))
    check_media(tokenizer, encoding, media_ids)
    # frame pairs of a 2 fps clip sit at 0.25 s, 1.25 s, 2.25 s (without a rate the processor would assume 24 fps)
    assert "<1.2 seconds>" in tokenizer.decode(encoding.input_ids)


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_and_video_together(tokenizer, processor):
    image, video = image_bytes(), video_bytes(2.0, 8)
    decoded, fps = decode_all_frames(video)
    media_ids, _ = processor_ids(
        processor,
        IMAGE + VIDEO + "\n",
        images=[pil(image)],
        videos=[decoded],
        video_metadata=[metadata(len(decoded), fps)],
    )
    encoding = encode(tokenizer, processor, body(images=[b64(image)], videos=[b64(video)]))
    check_media(tokenizer, encoding, media_ids)
    assert set(encoding.multi_modal_data) == {"image", "video"}


def test_assets_are_images_in_order_of_first_reference(tokenizer, processor):
    red, green = image_bytes(64, 48, (250, 0, 0)), image_bytes(32, 64, (0, 250, 0))
    questions = {"q": {"type": "noul", "instructions": "Is <green> greener than <red>?"}}
    state = "photo <red> and photo <green>"
    assets = {
        "<green>": {"format": "png", "data_base64": b64(green)},
        "<red>": {"format": "png", "data_base64": b64(red)},
    }
    media_ids, _ = processor_ids(processor, IMAGE * 2 + "\n", images=[pil(red), pil(green)])
    fields = [Field("q", "noul", "Is <green> greener than <red>?", [NOUL_TRUE, NOUL_FALSE])]
    encoding = encode(tokenizer, processor, body(state, questions, assets=assets))
    check_media(tokenizer, encoding, media_ids, state, fields)


def test_truncation_counts_the_expanded_media_tokens(tokenizer, processor):
    raw = image_bytes()
    media_ids, _ = processor_ids(processor, IMAGE + "\n", images=[pil(raw)])
    fixed = len(expect(tokenizer, "", FIELDS, media_ids=media_ids).input_ids)
    assert len(media_ids) > 20  # the expansion, not the 4 placeholder tokens, is what counts
    encoding = encode(tokenizer, processor, body(LONG_STATE, images=[b64(raw)]), max_length=fixed + 5)
    check(encoding, expect(tokenizer, LONG_STATE, FIELDS, media_ids=media_ids, keep_state=5), tokenizer, FIELDS)
    assert encoding.state_tokens_dropped == len(ids_of(tokenizer, LONG_STATE)) - 5
    with pytest.raises(
        SchemaTooLongError, match=f"^schema requires {fixed} tokens before state; maximum is {fixed - 1}$"
    ):
        encode(tokenizer, processor, body(LONG_STATE, images=[b64(raw)]), max_length=fixed - 1)


# --- bad media ------------------------------------------------------------------------------------------------


def png_bomb(width: int, height: int) -> bytes:
    """A valid grayscale PNG of `width` x `height` zero pixels, compressed to a few hundred KiB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor, row, parts = zlib.compressobj(9), b"\0" * (width + 1), []
    for _ in range(height):
        parts.append(compressor.compress(row))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def _bad_media_cases():
    png, mp4 = image_bytes(), video_bytes(2.0, 8)
    small = MediaLimits(max_image_pixels=40 * 40, max_video_frames=3, max_video_pixels=10**9)
    return [
        ({"images": ["not base64 !!"]}, None, "images[0]", "not base64"),
        ({"images": ["data:image/png,abc"]}, None, "images[0]", "base64"),
        ({"images": [b64(b"hello world")]}, None, "images[0]", "not a readable image"),
        ({"images": [b64(png[: len(png) // 2])]}, None, "images[0]", "cut short"),
        ({"images": [b64(png), b64(image_bytes()[:-30])]}, None, "images[1]", "cut short"),
        ({"images": [b64(png)]}, small, "images[0]", "64x48 pixels; at most 1,600"),
        ({"images": [""]}, None, "images[0]", "empty"),
        ({"assets": {"<x>": {"format": "png", "data_base64": "@@"}}}, None, "assets.<x>", "base64"),
        ({"videos": [b64(b"not a video at all")]}, None, "videos[0]", "not a readable video"),
        ({"videos": [b64(mp4[: len(mp4) // 3])]}, None, "videos[0]", "not a readable video"),
        ({"videos": [b64(png)]}, None, "videos[0]", "not a readable video"),
        ({"videos": [b64(mp4)]}, small, "videos[0]", "64x48 pixels per frame"),
        ({"videos": [b64(mp4)]}, MediaLimits(max_video_frames=3), "videos[0]", "samples to 4 frames; at most 3"),
        ({"videos": [b64(mp4)]}, MediaLimits(max_video_source_frames=10), "videos[0]", "16 frames; at most 10"),
        ({"videos": [b64(mp4)]}, MediaLimits(max_video_pixels=64 * 48 * 3), "videos[0]", "exceed 9,216 pixels"),
        ({"videos": [[b64(png)] * 4]}, MediaLimits(max_video_frames=3), "videos[0]", "4 frames; at most 3"),
        ({"videos": [[b64(png), b64(image_bytes(32, 32))]]}, None, "videos[0]", "same size"),
        ({"videos": [[b64(png), "??"]]}, None, "videos[0][1]", "base64"),
        ({"videos": [[]]}, None, "videos[0]", "0 frames; a video needs at least 2"),
        ({"videos": [[b64(png)]]}, None, "videos[0]", "1 frames; a video needs at least 2"),
        ({"videos": [b64(video_bytes(0.1, 10))]}, None, "videos[0]", "1 frames; a video needs at least 2"),
    ]


@pytest.mark.parametrize(("media", "limits", "where", "needle"), _bad_media_cases())
def test_bad_media_is_a_request_error_naming_the_item(tokenizer, processor, media, limits, where, needle):
    kwargs = {"media_limits": limits} if limits else {}
    with pytest.raises(RequestError) as info:  # a list of too few frames is refused by validation, before decoding
        encode_request(parse_request(body(**media)), tokenizer, processor=processor, **kwargs)
    assert info.value.field == where
    assert info.value.message.startswith(where)
    assert needle in info.value.message
    assert "\n" not in info.value.message


def test_decompression_bomb_is_refused_before_decoding(tokenizer, processor):
    """10,000 x 10,000 pixels in ~100 KiB: refused from the header; memory stays where it was."""
    bomb = png_bomb(10_000, 10_000)
    assert len(bomb) < 1_000_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        with pytest.raises(RequestError, match=r"^images\[0\] is 10000x10000 pixels; at most 16,777,216"):
            encode(tokenizer, processor, body(images=[b64(bomb)]))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 50, f"peak memory grew by {grown_mib:.0f} MiB (decoded, it is 300 MiB of RGB)"


# --- reference score ------------------------------------------------------------------------------------------


def release_forward_probabilities(tiny_dir, tokenizer, processor, request_body, raw_images) -> list[float]:
    """The release's forward, built here: processor outputs with token types at the media offset, the full
    vision-language backbone in float32, the head over its final hidden states, softmax per question."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    from clef_vllm.format.schema import RecordSchema
    from clef_vllm.head.files import find_head_dir, load_head

    media_text = IMAGE * len(raw_images) + "\n"
    media_ids, outputs = processor_ids(processor, media_text, images=[pil(r) for r in raw_images])
    expected = expect(tokenizer, request_body["state"], FIELDS, media_ids=media_ids)
    prefix = len(ids_of(tokenizer, expect.__globals__["PREFIX"]))
    types = torch.zeros((1, len(expected.input_ids)), dtype=outputs["mm_token_type_ids"].dtype)
    types[0, prefix : prefix + len(media_ids)] = outputs["mm_token_type_ids"][0]
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    ids = torch.tensor([expected.input_ids])
    with torch.inference_mode():
        hidden = model.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=outputs["pixel_values"],
            image_grid_thw=outputs["image_grid_thw"],
            mm_token_type_ids=types,
            use_cache=False,
        ).last_hidden_state[0]
        head = load_head(find_head_dir(tiny_dir), dtype=torch.float32)
        schema = RecordSchema(
            question_types=(0, 1),
            question_spans=tuple(expected.question_spans),
            option_spans=tuple(tuple(s) for s in expected.option_spans),
        )
        (logits,) = head([hidden], [ids[0]], [schema], model.lm_head.weight)
    return [*logits[:2].softmax(-1).tolist(), *logits[2:].softmax(-1).tolist()]


def test_score_with_images_equals_the_release_forward(tiny_dir, tokenizer, processor, tmp_path):
    from typer.testing import CliRunner

    from clef_quant.cli import app

    raws = [image_bytes(64, 48), image_bytes(48, 80, (20, 20, 220))]
    request_body = body("two pictures", images=[b64(r) for r in raws])
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request_body), encoding="utf-8")
    result = CliRunner().invoke(app, ["score", "--model", str(tiny_dir), "--dtype", "float32", str(path)])
    assert result.exit_code == 0, result.output
    answers = json.loads(result.stdout)["answers"]
    got = [answers["visible"]["noul"], 1 - answers["visible"]["noul"]]
    got += [answers["animal"]["probabilities"]["cat"], answers["animal"]["probabilities"]["dog"]]
    expected = release_forward_probabilities(tiny_dir, tokenizer, processor, request_body, raws)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 2e-4
    # the images matter: without them the answer moves
    text_only = body("two pictures")
    path.write_text(json.dumps(text_only), encoding="utf-8")
    plain = json.loads(
        CliRunner().invoke(app, ["score", "--model", str(tiny_dir), "--dtype", "float32", str(path)]).stdout
    )
    assert plain["answers"] != json.loads(result.stdout)["answers"]


# --- switching media off --------------------------------------------------------------------------------------


def test_vision_tower_is_skipped_only_when_media_are_off(tiny_dir):
    from dataclasses import replace

    from clef_vllm.engine.settings import engine_args
    from clef_vllm.format.limits import DEFAULT_LIMITS
    from clef_vllm.server.cli import parse_args

    on = engine_args(tiny_dir)
    assert on["language_model_only"] is False
    assert on["limit_mm_per_prompt"] == {"image": 8, "video": 2}
    off = engine_args(tiny_dir, limits=replace(DEFAULT_LIMITS, max_images=0, max_videos=0))
    assert off["language_model_only"] is True and "limit_mm_per_prompt" not in off

    limits = parse_args(["--model", "m", "--limit-images", "3", "--max-video-frames", "16"]).limits
    assert (limits.max_images, limits.max_videos, limits.media.max_video_frames) == (3, 2, 16)
    text_only = parse_args(["--model", "m", "--language-model-only"]).limits
    assert not text_only.media_enabled
    assert engine_args(tiny_dir, limits=text_only)["language_model_only"] is True
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--limit-images", "-1"])
