"""Ctrl-C and SIGTERM while a folder is being written: they raise, so the code that removes the unfinished folder
runs, and a second signal cannot cut that removal short."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from clef_quant.release_folder.errors import Interrupted

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
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM do nothing for the block (main thread only): for cleanup that must not stop half-way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
