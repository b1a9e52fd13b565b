"""The sides of an evaluation (bf16 reference, noise floor, candidates): their keys, folders and encodings.

Every folder is fingerprinted and every record encoded before a model loads, so a wrong folder or a record too
long for --max-model-len stops the run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.data import EvalRecord
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.store import Rejected, record_key, side_key
from clef_quant.formatting import first_few
from clef_quant.progress import NoProgress, Progress
from clef_quant.release import resolve_release
from clef_quant.release_folder.fingerprints import FolderFingerprint, folder_fingerprint
from clef_vllm.engine.release_kernels import check_release_kernels
from clef_vllm.errors import RequestError
from clef_vllm.format.encoding import Encoding

Role = Literal["reference", "noise-floor", "candidate"]
REFERENCE_NAME = "bf16 reference"
NOISE_FLOOR_NAME = "noise floor (bf16 via plugin)"


@dataclass
class Side:
    key: str
    name: str
    role: Role
    runner: Literal["transformers", "plugin"]
    folder: Path
    fingerprint: FolderFingerprint
    settings: dict[str, Any]
    encodings: list[Encoding] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    scored: int = 0
    reused: int = 0
    seconds_scored: float = 0.0
    rejected: list[Rejected] = field(default_factory=list)  # stored lines that did not verify (scored again)
    engine: dict[str, Any] = field(default_factory=dict)  # what its started engine runs with, read from the engine

    def producer(self) -> dict[str, Any]:
        """What produces this side's probabilities, hashed into every stored line."""
        return {"model": self.fingerprint.sha256, "settings": self.settings}

    def option_counts(self, index: int) -> list[int]:
        return [len(options) for options in self.encodings[index].option_ids]


def _fingerprint(source: str, progress: Progress) -> tuple[Path, FolderFingerprint]:
    folder = resolve_release(source)
    step = f"fingerprint {folder.name}"  # a bf16 folder without a manifest is hashed whole
    progress.start(step, None)
    fingerprint = folder_fingerprint(folder)
    progress.finish(step)
    return folder, fingerprint


def plan_sides(config: EvalConfig, engine_settings: dict[str, Any], progress: Progress | None = None) -> list[Side]:
    """Reference, noise floor and candidates with their keys; every folder is checked before anything loads."""
    progress = progress or NoProgress()
    if not config.candidates:
        raise DataError("give at least one --candidate folder")
    reference, reference_fp = _fingerprint(config.reference, progress)
    reference_settings = {
        "runner": "transformers",
        "dtype": "bfloat16",
        "device": config.device,
        "max_length": config.max_model_len,
    }
    plugin_settings = {"runner": "plugin", **engine_settings, "max_length": config.max_model_len}
    sides = [
        Side(
            side_key("reference", reference_fp, reference_settings),
            REFERENCE_NAME,
            "reference",
            "transformers",
            reference,
            reference_fp,
            reference_settings,
        ),
        Side(
            side_key(f"plugin-{reference.name}", reference_fp, plugin_settings),
            NOISE_FLOOR_NAME,
            "noise-floor",
            "plugin",
            reference,
            reference_fp,
            plugin_settings,
        ),
    ]
    names = {side.name for side in sides}
    for source in config.candidates:
        folder, fingerprint = _fingerprint(source, progress)
        if fingerprint.sha256 == reference_fp.sha256:
            raise DataError(f"candidate {source} is the reference itself; its plugin row is the noise floor already")
        key = side_key(f"plugin-{folder.name}", fingerprint, plugin_settings)
        if any(side.key == key for side in sides):
            raise DataError(f"candidate {source} is given twice")
        check_release_kernels(folder)  # before the reference spends minutes scoring
        name = folder.name
        while name in names:
            name += "'"
        names.add(name)
        sides.append(Side(key, name, "candidate", "plugin", folder, fingerprint, plugin_settings))
    return sides


def encode_all(side: Side, records: Sequence[EvalRecord], encode: Callable[[Any], Encoding]) -> None:
    """Encode every record for `side`; all records that cannot be encoded are reported together."""
    problems = []
    for record in records:
        try:
            encoding = encode(record.request)
        except RequestError as exc:
            problems.append(f"{record.origin}: {exc}")
            continue
        side.encodings.append(encoding)
        side.keys.append(record_key(side.key, encoding))
    if problems:
        raise DataError(f"{len(problems)} record(s) cannot be encoded for {side.folder}: {first_few(problems, 3)}")
