"""What a quantized release folder holds, as plain data for its card: which Linear modules are quantized and which
stay bf16 (inspect's reading of the stored tensors), the other tensors, the head, sizes, and one row per file.

Rows carry keys (a module kind, a tensor group, a file kind); the words the card shows for them live in the
template (`model_cards/quantized_texts.j2`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clef_quant.publish.folder import staged_card_files
from clef_quant.release_folder.manifest import ASSETS_DIR, CARD_FILE, COPIED_TREES, MANIFEST_FILE, FileEntry, Manifest
from clef_vllm.head.files import HEAD_CONFIG, HEAD_SUBDIR, HEAD_WEIGHTS, find_head_dir

OTHER = "other"
# Non-Linear tensors of the backbone, by name; first match wins, the rest are OTHER.
TENSOR_GROUPS = (
    ("vision", re.compile(r"(^|\.)visual\.")),
    ("embeddings", re.compile(r"embed")),
    ("norms", re.compile(r"norm")),
    ("conv1d", re.compile(r"conv1d")),
    ("decay", re.compile(r"A_log|dt_bias")),
)
# What each file of a release is, by name; first match wins, the rest have no kind.
FILE_KINDS = (
    (re.compile(r"^model.*\.safetensors$"), "backbone_weights"),
    (re.compile(r"^model\.safetensors\.index\.json$"), "backbone_index"),
    (re.compile(r"^config\.json$"), "config"),
    (re.compile(r"^recipe\.yaml$"), "recipe"),
    (re.compile(rf"^({HEAD_SUBDIR}/)?{re.escape(HEAD_WEIGHTS)}$"), "head_weights"),  # root, or the older layout
    (re.compile(rf"^({HEAD_SUBDIR}/)?{re.escape(HEAD_CONFIG)}$"), "head_config"),
    (re.compile(r"^joint_schema_model\.py$"), "release_code"),
    (re.compile(r"^(tokenizer.*|vocab\.json|merges\.txt|special_tokens_map\.json|added_tokens\.json)$"), "tokenizer"),
    (re.compile(r"^(chat_template\..*|.*processor_config\.json|generation_config\.json)$"), "as_released"),
    (re.compile(rf"^{re.escape(MANIFEST_FILE)}$"), "manifest"),
    (re.compile(rf"^{CARD_FILE}$"), "card"),
)
# Folders the files table folds into one row each (their kind is the folder name).
FOLDED_TREES = (*COPIED_TREES, ASSETS_DIR)


def quantization_tables(report: Any) -> dict[str, Any]:
    """Rows for "what is quantized" and "what stays bf16", from inspect's reading of the stored tensors."""
    from clef_quant.quantize.schemes import BF16

    quantized: dict[tuple[str, str], list[Any]] = defaultdict(list)
    kept: dict[str, list[Any]] = defaultdict(list)
    for module in report.modules:
        if module.scheme == BF16:
            kept[module.kind].append(module)
        else:
            quantized[(module.kind, module.scheme)].append(module)
    total = sum(m.params for m in report.modules) or 1
    quantized_rows = [
        {
            "kind": kind,
            "modules": len(modules),
            "scheme": scheme,
            "params": sum(m.params for m in modules),
            "stored": modules[0].stored,
            "layers": layer_ranges(m.name for m in modules),
        }
        for (kind, scheme), modules in quantized.items()
    ]
    kept_rows = [
        {"kind": kind, "modules": len(modules), "params": sum(m.params for m in modules), "stored": modules[0].stored}
        for kind, modules in kept.items()
    ]
    quantized_params = sum(r["params"] for r in quantized_rows)
    return {
        "quantized_rows": quantized_rows,
        "kept_rows": kept_rows,
        "quantized_params": quantized_params,
        "kept_params": total - quantized_params if report.modules else 0,
        "quantized_share": quantized_params / total,
        "labels": sorted({r["scheme"] for r in quantized_rows}),
    }


def layer_ranges(names: Iterable[str]) -> str:
    """Decoder layer indices of module names as compact ranges (`0-3, 6`); empty for modules outside layers."""
    indices = sorted({int(m.group(1)) for name in names if (m := re.search(r"\.layers\.(\d+)\.", name))})
    spans: list[str] = []
    for index in indices:
        if spans and int(spans[-1].split("-")[-1]) == index - 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{index}"
        else:
            spans.append(str(index))
    return ", ".join(spans)


