"""`scan.json`: the file a sensitivity scan writes and `quantize --scheme auto` reads.

One `UnitResult` per (layer, group, scheme); `ScanSettings` are what must match for a rerun to resume an earlier
file; `config_sha256` ties the file to one checkpoint shape. Fields added since the format began (the intervals)
have defaults, so scan.json of earlier runs still reads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from clef_quant.documents import read_document, validated
from clef_quant.quantize.errors import QuantizeError
from clef_quant.release_folder.atomic import write_json_atomic
from clef_quant.release_folder.manifest import sha256_file

SCAN_FORMAT = "clef-quant-scan/1"
SCAN_JSON = "scan.json"
SCAN_CSV = "scan.csv"
SCAN_MD = "scan.md"
SCAN_PNG = "scan.png"

# Here rather than in scan.py, which loads torch: `clef-quant scan --help` shows them and must start fast.
DEFAULT_HELDOUT = 8
DEFAULT_CALIBRATION_RECORDS = 32

# A unit's `group` and the Linear leaves of one decoder layer it quantizes together (see `scan`).
GROUPS: dict[str, tuple[str, ...]] = {
    "deltanet": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"),
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
}


class UnitResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer: int
    group: str
    scheme: str  # a scheme name of the registry (registry.py)
    modules: list[str]
    params: int
    bf16_bytes: int
    stored_bytes: int
    bytes_saved: int
    kl_mean: float
    kl_max: float
    flips: int
    questions: int
    seconds: float
    # Since intervals: the 95% interval of kl_mean over the held-out records, and per held-out record the sum of
    # its questions' KL (what a paired comparison of two units resamples). None in scans written before them.
    kl_low: float | None = None
    kl_high: float | None = None
    record_kl: list[float] | None = None


class ScanSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schemes: list[str]
    calibration_sha256: str
    calibration_records: int
    heldout: int
    max_seq_len: int


class ScanFile(BaseModel):
    """`scan.json`, validated when read back (resume, `quantize --scheme auto`)."""

    model_config = ConfigDict(extra="forbid")

    format: str
    source: str
    config_sha256: str  # of the source's config.json: a scan belongs to one checkpoint shape
    num_layers: int
    layer_types: list[str]
    settings: ScanSettings
    device: str
    units: list[UnitResult] = []
    seconds: dict[str, float] = {}
    record_questions: list[int] = []  # questions of each held-out record, in order (empty before intervals)
    intervals: dict[str, float | int] = {}  # confidence, resamples, seed of the units' intervals

    def unit(self, layer: int, group: str, scheme: str) -> UnitResult | None:
        return next(
            (u for u in self.units if (u.layer, u.group, u.scheme) == (layer, group, scheme)),
            None,
        )


def read_scan(path: Path) -> ScanFile:
    """A scan.json, validated; a broken or foreign file is a one-line error."""
    data, _ = read_document(Path(path), what="scan file", error=QuantizeError)
    scan = validated(ScanFile, data, error=QuantizeError, prefix=f"{path} is not a clef-quant scan")
    if scan.format != SCAN_FORMAT:
        raise QuantizeError(f"{path} has format {scan.format!r}; this clef-quant reads {SCAN_FORMAT}")
    return scan


def config_sha256(source_dir: Path) -> str:
    return sha256_file(Path(source_dir) / "config.json")


def write_scan(path: Path, scan_file: ScanFile) -> None:
    """Written whole or not at all: an interrupted scan never leaves a half file to resume from."""
    write_json_atomic(path, scan_file.model_dump())
