"""`clef-systemone --model DIR`: serve a Clef-Flash folder behind `POST /v1/systemone`."""

from __future__ import annotations

import argparse
import os
import sys

from clef_vllm.encoding import DEFAULT_MAX_LENGTH

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
    return parser.parse_args(argv)


# Exit status when the engine dies or fails to start, so that a supervisor restarts the server.
EXIT_ENGINE_DIED = 3


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import uvicorn

    from clef_vllm.errors import SettingsError
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
        batch_invariant=args.batch_invariant,
        extra_engine_args={"enforce_eager": True} if args.enforce_eager else {},
    )
    if not os.path.isdir(config.model) and config.model.count("/") != 1:
        sys.exit(f"error: {config.model} is neither a folder nor a Hub id")
    try:
        config.check()
    except SettingsError as exc:
        sys.exit(f"error: {exc} (--no-batch-invariant)")
    died = False

    def on_engine_death() -> None:
        nonlocal died
        died = True
        server.should_exit = True

    app = create_app(EngineBackend(config), on_engine_death=on_engine_death)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="info"))
    server.run()
    if died:
        sys.exit(EXIT_ENGINE_DIED)


if __name__ == "__main__":
    main()
