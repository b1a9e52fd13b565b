"""`clef-systemone --model DIR`: serve a Clef-Flash folder behind `POST /v1/systemone`."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from clef_vllm.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.media import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_VIDEO_FRAMES
from clef_vllm.request import DEFAULT_LIMITS, MAX_IMAGES, MAX_VIDEOS, Limits

API_KEY_ENV = "CLEF_SYSTEMONE_API_KEY"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="clef-systemone",
        description="Serve a Clef-Flash checkpoint (original or quantized) with the SystemOne API.",
        epilog="Example: clef-systemone --model artifacts/tiny --port 8000",
    )
    parser.add_argument("--model", required=True, help="release folder or Hub id")
    parser.add_argument("--served-model-name", help="name reported by /v1/models (default: --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_ENV})")
    parser.add_argument("--max-body-mb", type=float, default=13.0, help="larger bodies get 413")
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--dp", type=int, default=1, help="data parallel engines (one per GPU), one port")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--enforce-eager", action="store_true", help="skip graph capture and compilation")
    media = parser.add_argument_group("images and videos")
    media.add_argument(
        "--limit-images", type=int, default=MAX_IMAGES, help="images per request, assets included; 0 refuses images"
    )
    media.add_argument("--limit-videos", type=int, default=MAX_VIDEOS, help="videos per request; 0 refuses videos")
    media.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="pixels per image or video frame, checked before decoding",
    )
    media.add_argument(
        "--max-video-frames", type=int, default=DEFAULT_MAX_VIDEO_FRAMES, help="frames per video after sampling"
    )
    media.add_argument(
        "--language-model-only",
        action="store_true",
        help="text only: refuse images and videos and do not load the vision tower",
    )
    args = parser.parse_args(argv)
    for name in ("limit_images", "limit_videos", "max_image_pixels", "max_video_frames"):
        if getattr(args, name) < (0 if name.startswith("limit") else 1):
            parser.error(f"--{name.replace('_', '-')} must be {'>= 0' if name.startswith('limit') else '>= 1'}")
    return args


def limits_from_args(args: argparse.Namespace) -> Limits:
    media = replace(
        DEFAULT_LIMITS.media, max_image_pixels=args.max_image_pixels, max_video_frames=args.max_video_frames
    )
    if args.language_model_only:
        return replace(DEFAULT_LIMITS, max_images=0, max_videos=0, media=media)
    return replace(DEFAULT_LIMITS, max_images=args.limit_images, max_videos=args.limit_videos, media=media)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import uvicorn

    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import EngineBackend, ServeConfig

    config = ServeConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tp,
        data_parallel_size=args.dp,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        limits=limits_from_args(args),
        extra_engine_args={"enforce_eager": True} if args.enforce_eager else {},
    )
    if not os.path.isdir(config.model) and config.model.count("/") != 1:
        sys.exit(f"error: {config.model} is neither a folder nor a Hub id")
    uvicorn.run(create_app(EngineBackend(config)), host=config.host, port=config.port, log_level="info")


if __name__ == "__main__":
    main()
