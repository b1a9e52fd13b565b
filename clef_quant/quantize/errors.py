"""Errors of the quantize flow that are the user's to fix (shown as one line, exit 2)."""

from __future__ import annotations

from clef_vllm.errors import ClefError


class QuantizeError(ClefError):
    """Bad quantize input: a scheme, recipe, calibration file or output folder that cannot be used."""
