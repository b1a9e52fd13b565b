"""What `/v1/models` says about the served folder: a model name (never a path), a description, a release date.

The name comes from `--served-model-name`, else the model card's front matter (`model_name`), else the
repository id recorded in the folder's `clef_quant.json` manifest by `clef-quant card`, else the folder's own
name; for a Hub id it is the id. The description and date come from the manifest (scheme, source, when it
was made), else from the folder itself.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clef_vllm.format.manifest import MANIFEST_FILE, Manifest

CARD_FILE = "README.md"
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    release_date: str  # YYYY-MM-DD
    created: int  # Unix seconds, for the OpenAI-shaped list


def _manifest(folder: Path) -> Manifest | None:
    """The folder's manifest, or None: a broken one only means the list says less (`inspect` reports it)."""
    try:
        return Manifest.model_validate_json((folder / MANIFEST_FILE).read_bytes())
    except (OSError, ValidationError):
        return None


def _front_matter(path: Path) -> dict[str, str]:
    try:
        match = _FRONT_MATTER.match(path.read_text(encoding="utf-8"))
    except OSError:
        return {}
    if match is None:
        return {}
    fields = {}
    for line in match.group(1).splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith((" ", "-")):
            fields[key.strip()] = value.strip().strip("'\"")
    return fields


def _date(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def model_info(model: str, served_name: str | None = None) -> ModelInfo:
    folder = Path(model)
    if not folder.is_dir():
        return ModelInfo(served_name or model, f"Clef model {model}", "", 0)
    manifest = _manifest(folder)
    card = manifest.card if manifest is not None else None
    front = _front_matter(folder / CARD_FILE)
    repo_id = card.repo_id if card is not None else None
    name = served_name or front.get("model_name") or repo_id or folder.resolve().name
    when = _date(card.created if card is not None else None) or _date(manifest.run.created if manifest else None)
    if when is None:
        config = folder / "config.json"
        stamp = (config if config.exists() else folder).stat().st_mtime
        when = datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC)
    scheme = manifest.scheme if manifest is not None else None
    origin = manifest.source.id if manifest is not None else ""
    if (manifest is not None and manifest.source.local) or Path(origin).is_absolute():
        origin = Path(origin).name  # a model name, not a path on the machine that quantized it
    if scheme and origin:
        description = f"{origin} quantized to {scheme} with clef-quant"
    elif scheme:
        description = f"Clef checkpoint quantized to {scheme} with clef-quant"
    else:
        description = front.get("description") or "Clef joint-schema decision model served by clef-systemone"
    return ModelInfo(str(name), str(description), when.date().isoformat(), int(when.timestamp()))
