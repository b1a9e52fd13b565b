"""The source's backbone shards, checked from their headers before `quantize` claims its output or loads anything.

safetensors' own errors name no file ("incomplete metadata, file not fully covered") and surface late: on the
streaming path when a shard is first read, on the loaded path deep inside transformers' loading, whose lenient
reading of an index also let an index naming a missing shard, or a shard that does not hold a tensor, pass. Here
each shard's header is read by hand (an 8-byte little-endian length, then JSON) and checked against the file's
size the way safetensors checks it (offsets contiguous from 0, each tensor's byte count what its dtype and shape
need, the last one ending at the end of the file), and every name the index gives a shard must be in that
shard's header. Only the headers are read, so a 20 GB source is checked in well under a second, and a cut,
foreign or mis-indexed file is refused in one line naming it (and the tensor, where one is involved).

A shard that changes after this check is still one line: `shard_read_errors` and `backbone_read_errors` wrap the
reads themselves.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from clef_quant.documents import parse_json, read_document
from clef_quant.quantize.errors import QuantizeError

SINGLE_SHARD = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors refuses a longer header before reading it (its MAX_HEADER_SIZE); so does this check, which also
# keeps a forged length (random bytes, 10^12) from being read or allocated.
MAX_HEADER_BYTES = 100_000_000
LENGTH_BYTES = 8

# Bits per element of every dtype safetensors writes (sub-byte FP4/FP6 are packed); a dtype not listed is left
# to safetensors, whose refusal `shard_read_errors` turns into one line.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32, "U64": 64, "I64": 64, "F64": 64,
    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


@dataclass
class ShardedSource:
    """The backbone's safetensors shards of a source folder and which shard holds each tensor."""

    shards: dict[str, Path]  # shard file name -> path
    weight_map: dict[str, str]  # tensor name -> shard file name


def sharded_source(source_dir: Path) -> ShardedSource:
    """The shards the index names (or the single `model.safetensors`), each header checked against its file and
    every indexed name found in its shard; the head's files are not among them."""
    index = source_dir / INDEX_FILE
    if index.is_file():
        weight_map = _index_weight_map(index)
    elif (source_dir / SINGLE_SHARD).is_file():
        weight_map = dict.fromkeys(shard_header(source_dir / SINGLE_SHARD), SINGLE_SHARD)
    else:
        raise QuantizeError(f"{source_dir} has neither {INDEX_FILE} nor {SINGLE_SHARD}")
    shards = {name: source_dir / name for name in sorted(set(weight_map.values()))}
    for name, path in shards.items():
        if not path.is_file():
            raise QuantizeError(f"{index} names {name}, which is not a file in {source_dir}")
        held = shard_header(path)
        absent = sorted(tensor for tensor, shard in weight_map.items() if shard == name and tensor not in held)
        if absent:
            more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
            raise QuantizeError(f"{index} maps {absent[0]}{more} to {path}, which does not hold it")
    return ShardedSource(shards=shards, weight_map=weight_map)


def _index_weight_map(index: Path) -> dict[str, str]:
    data, _ = read_document(index, what="the weights index", error=QuantizeError)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and isinstance(shard, str) for name, shard in weight_map.items()
    ):
        raise QuantizeError(f"{index} is not a safetensors index (no weight_map of tensor names to file names)")
    for shard in set(weight_map.values()):
        # Names are read inside the folder only: an absolute path or `..` would read a file of someone else's.
        parts = PurePosixPath(shard).parts
        if not parts or PurePosixPath(shard).is_absolute() or ".." in parts or "\\" in shard:
            raise QuantizeError(f"{index} names {shard!r}, which is not a file name inside the folder")
    return weight_map


def shard_header(path: Path) -> dict[str, dict[str, Any]]:
    """`path`'s tensor entries (name -> dtype, shape, data_offsets), refused unless they describe the file exactly."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(LENGTH_BYTES)
            (length,) = struct.unpack("<Q", head) if len(head) == LENGTH_BYTES else (None,)
            if length is None or length > size - LENGTH_BYTES or length > MAX_HEADER_BYTES:
                raise QuantizeError(f"{path} is not a safetensors file: {_bad_length(length, size)}")
            raw = handle.read(length)
    except OSError as exc:
        raise QuantizeError(f"cannot read {path}: {exc.strerror}") from None
    header = parse_json(raw, where=f"{path}'s safetensors header", error=QuantizeError)
    if not isinstance(header, dict):
        raise QuantizeError(f"{path}'s safetensors header is not a JSON object")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    for name, entry in tensors.items():
        problem = _entry_problem(entry)
        if problem is not None:
            raise QuantizeError(f"{path}: tensor {name}: {problem}")
    _check_layout(path, tensors, data_bytes=size - LENGTH_BYTES - length)
    return tensors


def _bad_length(length: int | None, size: int) -> str:
    if length is None:
        return f"{size} bytes, shorter than the 8-byte header length"
    if length > MAX_HEADER_BYTES:
        return f"its first 8 bytes give a header of {length:,} bytes, over safetensors' limit of {MAX_HEADER_BYTES:,}"
    return f"its first 8 bytes give a header of {length:,} bytes, and the file holds {size:,}"


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "its header entry is not an object"
    shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    if not isinstance(dtype, str):
        return "no dtype"
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        return f"shape {shape!r} is not a list of sizes"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int and n >= 0 for n in offsets)
        or offsets[0] > offsets[1]
    ):
        return f"data_offsets {offsets!r} is not [begin, end]"
    bits = DTYPE_BITS.get(dtype)
    elements = 1
    for n in shape:
        elements *= n
    held = offsets[1] - offsets[0]
    if bits is not None and 8 * held != elements * bits:
        return f"{held:,} bytes of data where its shape {shape} of {dtype} needs {elements * bits / 8:,g}"
    return None


def _check_layout(path: Path, tensors: dict[str, dict[str, Any]], data_bytes: int) -> None:
    """The tensors' data must tile the bytes after the header, as safetensors requires before it reads any."""
    end = 0
    for name, entry in sorted(tensors.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, stop = entry["data_offsets"]
        if begin != end:
            raise QuantizeError(f"{path}: tensor {name}'s data starts at byte {begin:,} of the data, not {end:,}")
        if stop > data_bytes:
            raise QuantizeError(
                f"{path} is cut short: tensor {name}'s data ends {stop - data_bytes:,} bytes past the end of the file"
            )
        end = stop
    if end != data_bytes:
        raise QuantizeError(f"{path} holds {data_bytes - end:,} bytes after the last tensor's data")


@contextmanager
def shard_read_errors(path: Path | str) -> Iterator[None]:
    """Reading the shard `path` fails with one line naming it: its header is checked again (the file may have
    changed since `sharded_source` passed it), else safetensors' or the system's reason is given."""
    with _read_errors(f"cannot read {path}", lambda: shard_header(Path(path))):
        yield


@contextmanager
def backbone_read_errors(source_dir: Path) -> Iterator[None]:
    """Loading the backbone of `source_dir` (transformers reads the shards itself and names none in its errors)
    fails with one line: every shard is checked again to name the one that fails, else the folder is named."""
    with _read_errors(f"cannot read the backbone of {source_dir}", lambda: sharded_source(source_dir)):
        yield


@contextmanager
def _read_errors(prefix: str, recheck: Callable[[], object]) -> Iterator[None]:
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
    else:
        return
    recheck()  # raises naming the file and tensor when the failure shows in a header
    raise QuantizeError(f"{prefix}: {reason}")
