"""Errors of the publishing flow that are the user's to fix (shown as one line, exit 2)."""

from __future__ import annotations

from clef_vllm.errors import ClefError


class PublishError(ClefError):
    """A folder, results file or Hub setting that cannot be published as asked."""
