"""Errors of writing a release folder: one a user fixes (exit 2), and the signal that stopped a write."""

from __future__ import annotations

from clef_vllm.errors import ClefError


class ReleaseFolderError(ClefError):
    """An output folder that cannot be written: it exists, or another run is (or may be) writing it."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); everything it wrote has been removed.

    A KeyboardInterrupt so that code which already treats Ctrl-C as "stop now" treats SIGTERM the same way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
