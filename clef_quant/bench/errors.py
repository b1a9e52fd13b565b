"""Errors of the benchmarks that are the user's to fix (shown as one line, exit 2)."""

from __future__ import annotations

from clef_vllm.errors import ClefError


class BenchError(ClefError):
    """Bad benchmark input: a report that cannot be written, a saved report that cannot be read, an unknown mode."""
