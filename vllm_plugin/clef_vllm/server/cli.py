"""`clef-systemone --model DIR`: serve a Clef-Flash folder behind `POST /v1/systemone`.

Bad flags and settings end as clef-quant's do: one `error:` line on stderr and exit status 2, never a
traceback or argparse's usage block.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from dataclasses import replace
from typing import NoReturn

from clef_vllm.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.errors import USAGE_EXIT, ClefError, SettingsError, usage_error_line
from clef_vllm.request import DEFAULT_LIMITS, Limits
from clef_vllm.server.connections import ConnectionLimits

API_KEY_ENV = "CLEF_SYSTEMONE_API_KEY"
# Flags with a lower bound: name -> (least value, how the message says it).
_LOWER_BOUNDS = {
    "port": (0, ">= 0"),
    "max_body_mb": (1e-9, "> 0"),
    "header_timeout": (1e-9, "> 0"),
    "body_timeout": (1e-9, "> 0"),
    "idle_timeout": (0, ">= 0"),
    "max_connections": (1, ">= 1"),
    "max_model_len": (1, ">= 1"),
    "tp": (1, ">= 1"),
    "dp": (1, ">= 1"),
    "limit_images": (0, ">= 0"),
    "limit_videos": (0, ">= 0"),
    "max_image_pixels": (1, ">= 1"),
    "max_video_frames": (1, ">= 1"),
}


def refuse(message: str) -> NoReturn:
    """End the command on input it cannot use: one line on stderr, exit status 2."""
    print(usage_error_line(message), file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def finite_float(text: str) -> float:
    """A float flag's value: `nan` and `inf` parse as floats but pass no bound check and size nothing."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _OneLineParser(
        prog="clef-systemone",
        description="Serve a Clef-Flash checkpoint (original or quantized) with the SystemOne API.",
        epilog="Example: clef-systemone --model artifacts/tiny --port 8000",
    )
    parser.add_argument("--model", required=True, help="release folder or Hub id")
    parser.add_argument(
        "--served-model-name",
        help="name reported by /v1/models and echoed when a request has no model (default: the model card's "
        "name, else the folder's name, else the Hub id)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_ENV})")
    parser.add_argument(
        "--max-body-mb", type=finite_float, default=13.0, help="larger bodies get 413; counted after decompression (13)"
    )
    limits = ConnectionLimits()
    parser.add_argument(
        "--header-timeout",
        type=finite_float,
        default=limits.header_timeout,
        help=f"seconds for a request's headers to arrive, else 408 and close ({limits.header_timeout:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=finite_float,
        default=limits.body_timeout,
        help=f"seconds for a request's whole body to arrive, else 408 and close ({limits.body_timeout:g})",
    )
    parser.add_argument(
        "--idle-timeout", type=finite_float, default=5.0, help="seconds an idle keep-alive connection stays open (5)"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=limits.max_connections,
        help=f"open connections beyond this get 503 and are closed ({limits.max_connections})",
    )
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--dp", type=int, default=1, help="data parallel engines (one per GPU), one port")
    parser.add_argument(
        "--no-batch-invariant",
        dest="batch_invariant",
        action="store_false",
        help="let vLLM batch several prompts per step and split long ones (--max-num-seqs, "
        "--max-num-batched-tokens): more requests/s under load, but probabilities then move in the third decimal "
        "with what else is in flight. By default each step runs one whole prompt and answers never depend on load",
    )
    parser.add_argument("--max-num-seqs", type=int, help="prompts per engine step (needs --no-batch-invariant)")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens per engine step (default --max-model-len; lower values need --no-batch-invariant)",
    )
    parser.add_argument("--enforce-eager", action="store_true", help="skip graph capture and compilation")
    media = parser.add_argument_group("images and videos")
    media.add_argument(
        "--limit-images",
        type=int,
        default=DEFAULT_LIMITS.max_images,
        help="images per request, assets included; 0 refuses images",
    )
    media.add_argument(
        "--limit-videos", type=int, default=DEFAULT_LIMITS.max_videos, help="videos per request; 0 refuses videos"
    )
    media.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_LIMITS.media.max_image_pixels,
        help="pixels per image or video frame, checked before decoding",
    )
    media.add_argument(
        "--max-video-frames",
        type=int,
        default=DEFAULT_LIMITS.media.max_video_frames,
        help="frames per video after sampling",
    )
    media.add_argument(
        "--language-model-only",
        action="store_true",
        help="text only: refuse images and videos and do not load the vision tower",
    )
    args = parser.parse_args(argv)
    for name, (least, wording) in _LOWER_BOUNDS.items():
        if getattr(args, name) < least:
            refuse(f"--{name.replace('_', '-')} must be {wording}, not {getattr(args, name)}")
    if args.port > 65535:
        refuse(f"--port must be at most 65535, not {args.port}")
    return args


def limits_from_args(args: argparse.Namespace) -> Limits:
    media = replace(
        DEFAULT_LIMITS.media, max_image_pixels=args.max_image_pixels, max_video_frames=args.max_video_frames
    )
    if args.language_model_only:
        return replace(DEFAULT_LIMITS, max_images=0, max_videos=0, media=media)
    return replace(DEFAULT_LIMITS, max_images=args.limit_images, max_videos=args.limit_videos, media=media)


# Exit status when the engine dies or fails to start, so that a supervisor restarts the server.
EXIT_ENGINE_DIED = 3


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import uvicorn

    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import EngineBackend, ServeConfig
    from clef_vllm.server.connections import guarded_protocol

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
        batch_invariant=args.batch_invariant,
        limits=limits_from_args(args),
        extra_engine_args={"enforce_eager": True} if args.enforce_eager else {},
    )
    if not os.path.isdir(config.model) and config.model.count("/") != 1:
        refuse(f"{config.model} is neither a folder nor a Hub id")
    if os.path.isdir(config.model) and not os.path.isfile(os.path.join(config.model, "config.json")):
        refuse(f"{config.model} is not a release folder (no config.json)")
    try:
        config.check()
    except SettingsError as exc:
        refuse(f"{exc} (--no-batch-invariant)")
    limits = ConnectionLimits(args.header_timeout, args.body_timeout, args.max_connections)
    _log_requests()
    died = False

    def on_engine_death() -> None:
        nonlocal died
        died = True
        server.should_exit = True

    try:
        backend = EngineBackend(config)
    except ClefError as exc:
        refuse(str(exc))
    except OSError as exc:  # transformers' word for a folder or Hub id without a usable tokenizer
        refuse(f"cannot load {config.model}: {str(exc).strip().splitlines()[0]}")
    app = create_app(backend, on_engine_death=on_engine_death)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            access_log=False,  # one line per request comes from the request-id layer, with the id
            timeout_keep_alive=int(args.idle_timeout) or 1,
            http=guarded_protocol(limits),
        )
    )
    server.run()
    if died:
        sys.exit(EXIT_ENGINE_DIED)


def _log_requests() -> None:
    logger = logging.getLogger("clef_vllm.server")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s clef-systemone: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


if __name__ == "__main__":
    main()
