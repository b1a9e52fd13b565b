"""Errors of the evaluation harness; each message is one line meant for the user as it is."""

from __future__ import annotations

from clef_vllm.errors import ClefError


class TaskFileError(ClefError):
    """A task file under eval/tasks/ that is malformed, or that does not fit its dataset's rows."""


class DatasetError(ClefError):
    """A dataset that cannot be read (Hub unreachable, missing split, missing columns, no local files)."""


class DataError(ClefError):
    """A DATA folder (build-data output) that is missing pieces or holds an invalid line."""


class RowError(TaskFileError):
    """One dataset row that a task cannot turn into a valid record (build-data skips and counts it)."""
