"""What names a Clef release: a local folder holding its `config.json`, or a Hub id `ORG/NAME`.

One rule for every front end (`clef-systemone`, `ClefEngine`, every `clef-quant` command that reads a release):
a path that exists must be a release folder; anything else must be shaped like a Hub id, which is looked up only
later, when the Hub is reachable. Neither is refused with one line naming what was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clef_vllm.errors import CheckpointError

BACKBONE_CONFIG = "config.json"


def is_hub_id(text: str) -> bool:
    """`ORG/NAME`, both parts non-empty; a path (`./x`, `/x`, `~/x`) is never a Hub id."""
    org, slash, name = text.partition("/")
    return bool(slash and org and name) and "/" not in name and not text.startswith((".", "~"))


def local_release(source: str | Path) -> Path | None:
    """The release folder `source` names, or None when it is a Hub id; `CheckpointError` when it is neither."""
    path = Path(source).expanduser()
    if path.exists():
        if not (path / BACKBONE_CONFIG).is_file():
            raise CheckpointError(f"{path} is not a release folder: it has no {BACKBONE_CONFIG}")
        return path
    if not is_hub_id(str(source)):
        raise CheckpointError(f"{source} does not exist and is not a Hub id (ORG/NAME)")
    return None


def fetch_release(source: str, revision: str | None = None, allow_patterns: Sequence[str] | None = None) -> Path:
    """The local snapshot of Hub id `source` (only the files matching `allow_patterns`, when given); a Hub that
    cannot be reached, or a repository or revision it does not have, is one `CheckpointError` line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = list(allow_patterns) if allow_patterns is not None else None
    try:
        return Path(snapshot_download(source, revision=revision, allow_patterns=patterns))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise CheckpointError(
            f"cannot fetch {source}{'@' + revision if revision else ''} from the Hub: {type(exc).__name__}"
        ) from None
