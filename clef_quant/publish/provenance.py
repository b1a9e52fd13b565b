"""Where a quantized release came from, read from its manifest: the base model on the Hub and its revision, the
license (from the source's own card), the repo id the release will take, and what `quantize` recorded (recipe,
calibration, tools, the run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from clef_quant.publish.errors import PublishError
from clef_quant.release_folder.manifest import CARD_FILE, Manifest
from clef_vllm.format.release_source import is_hub_id

DEFAULT_LICENSE_HINT = "apache-2.0"
DEFAULT_RECIPE_FILE = "recipe.yaml"

_HF_CACHE_PATH = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})/?$")


def resolve_base_model(manifest: Manifest, given: str | None) -> tuple[str, str | None]:
    """(Hub id, revision) of the model this release was quantized from."""
    source = manifest.source
    source_id, revision = source.id, source.revision
    if given:
        if not is_hub_id(given):
            raise PublishError(f"--base-model must be a Hub id ORG/NAME, not {given!r}")
        return given, revision if not source.local else None
    if source_id and not source.local:
        return source_id, revision
    cached = _HF_CACHE_PATH.search(Path(source_id).as_posix()) if source_id else None
    if cached:  # a local path inside the Hugging Face cache names its repo and commit
        return f"{cached['org']}/{cached['name']}", cached["rev"]
    raise PublishError(
        f"the manifest's source is the local folder {source_id or '(unknown)'}, which names no Hub repo; "
        "pass --base-model ORG/NAME (the Hub id of the model it is a copy of)"
    )


def source_front_matter(manifest: Manifest, folder: Path | None = None) -> dict[str, Any]:
    """The Hub front matter of the source release's README, when it can be found: the copy `quantize` carried into
    the folder, else the source folder or the Hub."""
    from huggingface_hub.repocard import metadata_load

    from clef_quant.quantize.contents import SOURCE_CARD_COPY

    source = manifest.source
    source_id = source.id
    readme: Path | None = None
    if folder is not None and (Path(folder) / SOURCE_CARD_COPY).is_file():
        readme = Path(folder) / SOURCE_CARD_COPY
    elif source.local or Path(source_id).exists():
        candidate = Path(source_id) / CARD_FILE
        readme = candidate if candidate.is_file() else None
    elif is_hub_id(source_id):
        readme = _hub_readme(source_id, source.revision)
    if readme is None:
        return {}
    try:
        return metadata_load(readme) or {}
    except Exception:  # a malformed source card only means no license can be read from it
        return {}


def _hub_readme(repo_id: str, revision: str | None) -> Path | None:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, CARD_FILE, revision=revision))
    except Exception:  # offline, gated or no README: the caller asks for --license
        return None


def resolve_license(manifest: Manifest, given: str | None, front_matter: dict[str, Any]) -> dict[str, Any]:
    """`{"license", "license_name"?, "license_link"?}` for the card's front matter: --license, else the source's."""
    if given:
        return {"license": given}
    license_id = front_matter.get("license")
    if isinstance(license_id, str) and license_id:
        found = {"license": license_id}
        for key in ("license_name", "license_link"):
            if front_matter.get(key):
                found[key] = front_matter[key]
        return found
    raise PublishError(
        f"cannot tell the license of {manifest.source.id}: its README has no `license` in the front matter (or cannot "
        f"be read here); pass --license (a Hub license id, e.g. {DEFAULT_LICENSE_HINT})"
    )


def scheme_suffix(scheme: str) -> str:
    """The output-name suffix llm-compressor's examples use: fp8-dynamic -> FP8_DYNAMIC, nvfp4 -> NVFP4."""
    return scheme.upper().replace("-", "_")


def default_repo_id(base_model: str, scheme: str) -> str:
    return f"{base_model}-{scheme_suffix(scheme)}"


def manifest_facts(manifest: Manifest) -> dict[str, Any]:
    """What `quantize` recorded, as the card shows it: the local source folder (if any), the recipe, calibration
    (None when the scheme took no data), the tools with a known version, and the run."""
    source, recipe, calibration = manifest.source, manifest.recipe, manifest.calibration
    # The template reads the sections as recorded: a key an older manifest lacks stays absent, as it always was.
    return {
        "source_local": source.id if source.local else None,
        "recipe_text": recipe.text.strip(),
        "recipe_file": Path(recipe.file or DEFAULT_RECIPE_FILE).name,
        "calibration": calibration.model_dump(exclude_unset=True) if calibration.source else None,
        "tools": {k: v for k, v in manifest.tools.items() if v},
        "run": manifest.run.model_dump(exclude_unset=True),
    }
