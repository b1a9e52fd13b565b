"""The files of a quantized release besides what `save_pretrained` writes, and the size of its backbone."""

from __future__ import annotations

import shutil
from pathlib import Path

from clef_quant.quantize.contents import BACKBONE_OUTPUTS, ReleaseContents, strip_remote_code_keys
from clef_quant.release_folder.writer import OWNER_FILE
from clef_vllm.head_files import HEAD_SUBDIR, HEAD_WEIGHTS

GENERATION_CONFIG = "generation_config.json"  # save_pretrained writes one; the source's replaces it when there


def copy_release_files(source_dir: Path, contents: ReleaseContents, partial: Path) -> None:
    """Keep only the backbone save_pretrained wrote (llm-compressor also copies the source's *.py files), copy the
    allowlisted files byte for byte and drop remote-code keys (`staged_folder` gives every file 0644)."""
    for path in list(partial.iterdir()):
        if path.name in (OWNER_FILE, GENERATION_CONFIG) or BACKBONE_OUTPUTS.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (partial / HEAD_SUBDIR).mkdir(exist_ok=True)
    for source_name, release_name in contents.copies.items():
        target = partial / release_name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_dir / source_name, target)
    for path in sorted(partial.rglob("*.json")):
        name = path.relative_to(partial).as_posix()
        keep = [entry.split(":", 1)[1] for entry in contents.keep_keys if entry.split(":", 1)[0] == name]
        strip_remote_code_keys(path, keep)


def backbone_bytes(folder: Path) -> int:
    """Bytes of the backbone's safetensors files in `folder`, the head's weights left out."""
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors") if p.name != HEAD_WEIGHTS)
