"""Ctrl-C and SIGTERM during `quantize`: they raise, so the run's `DIR.partial` is removed, and a second one
cannot cut that removal short."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clef_quant.quantize import writer
from clef_quant.quantize.errors import Interrupted

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread, so cleanup runs; restored afterwards."""
    # Python accepts signal handlers only in the main thread; elsewhere the caller's own handling stays.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, handler) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


@contextmanager
def cleanup_on_failure(partial: Path) -> Iterator[None]:
    """Remove `partial` when the block raises anything, Interrupted and KeyboardInterrupt included."""
    try:
        yield
    except BaseException:
        # A second Ctrl-C must not cut the cleanup short.
        with _signals_ignored():
            writer.remove_partial(partial)
        raise


@contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
