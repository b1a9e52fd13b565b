"""One place that turns user errors into one line on stderr and exit code 2.

Set CLEF_QUANT_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import typer

from clef_vllm.errors import USAGE_EXIT, ClefError, usage_error_line

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, hint: str | None = None) -> typer.Exit:
    """Print `message` (and a hint for the next step) and return the exit to raise."""
    typer.secho(usage_error_line(message), fg=typer.colors.RED, err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    return typer.Exit(USAGE_EXIT)


def user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so that bad input ends with one clear line, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except ClefError as exc:
            if os.environ.get("CLEF_QUANT_DEBUG"):
                raise
            raise fail(str(exc)) from None
        except KeyboardInterrupt as exc:
            # A SIGTERM while a folder is written arrives as Interrupted (a KeyboardInterrupt naming its signal);
            # exit 128 + signal as the shell reports a process the signal ended.
            signum = getattr(exc, "signum", signal.SIGINT)
            typer.echo(f"interrupted by {signal.Signals(signum).name}", err=True)
            raise typer.Exit(128 + signum) from None

    return wrapper


def read_json_file(path: str) -> object:
    """Read a JSON document from a path (or `-` for stdin), failing with one line."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
