"""Finding a Clef release folder: a local path, or a Hub id (with a revision) when the Hub is reachable."""

from __future__ import annotations

from pathlib import Path

from clef_vllm.errors import CheckpointError

BACKBONE_CONFIG = "config.json"


def resolve_release(source: str, revision: str | None = None) -> Path:
    """Return a local folder for `source`: the path itself if it exists, else a Hub snapshot of that id."""
    path = Path(source).expanduser()
    if path.exists():
        if not (path / BACKBONE_CONFIG).is_file():
            raise CheckpointError(f"{path} is not a release folder: it has no {BACKBONE_CONFIG}")
        return path
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise CheckpointError(f"{source} does not exist and is not a Hub id (ORG/NAME)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(source, revision=revision))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise CheckpointError(
            f"cannot fetch {source}{'@' + revision if revision else ''} from the Hub: {type(exc).__name__}"
        ) from None
