"""The head's two files in a release folder: `joint_head_config.json` and `joint_head.safetensors`.

They sit at the folder's root, where Cloudflare's releases keep them and where vLLM >= 0.33, SGLang and
llama.cpp look for them; quantized releases made before that layout keep them in `clef_head/`, and those are
still read.

Reading is strict: an unknown, missing or ill-typed config key, a missing or extra weight, a wrong shape
are all named at once, because a partial or renamed head would otherwise score with random weights and still
return plausible numbers. Writing is deterministic, since releases are diffed by hash.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from clef_vllm.errors import CheckpointError, not_valid_json
from clef_vllm.head.model import JointSchemaHead

HEAD_WEIGHTS = "joint_head.safetensors"
HEAD_CONFIG = "joint_head_config.json"
HEAD_FILES = (HEAD_WEIGHTS, HEAD_CONFIG)
HEAD_SUBDIR = "clef_head"  # the legacy layout of older quantized releases


class HeadConfig(BaseModel):
    """The head's constructor arguments, as `joint_head_config.json` stores them."""

    # strict: JSON integers only (no "16", 16.0 or true)
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    hidden_size: int = Field(ge=1)
    width: int = Field(ge=1)
    routing_layers: int = Field(ge=0)
    layers: int = Field(ge=0)
    heads: int = Field(ge=1)
    feedforward: int = Field(ge=1)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> HeadConfig:
        if self.width % self.heads:
            raise PydanticCustomError(
                "width_not_divisible",
                "width {width} is not divisible by heads {heads}",
                {"width": self.width, "heads": self.heads},
            )
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> HeadConfig:
        """Build from the JSON object, refusing any unknown, missing or ill-typed key (all named at once)."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise CheckpointError("joint head config: " + "; ".join(_problems(exc))) from None

    @classmethod
    def read(cls, path: str | Path) -> HeadConfig:
        """Read `joint_head_config.json` (give the file or the folder that holds it)."""
        path = Path(path)
        file = path / HEAD_CONFIG if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"joint head config not found: {file}")
        try:
            data = json.loads(file.read_bytes().decode("utf-8"))
        except OSError as exc:
            raise CheckpointError(f"cannot read {file}: {exc.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(not_valid_json(str(file), exc)) from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{file} must hold a JSON object")
        try:
            return cls.from_dict(data)
        except CheckpointError as exc:
            raise CheckpointError(f"{file}: {exc}") from None


def _minimum(name: str) -> int:
    return next(m.ge for m in HeadConfig.model_fields[name].metadata if hasattr(m, "ge"))


def _problems(error: ValidationError) -> list[str]:
    """Pydantic's errors in the words the release tools use: missing and unknown keys grouped, then each bad value."""
    names = list(HeadConfig.model_fields)
    missing, unknown, values = set(), [], []
    for item in error.errors():
        key = item["loc"][0] if item["loc"] else None
        if item["type"] == "missing":
            missing.add(key)
        elif item["type"] == "extra_forbidden":
            unknown.append(str(key))
        elif key in names:
            values.append(f"{key} must be an integer >= {_minimum(str(key))}, not {item['input']!r}")
        else:
            values.append(item["msg"])
    problems = []
    if missing:
        problems.append("missing keys: " + ", ".join(name for name in names if name in missing))
    if unknown:
        problems.append("unknown keys: " + ", ".join(sorted(unknown)))
    return problems + values


def load_head(
    folder: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> JointSchemaHead:
    """Load a head folder strictly: every key of the file must be a parameter and every parameter present.

    `dtype=None` keeps the file's dtypes (bf16 for a release).
    """
    folder = Path(folder)
    config = HeadConfig.read(folder / HEAD_CONFIG)
    weights = folder / HEAD_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"joint head weights not found: {weights}")
    try:
        tensors = load_file(weights)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {weights}: {exc}") from None
    with torch.device("meta"):
        head = JointSchemaHead(config)
    expected = head.state_dict()
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    shapes = [
        f"{key} {tuple(tensors[key].shape)} (config wants {tuple(expected[key].shape)})"
        for key in sorted(set(expected) & set(tensors))
        if tensors[key].shape != expected[key].shape
    ]
    if shapes:
        problems.append("wrong shapes: " + ", ".join(shapes))
    not_float = sorted(key for key, t in tensors.items() if key in expected and not t.is_floating_point())
    if not_float:
        problems.append("not floating point: " + ", ".join(not_float))
    if problems:
        raise CheckpointError(f"{weights} does not match {config!r}: " + "; ".join(problems))
    tensors = {key: t.to(device=device, dtype=dtype or t.dtype) for key, t in tensors.items()}
    head.load_state_dict(tensors, strict=True, assign=True)
    return head.eval().requires_grad_(False)


def save_head(head: JointSchemaHead, folder: str | Path) -> Path:
    """Write the two head files; the same weights always give the same bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {key: t.detach().to("cpu").contiguous() for key, t in sorted(head.state_dict().items())}
    save_file(tensors, str(folder / HEAD_WEIGHTS), metadata={"format": "pt"})
    text = json.dumps(head.config.model_dump(), sort_keys=True, indent=2) + "\n"
    (folder / HEAD_CONFIG).write_text(text, encoding="utf-8")
    return folder


def find_head_dir(release_dir: str | Path) -> Path:
    """The folder holding the head: the release's root, else `clef_head/` (quantized releases of the old layout)."""
    release_dir = Path(release_dir)
    for candidate in (release_dir, release_dir / HEAD_SUBDIR):
        if all((candidate / name).is_file() for name in HEAD_FILES):
            return candidate
    raise CheckpointError(
        f"no joint schema head in {release_dir}: expected {HEAD_WEIGHTS} and {HEAD_CONFIG} "
        f"in {release_dir} (or {release_dir / HEAD_SUBDIR}, the layout of older quantized releases)"
    )


def head_prefix(release_dir: str | Path) -> str:
    """Where the head's files are, relative to the release: "" at the root, "clef_head/" in the old layout."""
    release_dir = Path(release_dir)
    head_dir = find_head_dir(release_dir)
    return "" if head_dir == release_dir else f"{HEAD_SUBDIR}/"