def other_tensors(folder: Path, report: Any) -> list[dict[str, Any]]:
    """The backbone's non-Linear tensors by group (embeddings, norms, ...), with their stored dtypes."""
    from clef_quant.quantize.stored_tensors import read_tensor_index

    linear = {m.name for m in report.modules}
    groups: dict[str, dict[str, Any]] = {}
    for key, entry in read_tensor_index(folder).items():
        if key.rsplit(".", 1)[0] in linear:
            continue
        label = next((name for name, pattern in TENSOR_GROUPS if pattern.search(key)), OTHER)
        group = groups.setdefault(label, {"group": label, "tensors": 0, "params": 0, "dtypes": set()})
        group["tensors"] += 1
        group["params"] += _numel(entry.shape)
        group["dtypes"].add(entry.dtype)
    order = [name for name, _ in TENSOR_GROUPS] + [OTHER]
    rows = sorted(groups.values(), key=lambda g: order.index(g["group"]))
    for row in rows:
        row["dtypes"] = ", ".join(sorted(row["dtypes"]))
    return rows


def head_summary(folder: Path) -> dict[str, Any]:
    """Parameters and stored dtypes of the joint schema head, and its config."""
    from safetensors import safe_open

    head_dir = find_head_dir(folder)
    path = head_dir / HEAD_WEIGHTS
    params, dtypes = 0, set()
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
            tensor = handle.get_slice(key)
            params += _numel(tuple(tensor.get_shape()))
            dtypes.add(tensor.get_dtype())
    config = json.loads((head_dir / HEAD_CONFIG).read_text(encoding="utf-8"))
    return {"params": params, "dtypes": ", ".join(sorted(dtypes)), "config": config}


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def backbone_bytes(files: dict[str, FileEntry]) -> int:
    """Bytes of the backbone's safetensors files (the top-level ones but the head's)."""
    return sum(
        e.size
        for name, e in files.items()
        if "/" not in name and name.endswith(".safetensors") and file_kind(name) != "head_weights"
    )


def head_bytes(files: dict[str, FileEntry]) -> int:
    """Bytes of the head's two files, at the root or in an older release's `clef_head/`."""
    return sum(e.size for name, e in files.items() if file_kind(name) in ("head_weights", "head_config"))


def source_backbone_bytes(manifest: Manifest) -> int | None:
    """Bytes of the bf16 source's safetensors, when the source is a local folder that is still there."""
    path = Path(manifest.source.id)
    if not manifest.source.local or not path.is_dir():
        return None
    from clef_quant.quantize.release_files import backbone_bytes as folder_backbone_bytes

    return folder_backbone_bytes(path) or None


def files_table(manifest_files: dict[str, FileEntry], staged: dict[str, int]) -> list[dict[str, Any]]:
    """One row per file the release holds (each folded tree one row); `kind` says what the file is for."""
    rows: list[dict[str, Any]] = []
    trees: dict[str, list[int]] = defaultdict(list)
    entries: dict[str, tuple[int, str | None]] = {name: (e.size, e.sha256) for name, e in manifest_files.items()}
    entries.update({name: (size, None) for name, size in staged.items()})
    for name, (size, sha) in sorted(entries.items(), key=lambda item: (item[0].count("/") > 0, item[0])):
        top = name.split("/", 1)[0]
        if top in FOLDED_TREES and "/" in name:
            trees[top].append(size)
            continue
        rows.append({"name": name, "size": size, "sha256": sha[:12] if sha else "", "kind": file_kind(name)})
    for tree, sizes in trees.items():
        rows.append({"name": f"{tree}/ ({len(sizes)} files)", "size": sum(sizes), "sha256": "", "kind": tree})
    for name in (CARD_FILE, MANIFEST_FILE):  # written after this table: no size or hash to show yet
        rows.append({"name": name, "size": None, "sha256": "", "kind": file_kind(name)})
    return rows


def file_kind(name: str) -> str:
    return next((kind for pattern, kind in FILE_KINDS if pattern.match(name)), "")


def staged_sizes(staging: Path) -> dict[str, int]:
    """Size of every card file under `staging`, by its path relative to it (the writer marker is no card file)."""
    return {name: (staging / name).stat().st_size for name in staged_card_files(staging)}
