"""Finding a Clef release folder: a local path, or a Hub id (with a revision) when the Hub is reachable."""

from __future__ import annotations

from pathlib import Path

from clef_vllm.errors import CheckpointError
from clef_vllm.release_source import local_release


def resolve_release(source: str, revision: str | None = None) -> Path:
    """Return a local folder for `source`: the path itself if it is a release folder, else a Hub snapshot of that
    id (`release_source` says which, and refuses what is neither)."""
    path = local_release(source)
    if path is not None:
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(source, revision=revision))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise CheckpointError(
            f"cannot fetch {source}{'@' + revision if revision else ''} from the Hub: {type(exc).__name__}"
        ) from None
