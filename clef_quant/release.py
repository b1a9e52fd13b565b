"""Finding a Clef release folder: a local path, or a Hub id (with a revision) when the Hub is reachable."""

from __future__ import annotations

from pathlib import Path

from clef_vllm.format.release_source import fetch_release, local_release


def resolve_release(source: str, revision: str | None = None) -> Path:
    """Return a local folder for `source`: the path itself if it is a release folder, else a Hub snapshot of that
    id (`release_source` says which, and refuses what is neither)."""
    path = local_release(source)
    return path if path is not None else fetch_release(source, revision)
