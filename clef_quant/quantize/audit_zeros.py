"""Rule 2 of the load-safety audit: no block or row of a quantized weight is all zero where its bf16 source is not.

A block of FP4 or FP8 codes that are all zero reads as zeros in every engine: no NaN, no error, just outputs that
lost a row of the weight (an FP8 block scale that underflowed, a converter that dropped a range). Each quantized
weight is read once, its codes compared with zero per quantization block (NVFP4's 16 values of a row, FP8_BLOCK's
128x128 tiles, a whole row for per-channel and per-tensor scales); only where a block is all zero is the source
tensor read, from the folder the manifest names (its local path, or the local Hugging Face cache for a Hub id:
inspect downloads nothing). Without the source only whole rows are checked: a row of a trained or random weight
is never all zero, while a block of small values may round to zero honestly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.quantize.inspect_modules import ConfigSchemes
from clef_quant.quantize.inspect_report import CHECK_ZEROS, CheckResult, Violation, check_result
from clef_quant.quantize.stored_tensors import StoredTensor, read_tensor, read_tensor_index
from clef_vllm.errors import CheckpointError
from clef_vllm.format.manifest import Manifest

# Zero codes: FP8 (E4M3 or E5M2) is +0 or -0, every bit but the sign clear; a byte of packed FP4 (E2M1) holds two
# values, each zero when its three low bits are clear.
_FP8_MAGNITUDE = 0x7F
_FP4_PAIR_MAGNITUDE = 0x77
_FP8_DTYPES = ("F8_E4M3", "F8_E5M2")


@dataclass
class SourceWeights:
    """The bf16 source's tensors, read one at a time; `why_not` says why there is none to compare with."""

    folder: Path | None
    why_not: str | None
    _index: dict[str, StoredTensor] | None = field(default=None, repr=False)

    def tensor(self, name: str, shape: tuple[int, ...]) -> tuple[Any, str | None]:
        """(the source's `name`, None), or (None, why it cannot be compared) when absent or of another shape."""
        if self.folder is None:
            return None, self.why_not
        if self._index is None:
            try:
                self._index = read_tensor_index(self.folder)
            except CheckpointError as exc:
                self.folder, self.why_not = None, f"its weights are not readable ({exc})"
                return None, self.why_not
        entry = self._index.get(name)
        if entry is None:
            return None, f"the source at {self.folder} has no {name}"
        if tuple(entry.shape) != tuple(shape):
            return None, f"the source's {name} is {list(entry.shape)}, not {list(shape)}: another model"
        return read_tensor(entry, name), None


