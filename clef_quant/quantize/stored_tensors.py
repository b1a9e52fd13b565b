"""The tensors of a safetensors checkpoint folder, read from the file headers, and what each Linear stores."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_vllm.errors import CheckpointError


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_tensor_index(folder: Path) -> dict[str, StoredTensor]:
    """Name -> (file, dtype, shape) for every tensor of the backbone files in `folder` (headers only); the head's
    file at the root is not one of them."""
    from safetensors import safe_open

    from clef_quant.quantize.release_files import backbone_weight_files

    files = backbone_weight_files(Path(folder))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors files")
    index: dict[str, StoredTensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    tensor = handle.get_slice(key)
                    index[key] = StoredTensor(path, tensor.get_dtype(), tuple(tensor.get_shape()))
        except Exception as exc:  # safetensors raises its own error types for a truncated or foreign file
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None
    return index


def read_tensor(entry: StoredTensor, name: str) -> Any:
    from safetensors import safe_open

    with safe_open(str(entry.file), framework="pt") as handle:
        return handle.get_tensor(name)


def group_by_module(index: dict[str, StoredTensor]) -> dict[str, dict[str, StoredTensor]]:
    modules: dict[str, dict[str, StoredTensor]] = defaultdict(dict)
    for key, entry in index.items():
        if "." in key:
            prefix, param = key.rsplit(".", 1)
            modules[prefix][param] = entry
    return modules


def describe_stored(params: dict[str, StoredTensor]) -> str:
    if "weight_packed" in params:
        scale = params.get("weight_scale")
        # pack-quantized INT4 stores eight values per int32 (and the dense shape); NVFP4 two per uint8
        packed = "int4 packed" if "weight_shape" in params else "fp4 packed"
        return packed + (f" + {scale.dtype} scales" if scale is not None else "")
    weight = params["weight"]
    if "weight_scale" in params:
        return f"{weight.dtype} + {params['weight_scale'].dtype} scales"
    return weight.dtype


def dense_shape(name: str, params: dict[str, StoredTensor]) -> tuple[int, ...]:
    if "weight_shape" in params:  # int packing (pack-quantized) stores the dense shape as a tensor
        return tuple(int(v) for v in read_tensor(params["weight_shape"], f"{name}.weight_shape").tolist())
    if "weight_packed" in params:
        rows, packed_cols = params["weight_packed"].shape
        return (rows, packed_cols * 2)  # NVFP4: two FP4 values per byte
    return params["weight"].shape
