"""Raw request-body pieces for the strict-JSON tests, in-process and against a running server."""

from __future__ import annotations

NOUL = b'"questions": {"q": {"type": "noul"}}'


def deep(levels: int, closed: bool = True) -> bytes:
    """`levels` nested JSON arrays; left open (no closing brackets) when `closed` is False."""
    return b"[" * levels + (b"]" * levels if closed else b"")
