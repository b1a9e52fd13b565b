"""Build a random-weight Clef release folder that loads exactly like a real one.

The folder holds what a release holds: the Qwen3.5 backbone (`config.json`, `model*.safetensors` with
transformers' module names), the tokenizer and `chat_template.jinja`, the processor (`processor_config.json`,
so `AutoProcessor` expands image and video placeholders), `generation_config.json`, the joint schema head
(`joint_head_config.json`, `joint_head.safetensors`) and a `README.md` that says the weights are random (its front
matter marks the folder, see `card.py`). Only the numbers are random.

How it is built:
1. The model's parameter list (names, shapes, module types) comes from transformers' own class, instantiated on
   the meta device, so names and shapes can never drift from what `from_pretrained` expects.
2. Every tensor is drawn straight on the target device in bf16 from its own generator, seeded by the build seed
   and the tensor's name, and written one shard at a time (`weights`); the head draws from the same kind of
   seed (`head`).
3. Everything is written into `DIR.partial` and renamed to `DIR` at the end (`release_folder.staged_folder`); on
   any error, Ctrl-C or SIGTERM the partial folder is removed, so `DIR` is either complete or absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from clef_quant.progress import NoProgress, Progress
from clef_quant.release_folder.staged import staged_folder
from clef_quant.tiny.backbone_config import backbone_config, generation_config, meta_model, placeholder_ids
from clef_quant.tiny.card import write_card
from clef_quant.tiny.checks import check_request
from clef_quant.tiny.head import head_config, write_head
from clef_quant.tiny.processor import write_tokenizer_and_processor
from clef_quant.tiny.sizes import SIZES
from clef_quant.tiny.weights import write_backbone
from clef_vllm.head.model import JointSchemaHead

# The tasks a build reports, in order; the backbone's is `backbone (DEVICE)`, counted in bytes.
TOKENIZER_TASK = "tokenizer + processor"
HEAD_TASK = "joint schema head"


def make_tiny(
    out_dir: Path,
    size: str = "tiny",
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a random-weight release of `size` to `out_dir` and return it; see the module docstring."""
    out_dir = Path(out_dir)
    spec = check_request(out_dir, size, seed, device, overwrite)
    progress = progress or NoProgress()
    with staged_folder(out_dir, command="make-tiny", overwrite=overwrite) as partial:
        progress.start(TOKENIZER_TASK, 1)
        ids = write_tokenizer_and_processor(partial, audio=spec.audio is not None)
        progress.finish(TOKENIZER_TASK)
        config = backbone_config(spec, ids)
        config.save_pretrained(partial)
        generation_config(ids).save_pretrained(partial)
        write_backbone(partial, config, spec, seed, torch.device(device), progress, f"backbone ({device})")
        progress.start(HEAD_TASK, 1)
        write_head(partial, spec, seed, torch.device(device))
        progress.finish(HEAD_TASK)
        write_card(partial, size, seed, spec.family)
    return out_dir


def parameter_count(size: str) -> int:
    """Parameters of the backbone plus the head of `size`, without building anything."""
    spec = SIZES[size]
    model = meta_model(backbone_config(spec, placeholder_ids(spec)))
    with torch.device("meta"):
        head = JointSchemaHead(head_config(spec))
    return sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in head.parameters())


def folder_bytes(folder: Path) -> int:
    """Bytes of the files directly in `folder` (a release folder is flat)."""
    return sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())