def open_source(manifest: Manifest | None) -> SourceWeights:
    """The source `clef_quant.json` names, if this machine has it; nothing is read yet."""
    if manifest is None:
        return SourceWeights(None, "no clef_quant.json names it")
    source = manifest.source
    if source.local:
        folder = Path(source.id)
        if (folder / "config.json").is_file():
            return SourceWeights(folder, None)
        return SourceWeights(None, f"the source folder {source.id} is not on this machine")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    at = f"{source.id}@{source.revision or 'main'}"
    try:
        folder = Path(snapshot_download(source.id, revision=source.revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return SourceWeights(None, f"{at} is not in the local Hugging Face cache (inspect downloads nothing)")
    return SourceWeights(folder, None)


@dataclass(frozen=True)
class _Codes:
    """Where a quantized weight's codes are non-zero, per storage unit, and how many values one unit holds."""

    nonzero: Any  # bool [rows, units]
    per_unit: int
    kind: str  # "FP4", "FP8", "INT4" ... for the message


def _codes(name: str, params: dict[str, StoredTensor], args: dict[str, Any]) -> _Codes | None:
    """The codes of `name`'s quantized weight, or None when it is not one this rule can read (an asymmetric
    integer weight's zero is its zero point, not the code 0)."""
    import torch

    packed, weight = params.get("weight_packed"), params.get("weight")
    if packed is not None and packed.dtype == "U8" and len(packed.shape) == 2:
        data = read_tensor(packed, f"{name}.weight_packed")
        return _Codes((data & _FP4_PAIR_MAGNITUDE) != 0, 2, "FP4")
    symmetric = args.get("symmetric", True) is not False
    if packed is not None and packed.dtype == "I32" and "weight_shape" in params and symmetric:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

        shape = torch.Size(read_tensor(params["weight_shape"], f"{name}.weight_shape").tolist())
        bits = int(args.get("num_bits") or 4)
        values = unpack_from_int32(read_tensor(packed, f"{name}.weight_packed"), bits, shape)
        return _Codes(values != 0, 1, f"INT{bits}")
    if weight is not None and "weight_scale" in params and len(weight.shape) == 2:
        if weight.dtype in _FP8_DTYPES:
            data = read_tensor(weight, f"{name}.weight").view(torch.uint8)
            return _Codes((data & _FP8_MAGNITUDE) != 0, 1, "FP8")
        if weight.dtype == "I8" and symmetric:
            return _Codes(read_tensor(weight, f"{name}.weight") != 0, 1, "INT8")
    return None


def _block(args: dict[str, Any], columns: int) -> tuple[int, int]:
    """(rows, columns) of the values one scale covers, rows for per-channel and per-tensor scales."""
    strategy = args.get("strategy")
    if strategy == "block" and args.get("block_structure"):
        rows, cols = args["block_structure"]
        return int(rows), int(cols)
    if strategy in ("group", "tensor_group") and args.get("group_size"):
        return 1, int(args["group_size"])
    return 1, columns


def _any_per_block(mask: Any, rows: int, cols: int) -> Any:
    """[R, C] bool: whether each `rows` x `cols` block of `mask` holds a True (edge blocks padded with False)."""
    import torch

    height, width = mask.shape
    grid = (-(-height // rows), -(-width // cols))
    if (height, width) != (grid[0] * rows, grid[1] * cols):
        padded = torch.zeros(grid[0] * rows, grid[1] * cols, dtype=torch.bool)
        padded[:height, :width] = mask
        mask = padded
    return mask.reshape(grid[0], rows, grid[1], cols).any(dim=3).any(dim=1)


def _zeroed(name: str, codes: _Codes, args: dict[str, Any], source: SourceWeights) -> str | None:
    """What of `name` is zeroed, or None. The source is read only when some block of the codes is all zero."""
    rows, units = codes.nonzero.shape
    columns = units * codes.per_unit
    block_rows, block_cols = _block(args, columns)
    if block_cols % codes.per_unit:
        block_rows, block_cols = 1, columns  # a block that splits a storage unit: compare whole rows
    zero_blocks = ~_any_per_block(codes.nonzero, block_rows, block_cols // codes.per_unit)
    zero_rows = ~codes.nonzero.any(dim=1)
    if not bool(zero_blocks.any()):
        return None
    reference, why_not = source.tensor(f"{name}.weight", (rows, columns))
    if reference is None:
        if not bool(zero_rows.any()):
            return None  # zeroed blocks inside rows that hold values: without the source they may be honest
        first = int(zero_rows.nonzero()[0])
        return (
            f"{int(zero_rows.sum())} of {rows} row(s) all zero in the {codes.kind} weight (first: row {first}); "
            f"not compared with the bf16 source: {why_not}"
        )
    source_nonzero = reference != 0
    lost = zero_blocks & _any_per_block(source_nonzero, block_rows, block_cols)
    if not bool(lost.any()):
        return None
    lost_rows = int((zero_rows & source_nonzero.any(dim=1)).sum())
    r, c = (int(i) for i in lost.nonzero()[0])
    first = f"rows {r * block_rows}-{min(rows, (r + 1) * block_rows) - 1}" if block_rows > 1 else f"row {r}"
    if block_cols == columns:  # one scale per row: a block is a row
        what = f"{lost_rows} of {rows} row(s)"
    else:
        first += f", columns {c * block_cols}-{min(columns, (c + 1) * block_cols) - 1}"
        what = f"{int(lost.sum())} block(s) of {block_rows}x{block_cols} values ({lost_rows} whole row(s))"
    return f"{what} all zero in the {codes.kind} weight where the bf16 source's are not (first: {first})"


def zero_block_violations(
    by_module: dict[str, dict[str, StoredTensor]],
    configured: ConfigSchemes,
    source: SourceWeights,
    violations: list[Violation],
    notes: list[str],
) -> CheckResult:
    """Rule 2 over every quantized weight, one tensor at a time."""
    read = 0
    for name in sorted(by_module):
        args = configured.weights(name)
        codes = _codes(name, by_module[name], args)
        if codes is None:
            continue
        read += 1
        problem = _zeroed(name, codes, args, source)
        if problem is not None:
            violations.append(Violation(CHECK_ZEROS, name, problem))
    if not read:
        return CheckResult(CHECK_ZEROS, "skipped", "no FP4, FP8 or symmetric integer weight stored")
    if source.folder is None:
        notes.append(f"the bf16 source was not compared with the quantized weights: {source.why_not}")
        detail = f"{read} quantized weight(s): no zeroed row (rows only: no bf16 source to compare blocks with)"
    else:
        detail = f"{read} quantized weight(s): no block zeroed that is not zero in the bf16 source"
    return check_result(CHECK_ZEROS, violations, detail)
