"""The files of a quantized release besides the backbone's weights and config: the source's files it carries, the
weights index and `recipe.yaml`; and the size of its backbone."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from clef_quant.quantize.contents import BACKBONE_OUTPUTS, ReleaseContents, strip_remote_code_keys
from clef_quant.quantize.recipes import AUTO_SCHEME, Recipe
from clef_quant.release_folder.atomic import write_json_atomic
from clef_quant.release_folder.writer import OWNER_FILE
from clef_vllm.head.files import HEAD_WEIGHTS

GENERATION_CONFIG = "generation_config.json"  # save_pretrained writes one; the source's replaces it when there
WEIGHTS_INDEX = "model.safetensors.index.json"
RECIPE_FILE = "recipe.yaml"


def write_recipe_file(partial: Path, recipe: Recipe, appended_to: Path | None = None) -> None:
    """`recipe.yaml`, written here only, on either path, once the backbone is: auto's recipe as rendered (its
    comments say why each unit got its scheme), any other as llm-compressor's own `save_pretrained` writes the recipe
    it ran, appended to `appended_to` (a `recipe.yaml` of the source the oneshot path loaded, which llm-compressor
    appends to)."""
    if recipe.scheme == AUTO_SCHEME:
        text = recipe.text
    else:
        text = recipe.compressor_recipe.yaml(existing_recipe_path=str(appended_to) if appended_to else None)
    (partial / RECIPE_FILE).write_text(text, encoding="utf-8")


def copy_release_files(source_dir: Path, contents: ReleaseContents, partial: Path) -> None:
    """Keep only the backbone save_pretrained wrote (llm-compressor also copies the source's *.py files), index it,
    copy the allowlisted files byte for byte and drop remote-code keys (`staged_folder` gives every file 0644)."""
    for path in list(partial.iterdir()):
        if path.name in (OWNER_FILE, GENERATION_CONFIG) or BACKBONE_OUTPUTS.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    write_weights_index(partial)
    for source_name, release_name in contents.copies.items():
        target = partial / release_name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_dir / source_name, target)
    for path in sorted(partial.rglob("*.json")):
        name = path.relative_to(partial).as_posix()
        keep = [entry.split(":", 1)[1] for entry in contents.keep_keys if entry.split(":", 1)[0] == name]
        strip_remote_code_keys(path, keep)


def write_weights_index(folder: Path) -> None:
    """Give a single-file backbone the index a sharded one already has.

    The head's `joint_head.safetensors` sits beside the backbone at the root. Engines read only the shards an index
    names, and without one vLLM reads every `*.safetensors` of the folder, the head's tensors included.
    """
    folder = Path(folder)
    if (folder / WEIGHTS_INDEX).exists():
        return
    weight_map: dict[str, str] = {}
    total = 0
    for path in sorted(folder.glob("model*.safetensors")):
        for name, entry in _safetensors_header(path).items():
            if name != "__metadata__":
                weight_map[name] = path.name
                begin, end = entry["data_offsets"]
                total += end - begin
    write_json_atomic(folder / WEIGHTS_INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})


def _safetensors_header(path: Path) -> dict[str, dict]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def backbone_weight_files(folder: Path) -> list[Path]:
    """The backbone's safetensors files: the shards the index names, else every top-level one but the head's."""
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*.safetensors") if p.name != HEAD_WEIGHTS)
    index = folder / WEIGHTS_INDEX
    try:
        named = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return files  # no index, or one that is not an index: the files themselves say what the backbone is
    return [path for path in files if path.name in named]


def backbone_bytes(folder: Path) -> int:
    """Bytes of the backbone's safetensors files in `folder`, the head's weights left out."""
    return sum(p.stat().st_size for p in backbone_weight_files(folder))
