"""What a command shows on stderr while it works, in one style: a bar for each task the library reports through
`clef_quant.progress` (counted in steps or bytes, or a spinner with its time for work that counts nothing), one
spinner line naming the current task for runs made only of such work (the benchmarks), and the underlying tools'
own output held back unless --verbose. Standard output keeps only the results.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from clef_quant.formatting import decimal_size
from clef_quant.progress import BYTES
from clef_vllm.errors import ClefError

# What the underlying tools print (loguru INFO lines, tqdm bars, vLLM's and transformers' INFO logs) is hidden
# unless --verbose; each reads its level when first imported, which happens inside the run.
LLM_COMPRESSOR_QUIET = {"LLM_COMPRESSOR_LOG_LEVEL": "ERROR"}
VLLM_QUIET = {"VLLM_LOGGING_LEVEL": "WARNING"}
TRANSFORMERS_QUIET = {"TRANSFORMERS_VERBOSITY": "error"}


def stderr_console() -> Console:
    return Console(file=sys.stderr)


class _Amount(MofNCompleteColumn):
    """`done/total`; sizes for a task counted in bytes; nothing for one that counts no steps."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit")
        if unit == BYTES:
            done, total = int(task.completed), int(task.total or 0)
            return Text(f"{decimal_size(done)} / {decimal_size(total)}", style="progress.download")
        return Text("") if unit is None else super().render(task)


class RichProgress:
    """One bar per named task; it draws on a stderr console so that stdout keeps only the results."""

    def __init__(self, console: Console | None = None, *, transient: bool = False) -> None:
        self._bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            _Amount(),
            TimeElapsedColumn(),
            console=console or stderr_console(),
            transient=transient,
            redirect_stderr=False,
            redirect_stdout=False,
        )
        self._ids: dict[str, Any] = {}
        self._drawing = False

    # The display starts with the first task: a run refused before any work leaves its one error line alone,
    # without the empty line a display that never drew anything prints when it stops.
    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._drawing:
            self._bars.__exit__(*exc)

    def start(self, task: str, total: int | None = None, unit: str = "") -> None:
        if not self._drawing:
            self._bars.__enter__()
            self._drawing = True
        # unit None marks a task that counts nothing: it shows its time, not "1/1".
        self._ids[task] = self._bars.add_task(task, total=total, unit=unit if total is not None else None)

    def advance(self, task: str, amount: int = 1) -> None:
        if task in self._ids:
            self._bars.advance(self._ids[task], amount)

    def finish(self, task: str) -> None:
        if task in self._ids:
            task_id = self._ids[task]
            total = self._bars.tasks[task_id].total
            if total is None:
                self._bars.update(task_id, total=1, completed=1)
            else:
                self._bars.update(task_id, completed=total)


class _StageLine:
    """The progress protocol as one spinner line that names the task running now."""

    def __init__(self, status: Any) -> None:
        self._status = status

    def start(self, task: str, total: int | None = None, unit: str = "") -> None:
        self._status.update(task)

    def advance(self, task: str, amount: int = 1) -> None:
        pass

    def finish(self, task: str) -> None:
        pass


@contextmanager
def stage_line(first: str) -> Iterator[_StageLine]:
    """One line on stderr, `first` until the run starts its first task; it is gone when the run ends (and never
    drawn when stderr is not a terminal), so a benchmark's terminal output is its results alone."""
    with stderr_console().status(first) as status:
        yield _StageLine(status)


def quiet_tools(verbose: bool, *settings: Mapping[str, str]) -> None:
    """Lower the tools' log levels (unless the user set them, or asked for --verbose); vLLM's logs go to stderr
    either way (its default is stdout, which keeps only the results)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if verbose:
        return
    for setting in settings:
        for key, value in setting.items():
            os.environ.setdefault(key, value)


@contextmanager
def held_tool_output(verbose: bool) -> Iterator[None]:
    """Hold back what the tools write to Python's stderr (tqdm bars, warnings) so the bars stay readable.

    On an unexpected failure the held-back text is printed after all: it is the context of the traceback."""
    if verbose:
        yield
        return
    held = io.StringIO()
    real = sys.stderr
    try:
        with redirect_stderr(held):
            yield
    except (ClefError, KeyboardInterrupt, typer.Exit):
        raise
    except BaseException:
        real.write(held.getvalue())
        raise


@contextmanager
def quantization_bars(verbose: bool) -> Iterator[RichProgress]:
    """Bars for a quantize or scan run, with llm-compressor's own output held back unless --verbose."""
    quiet_tools(verbose, LLM_COMPRESSOR_QUIET)
    console = stderr_console()  # bound now: the real stderr, not the capture below
    with held_tool_output(verbose), RichProgress(console) as progress:
        yield progress
