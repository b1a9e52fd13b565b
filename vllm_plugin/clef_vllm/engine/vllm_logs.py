"""vLLM's start-up warnings, each shown once per process.

vLLM repeats some warnings for every engine it starts and every time a worker touches the same setting (the
CPU worker says it cannot set the thread count eight times per start; a second engine in one process re-registers
every kernel). Each distinct warning is let through once; the few that tell a user nothing are dropped. Errors
always pass, and `VLLM_LOGGING_LEVEL=DEBUG` turns the filter off.

vLLM rebuilds its handler whenever it reconfigures logging (at every engine start, and first thing in its own
processes), so the filter is named in vLLM's default logging configuration, from which the handler is built,
and attached to the handlers and loggers that exist already (a logger keeps its filters through a
reconfiguration); again at every engine start, when the loggers of modules imported since exist.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Warnings that describe vLLM's internals, with nothing for a user to do.
SILENCED = (
    re.compile(r"CPU backend doesn't allow to use `torch\.set_num_threads`"),
    re.compile(r"Kernel \S+ is already registered\. Overwriting\."),
    re.compile(r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT"),
)
FILTER_NAME = "clef_vllm_warnings_once"
_VERDICT = "_clef_warning_verdict"  # a record reaches the filter once per logger and once per handler


class WarningsOnce(logging.Filter):
    """Lets each distinct vLLM warning (logger, message) through once; drops the silenced ones."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not record.name.startswith("vllm"):
            return True
        verdict = getattr(record, _VERDICT, None)
        if verdict is None:
            verdict = self._first_time(record)
            setattr(record, _VERDICT, verdict)
        return verdict

    def _first_time(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the format (vLLM logs a seed with %d unchecked)
            message = str(record.msg)
        if any(pattern.search(message) for pattern in SILENCED):
            return False
        key = (record.name, message)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        return True


WARNINGS_ONCE = WarningsOnce()


def show_vllm_warnings_once() -> None:
    """Attach the process's one filter to vLLM's loggers and to the handlers their records reach; idempotent."""
    if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
        return
    _name_in_vllm_logging_config()
    names = [name for name in logging.root.manager.loggerDict if name == "vllm" or name.startswith("vllm.")]
    loggers = [logging.getLogger(name) for name in names]
    handlers = [h for logger in (logging.getLogger("vllm"), logging.root) for h in logger.handlers]
    for target in (*loggers, *handlers):
        if WARNINGS_ONCE not in target.filters:
            target.addFilter(WARNINGS_ONCE)


class _Held(logging.Filter):
    """Keeps the records below ERROR that reach one handler, instead of letting them through."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        self.records.append(record)
        return False


@contextmanager
def held_vllm_warnings() -> Iterator[None]:
    """vLLM's warnings while a configuration is checked, shown only if the check passes: a refused configuration
    ends in its one error line, without the warnings vLLM printed on the way to refusing it."""
    _configure_vllm_logging()
    show_vllm_warnings_once()
    handlers = {h for logger in (logging.getLogger("vllm"), logging.root) for h in logger.handlers}
    holds = [(handler, _Held()) for handler in handlers]
    for handler, hold in holds:
        handler.addFilter(hold)
    passed = False
    try:
        yield
        passed = True
    finally:
        for handler, hold in holds:
            handler.removeFilter(hold)
            for record in hold.records if passed else ():
                handler.handle(record)


def _configure_vllm_logging() -> None:
    """vLLM's logging as its engine configuration sets it up (with the default logging settings), done now: the
    handler it would otherwise build in the middle of a check is then one of those the check holds."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(LoggingConfig())


def _name_in_vllm_logging_config() -> None:
    """Have every handler vLLM builds from its default configuration carry the filter."""
    from vllm import logger as vllm_logger

    config = getattr(vllm_logger, "DEFAULT_LOGGING_CONFIG", None)
    handler = config.get("handlers", {}).get("vllm") if isinstance(config, dict) else None
    if handler is None:
        return
    config.setdefault("filters", {})[FILTER_NAME] = {"()": lambda: WARNINGS_ONCE}
    filters = handler.setdefault("filters", [])
    if FILTER_NAME not in filters:
        filters.append(FILTER_NAME)
