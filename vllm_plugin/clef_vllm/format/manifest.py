"""`clef_quant.json`, the manifest of a quantized release, typed: the one shape that clef-quant writes and
reads and that the server reads (`server/model_info.py`). clef-quant builds, hashes and verifies it
(`clef_quant/release_folder/manifest.py`); here is only what the file holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from clef_vllm.errors import CheckpointError, first_validation_error

MANIFEST_FILE = "clef_quant.json"
MANIFEST_FORMAT = "clef-quant-manifest/1"
CARD_SECTION = "card"


class ManifestError(CheckpointError):
    """A manifest that does not parse or does not validate."""


# Every section keeps what it does not name (`extra="allow"`) and writes back only the keys it was given
# (`to_json`), so a manifest read and written again is the file it was, whichever clef-quant wrote it.
_SECTION = ConfigDict(extra="allow")


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    size: StrictInt = Field(ge=0)


class IncludedEntry(BaseModel):
    """A file (or FILE:KEY) that may run code and is in the release on purpose."""

    model_config = ConfigDict(extra="forbid")

    path: StrictStr
    why: StrictStr


class SourceEntry(BaseModel):
    """The checkpoint quantized: a Hub id at a revision, or a local folder."""

    model_config = _SECTION

    id: StrictStr = ""
    revision: StrictStr | None = None
    local: bool = False


class RecipeEntry(BaseModel):
    """The recipe as llm-compressor ran it: where it came from, its filled text and the values filled in."""

    model_config = _SECTION

    file: StrictStr = ""
    text: StrictStr = ""
    variables: dict[str, Any] = {}
    # True for the recipe a `--scheme` ships with clef-quant, False for a `--recipe` file or an auto mix (whose
    # `file` is the scan it came from). None in manifests written before it was recorded (clef-quant's
    # `is_shipped_recipe` reads the path then).
    shipped: bool | None = None


class CalibrationEntry(BaseModel):
    """What calibration saw (`quantize.calibration.CalibrationSummary`); `source` None when no data was used."""

    model_config = _SECTION

    source: StrictStr | None = None
    sha256: StrictStr | None = None
    records: int = 0
    tokens: int = 0
    max_seq_len: int | None = None
    requested: int | None = None
    available: int = 0
    truncated: int = 0
    skipped: dict[str, int] = {}
    seed: int | None = None


class RunEntry(BaseModel):
    """Where and how long `quantize` ran."""

    model_config = _SECTION

    device: StrictStr | None = None
    path: StrictStr | None = None  # "streaming" or "oneshot"
    created: StrictStr | None = None
    seconds: dict[str, int | float] = {}
    peak_host_bytes: int | None = None
    peak_gpu_bytes: int | None = None


class CardResultsEntry(BaseModel):
    model_config = _SECTION

    folder: StrictStr | None = None
    sha256: StrictStr | None = None


class CardEntry(BaseModel):
    """What `card` recorded: the files it added (which it owns and replaces) and what the card was made from."""

    model_config = _SECTION

    files: list[StrictStr] = []
    created: StrictStr | None = None
    clef_quant: StrictStr | None = None
    repo_id: StrictStr | None = None
    base_model: StrictStr | None = None
    license: StrictStr | None = None
    results: CardResultsEntry | None = None
    throughput: StrictStr | None = None


def _safe_relative(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{name!r} is not a path inside the folder")
    return name


class Manifest(BaseModel):
    """`clef_quant.json`, typed: what `quantize` writes and every reader uses; sections other tools add are kept."""

    model_config = _SECTION

    format: Literal["clef-quant-manifest/1"]
    source: SourceEntry
    scheme: StrictStr
    recipe: RecipeEntry
    tools: dict[str, StrictStr | None]
    calibration: CalibrationEntry
    run: RunEntry
    included: list[IncludedEntry] = []
    files: dict[str, FileEntry]
    card: CardEntry | None = None

    @field_validator("files")
    @classmethod
    def _paths_inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            _safe_relative(name)
            if name == MANIFEST_FILE:
                raise ValueError(f"lists {MANIFEST_FILE} itself")
        return files

    def to_json(self) -> dict[str, Any]:
        """The manifest as written: the keys it was made or read with, in the order `quantize` writes them."""
        return self.model_dump(mode="json", exclude_unset=True)

    def with_card(self, files: Mapping[str, FileEntry | Mapping[str, Any]], card: Mapping[str, Any]) -> Manifest:
        """This manifest with `card`'s section and the file list it leaves behind."""
        entries = {name: e.model_dump() if isinstance(e, FileEntry) else dict(e) for name, e in files.items()}
        data = {**self.to_json(), "files": dict(sorted(entries.items())), CARD_SECTION: dict(card)}
        return validated(data, f"refusing to write an invalid {MANIFEST_FILE}")


def validated(data: Mapping[str, Any], prefix: str) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"{prefix}: {first_validation_error(exc)}") from None
