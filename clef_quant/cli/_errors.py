"""One place that turns user errors into one line on stderr and exit code 2.

Both kinds end the same way: ours (`fail`, a `ClefError` from a command) and the command line parser's own
refusals (an unknown command or option, a missing argument, `--seed abc`), which Typer would otherwise draw as a
boxed usage panel. Set CLEF_QUANT_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from clef_vllm.errors import USAGE_EXIT, ClefError, usage_error_line

try:  # recent Typer carries its own copy of click, whose exceptions are the ones raised
    from typer._click import exceptions as parser_errors
except ImportError:  # older Typer runs on click itself
    from click import exceptions as parser_errors  # type: ignore[no-redef]

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, hint: str | None = None) -> typer.Exit:
    """Print `message` (and a hint for the next step) and return the exit to raise."""
    typer.secho(usage_error_line(message), fg=typer.colors.RED, err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    return typer.Exit(USAGE_EXIT)


def run_command(main: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
    """Run a Typer command's (or group's) `main`, the parser's refusals ending like ours: one `error:` line, exit 2."""
    try:
        status = main(*args, standalone_mode=False, **kwargs)
    except parser_errors.NoArgsIsHelpError as exc:
        sys.exit(exc.exit_code)  # the help is already printed: asking for nothing is asking for it
    except parser_errors.ClickException as exc:
        typer.secho(usage_error_line(exc.format_message()), fg=typer.colors.RED, err=True)
        sys.exit(USAGE_EXIT)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    # Without standalone mode an Exit comes back as its code and a finished command as its return value.
    sys.exit(status if isinstance(status, int) else 0)


class OneLineUsageErrors(TyperGroup):
    """The top command group, whose `main` runs through `run_command`."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        run_command(super().main, *args, **kwargs)


def user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so that bad input ends with one clear line, never a traceback, and SIGTERM ends it as
    Ctrl-C does: the engines and servers it started are stopped, not left running without it."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from clef_quant.release_folder.signals import signals_raise

        try:
            with signals_raise():
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
    """Read a request body from a path (or `-` for stdin) as the server reads one (strict JSON, nesting limited),
    failing with one line that names the file."""
    from clef_vllm.errors import RequestError
    from clef_vllm.format.strict_json import loads

    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}") from None
    try:
        return loads(raw)
    except RequestError as exc:
        # The server's wording names the body ("body is not valid JSON: ..."); here the body is a file.
        message = exc.message
        where = f"{path}{message[len('body') :]}" if message.startswith("body") else f"{path}: {message}"
        raise fail(where) from None
