"""What the bench commands share: the command line a report records, the release check with its hint, the
`--mode` option, and how a run ends when a server it started ended by itself or the run was stopped early."""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from clef_quant.bench.errors import BenchError
from clef_quant.bench.modes import MODE_NAMES
from clef_quant.bench.releases import check_release
from clef_quant.cli._errors import fail
from clef_quant.cli._options import name_choice


def command_line() -> str:
    """The command as the user typed it, for the report."""
    return shlex.join(["clef-quant", *sys.argv[1:]])


def require_release(folder: Path, hint: str | None = None) -> None:
    """The library's check of a release folder, with the next step to take when it is not one."""
    try:
        check_release(folder)
    except BenchError as exc:
        raise fail(str(exc), hint=hint) from None


@contextlib.contextmanager
def server_exits() -> Iterator[None]:
    """A server that ended by itself ends the command with its reason, one line (exit 1: a failed run)."""
    from clef_quant.bench.processes import ServerExited

    try:
        yield
    except ServerExited as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


@contextlib.contextmanager
def report_written(write: Callable[[], list[Path]]) -> Iterator[None]:
    """Write the report when the block ends, also when it ends early (what was measured until then)."""
    try:
        yield
    finally:
        typer.echo(f"wrote {' and '.join(map(str, write()))}")


def mode_option(help_text: str) -> Any:
    """`--mode MODE`, repeatable: one of the serving modes of `clef_quant.bench.modes`, any other refused by name."""
    return typer.Option(
        "--mode", metavar="MODE", parser=name_choice(MODE_NAMES, "unknown mode {value!r}"), help=help_text
    )
