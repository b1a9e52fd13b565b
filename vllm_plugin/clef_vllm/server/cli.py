"""`clef-systemone --model DIR`: serve a Clef-Flash folder behind `POST /v1/systemone`.

The flags are generated from `ServeConfig`'s fields (`server/settings.py`), which declare each one's type,
default, help and bounds; parsing the command line gives that config. Bad flags and settings end as
clef-quant's do: one `error:` line on stderr and exit status 2, never a traceback or argparse's usage block.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import typing
from typing import Any, NoReturn

from clef_vllm.engine.flags import Setting, flag_of, setting_of
from clef_vllm.engine.release_kernels import check_release_kernels
from clef_vllm.errors import USAGE_EXIT, CheckpointError, ClefError, SettingsError, usage_error_line
from clef_vllm.format.release_source import local_release
from clef_vllm.server.settings import ServeConfig


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


# How a flag's text becomes the field's value, by the field's type (Optional stripped).
_PARSERS: dict[Any, Any] = {int: int, float: finite_float, str: str}


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _add_flag(
    parser: argparse._ActionsContainer, config_field: dataclasses.Field[Any], how: Setting, kind: Any
) -> None:
    flag = flag_of(config_field)
    if kind is bool:
        action = "store_false" if config_field.default is True else "store_true"
        parser.add_argument(flag, dest=config_field.name, action=action, help=how.help)
        return
    if kind is tuple:  # a repeatable flag; its values in the order given
        metavar = "KEY=VALUE" if "KEY=VALUE" in how.help else "VALUE"
        parser.add_argument(flag, dest=config_field.name, action="append", default=[], metavar=metavar, help=how.help)
        return
    required = config_field.default is dataclasses.MISSING
    shown = how.show_default and not required and config_field.default is not None
    parser.add_argument(
        flag,
        dest=config_field.name,
        type=_PARSERS[kind],
        required=required,
        default=None if required else config_field.default,
        metavar=flag.removeprefix("--").replace("-", "_").upper(),
        help=f"{how.help} ({_shown(config_field.default)})" if shown else how.help,
    )


def build_parser() -> argparse.ArgumentParser:
    """`clef-systemone`'s command line: one flag per `ServeConfig` setting, in field order."""
    parser = _OneLineParser(
        prog="clef-systemone",
        description="Serve a Clef-Flash checkpoint (original or quantized) with the SystemOne API.",
        epilog="Example: clef-systemone --model artifacts/tiny --port 8000",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    hints = typing.get_type_hints(ServeConfig)
    for config_field in dataclasses.fields(ServeConfig):
        how = setting_of(config_field)
        if how is None:
            continue
        hint = hints[config_field.name]
        kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
        kind = tuple if typing.get_origin(hint) is tuple else kinds[0] if kinds else hint
        if how.group is not None and how.group not in groups:
            groups[how.group] = parser.add_argument_group(how.group)
        _add_flag(parser if how.group is None else groups[how.group], config_field, how, kind)
    return parser


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    """The config the command line asks for; a flag it cannot use ends the command with one `error:` line."""
    values = vars(build_parser().parse_args(argv))
    for config_field in dataclasses.fields(ServeConfig):
        how = setting_of(config_field)
        if how is not None and how.env is not None:
            values[config_field.name] = values[config_field.name] or os.environ.get(how.env) or None
    values = {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}
    try:
        return ServeConfig(**values)
    except SettingsError as exc:
        refuse(str(exc))


# Exit status when the engine dies or fails to start, so that a supervisor restarts the server.
EXIT_ENGINE_DIED = 3


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    import uvicorn

    from clef_vllm.server import lifecycle
    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import EngineBackend
    from clef_vllm.server.connections import guarded_protocol

    try:
        local_release(config.model)
        check_release_kernels(config.model)
    except CheckpointError as exc:
        refuse(str(exc))
    try:
        config.engine_overrides()
        config.check_ranks()
    except SettingsError as exc:
        refuse(str(exc))
    try:
        config.check()
    except SettingsError as exc:
        refuse(str(exc))
    _log_requests()
    died = False

    def on_engine_death() -> None:
        nonlocal died
        died = True
        server.should_exit = True

    try:
        backend = EngineBackend(config)
        backend.configure()
    except ClefError as exc:
        refuse(str(exc))
    except OSError as exc:  # transformers' word for a folder or Hub id without a usable tokenizer
        refuse(f"cannot load {config.model}: {str(exc).strip().splitlines()[0]}")
    except Exception:  # as an engine that fails to start: the reason in the log, a status a supervisor restarts on
        logging.getLogger("clef_vllm.server").exception("the engine failed to start")
        sys.exit(EXIT_ENGINE_DIED)
    app = create_app(backend, on_engine_death=on_engine_death)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            access_log=False,  # one line per request comes from the request-id layer, with the id
            timeout_keep_alive=int(config.idle_timeout) or 1,
            http=guarded_protocol(config.connection_limits),
            # No route speaks WebSocket: an upgrade request is answered as the plain HTTP request it also is,
            # through the app, so it gets the JSON shape and a request id like any other.
            ws="none",
        )
    )
    # A signal ends the engine's processes too, while it loads as well, before the process ends by it.
    stop = lifecycle.StopSignals(on_signal=lambda: setattr(server, "should_exit", True))
    stop.install()
    server.run()
    lifecycle.end_all_children(app.engine_start)
    stop.raise_again()
    if died:
        # Nothing is left to clean up: the interpreter's own teardown of vLLM and torch would add 1.6-2.6 s before
        # a supervisor could restart the server.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_ENGINE_DIED)


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
