"""Build a random-weight Clef release folder that loads exactly like a real one.

The folder holds what a release holds: the Qwen3.5 backbone (`config.json`, `model*.safetensors` with
transformers' module names), the tokenizer and `chat_template.jinja`, the processor (`processor_config.json`,
so `AutoProcessor` expands image and video placeholders), `generation_config.json`, and the joint schema head
(`joint_head_config.json`, `joint_head.safetensors`). Only the numbers are random.

How it is built:
1. The model's parameter list (names, shapes, module types) comes from transformers' own class, instantiated on
   the meta device, so names and shapes can never drift from what `from_pretrained` expects.
2. Every tensor is drawn straight on the target device in bf16 from its own generator, seeded by the build seed
   and the tensor's name: the same seed on the same kind of device gives the same bytes whatever the order,
   and the 9.4 B-parameter flash size never exists in fp32, nor whole in host memory: it is written one shard
   at a time. (CPU and CUDA generators draw different numbers, so a GPU build differs from a CPU build.)
3. Everything is written into `DIR.partial` and renamed to `DIR` at the end; on any error or Ctrl-C the partial
   folder is removed, so `DIR` is either complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

from clef_quant.tiny.sizes import SIZES, Size
from clef_quant.tiny.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer, token_ids
from clef_vllm.errors import ClefError
from clef_vllm.head import JointSchemaHead
from clef_vllm.head_files import HeadConfig, save_head

# progress(stage, done, total): stages "tokenizer", "weights" (counted in bytes) and "head", in that order.
ProgressCallback = Callable[[str, int, int], None]

DTYPE = torch.bfloat16
INDEX_FILE = "model.safetensors.index.json"
INIT_STD = 0.02
ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY_FACTOR = 0.25
MAX_POSITION_EMBEDDINGS = 262144
# Room left besides the shard being written, in host memory and on disk.
_MARGIN_BYTES = 1 << 30
# Qwen's image and video processor settings (Qwen3-VL and Qwen3.5 releases ship these).
IMAGE_PROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_PROCESSOR = {
    "size": {"shortest_edge": 4096, "longest_edge": 25165824},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


class TinyBuildError(ClefError):
    """A make-tiny request that cannot be carried out (bad size, device, existing folder, too little memory)."""


def make_tiny(
    out_dir: Path,
    size: str = "tiny",
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write a random-weight release of `size` to `out_dir` and return it; see the module docstring."""
    out_dir = Path(out_dir)
    spec = _check_request(out_dir, size, seed, device, overwrite)
    report = progress or (lambda stage, done, total: None)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left over from a build that was killed outright
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial.mkdir()
    try:
        report("tokenizer", 0, 1)
        ids = _write_tokenizer_and_processor(partial)
        report("tokenizer", 1, 1)
        config = backbone_config(spec, ids)
        config.save_pretrained(partial)
        _generation_config(ids).save_pretrained(partial)
        _write_backbone(partial, config, spec, seed, torch.device(device), report)
        report("head", 0, 1)
        _write_head(partial, spec, seed, torch.device(device))
        report("head", 1, 1)
        for entry in partial.iterdir():
            # safetensors writes its files owner-only (0600); give every file the usual 0644 of a download so
            # that a server running as another user can read the folder.
            entry.chmod(0o644)
        if out_dir.exists():  # only reachable with overwrite=True (checked above)
            _remove(out_dir)
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def parameter_count(size: str) -> int:
    """Parameters of the backbone plus the head of `size`, without building anything."""
    spec = SIZES[size]
    model = _meta_model(backbone_config(spec, _placeholder_ids(spec)))
    with torch.device("meta"):
        head = JointSchemaHead(_head_config(spec))
    return sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in head.parameters())


def backbone_config(spec: Size, ids: dict[str, int]) -> Qwen3_5Config:
    """The `Qwen3_5ForConditionalGeneration` config of `spec`, wired to the tokenizer's control-token ids."""
    text, vision = spec.text, spec.vision
    rotary_pairs = int(text.head_dim * PARTIAL_ROTARY_FACTOR) // 2
    # Multimodal RoPE splits the rotary frequencies between time, height and width, the remainder going to
    # the first sections (Qwen3.5-9B: 32 -> [11, 11, 10]; head dim 64: 8 -> [3, 3, 2]).
    mrope_section = [rotary_pairs // 3 + (1 if i < rotary_pairs % 3 else 0) for i in range(3)]
    config = Qwen3_5Config(
        text_config={
            "vocab_size": text.vocab_size,
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "layer_types": text.layer_types,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "head_dim": text.head_dim,
            "linear_num_key_heads": text.linear_num_key_heads,
            "linear_num_value_heads": text.linear_num_value_heads,
            "linear_key_head_dim": text.linear_key_head_dim,
            "linear_value_head_dim": text.linear_value_head_dim,
            "linear_conv_kernel_dim": text.linear_conv_kernel_dim,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": ROPE_THETA,
                "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
                "mrope_section": mrope_section,
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": False,
            "eos_token_id": ids[PAD_TOKEN],  # as Qwen3.5's text config: <|endoftext|>
            "dtype": "bfloat16",
        },
        vision_config={
            "depth": vision.depth,
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_heads": vision.num_heads,
            "patch_size": vision.patch_size,
            "spatial_merge_size": vision.spatial_merge_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "out_hidden_size": text.hidden_size,
            "num_position_embeddings": vision.num_position_embeddings,
            "dtype": "bfloat16",
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.dtype = "bfloat16"
    return config


def _check_request(out_dir: Path, size: str, seed: int, device: str, overwrite: bool) -> Size:
    """Everything that can be known to fail before the build, all reported at once."""
    problems: list[str] = []
    spec = SIZES.get(size)
    if spec is None:
        problems.append(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if not 0 <= seed < 2**63:
        problems.append(f"seed must be between 0 and 2**63 - 1, not {seed}")
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        problems.append(f"device must be cpu or cuda, not {device!r}")
    elif device.startswith("cuda") and not torch.cuda.is_available():
        problems.append(f"device {device} asked for, but torch sees no CUDA device")
    if out_dir.exists():
        if not overwrite:
            problems.append(f"{out_dir} already exists; pass --overwrite to replace it")
        elif out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
            # Guard against `--overwrite` pointed at the wrong folder: only replace something that looks like
            # a checkpoint.
            problems.append(f"{out_dir} is not a checkpoint folder (no config.json); refusing to replace it")
    if spec is not None and not problems:
        problems.extend(_resource_problems(out_dir, spec, device))
    if problems:
        raise TinyBuildError("; ".join(problems))
    assert spec is not None
    return spec


def _resource_problems(out_dir: Path, spec: Size, device: str) -> list[str]:
    model = _meta_model(backbone_config(spec, _placeholder_ids(spec)))
    shards = _plan_shards(list(model.named_parameters()), spec.max_shard_bytes)
    total = sum(shard.num_bytes for shard in shards)
    largest = max(shard.num_bytes for shard in shards)
    problems = []
    # One shard lives on the device while it is drawn and again in host memory while it is written (safetensors
    # serializes it whole); on the CPU both copies are in host memory.
    host_needed = largest * (2 if device == "cpu" else 1) + _MARGIN_BYTES
    host_free = _available_host_memory()
    if host_free is not None and host_free < host_needed:
        hint = " (build the flash size on a GPU: --device cuda)" if device == "cpu" else ""
        problems.append(
            f"size {spec.name} needs about {_gib(host_needed)} of free memory on the host, "
            f"{_gib(host_free)} is available{hint}"
        )
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if free < largest + _MARGIN_BYTES:
            problems.append(f"size {spec.name} needs about {_gib(largest + _MARGIN_BYTES)} free on {device}")
    existing = out_dir.parent
    while not existing.exists():
        existing = existing.parent
    disk_free = shutil.disk_usage(existing).free
    if disk_free < total + _MARGIN_BYTES:
        problems.append(f"size {spec.name} writes {_gib(total)}; {existing} has {_gib(disk_free)} free")
    return problems


def _available_host_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _write_tokenizer_and_processor(folder: Path) -> dict[str, int]:
    """Tokenizer files, `chat_template.jinja` and `processor_config.json`; returns the control-token ids."""
    # Imported here: the image processor needs torchvision, which counting parameters does not.
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer = build_tokenizer()
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, **IMAGE_PROCESSOR),
        video_processor=Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, **VIDEO_PROCESSOR),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    return token_ids(tokenizer)


def _placeholder_ids(spec: Size) -> dict[str, int]:
    """Control-token ids for a config that only serves to count parameters (no tokenizer needed)."""
    names = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", PAD_TOKEN, EOS_TOKEN)
    return {name: spec.text.vocab_size - 1 - i for i, name in enumerate(names)}


def _generation_config(ids: dict[str, int]) -> GenerationConfig:
    # Qwen3.5's defaults; Clef never generates, but a release carries the file unchanged.
    return GenerationConfig(
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
        eos_token_id=[ids[EOS_TOKEN], ids[PAD_TOKEN]],
        pad_token_id=ids[PAD_TOKEN],
    )


def _meta_model(config: Qwen3_5Config) -> nn.Module:
    with torch.device("meta"):
        return Qwen3_5ForConditionalGeneration(config)


# ---------------------------------------------------------------------------------------------- backbone


@dataclass(frozen=True)
class _Init:
    """How one tensor is drawn: `normal` (std), `zeros`, `ones`, `decay` (A_log) or `step` (dt_bias)."""

    kind: str
    std: float = 0.0


@dataclass
class _Shard:
    names: list[str]
    num_bytes: int


def _init_rules(model: nn.Module) -> dict[str, _Init]:
    """An init for every parameter, chosen by the module that owns it; unknown modules are an error."""
    rules: dict[str, _Init] = {}
    for module_name, module in model.named_modules():
        prefix = module_name + "." if module_name else ""
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv3d)):
            rule = {"weight": _Init("normal", INIT_STD), "bias": _Init("zeros")}
        elif isinstance(module, nn.Conv1d):
            # The Gated DeltaNet's depthwise conv sees only `kernel` inputs per output; 0.02 would shrink its
            # activations ~25x, so it gets the fan-in scale instead.
            rule = {"weight": _Init("normal", module.kernel_size[0] ** -0.5)}
        elif isinstance(module, nn.LayerNorm):
            rule = {"weight": _Init("ones"), "bias": _Init("zeros")}
        elif isinstance(module, qwen.Qwen3_5RMSNorm):
            rule = {"weight": _Init("zeros")}  # this norm scales by (1 + weight): zero is the identity
        elif isinstance(module, qwen.Qwen3_5RMSNormGated):
            rule = {"weight": _Init("ones")}  # this one scales by weight itself
        elif isinstance(module, qwen.Qwen3_5GatedDeltaNet):
            rule = {"A_log": _Init("decay"), "dt_bias": _Init("step")}
        else:
            rule = {}
        for name in own:
            if name not in rule:
                raise RuntimeError(f"no init rule for {prefix}{name} ({type(module).__name__}); update build.py")
            rules[prefix + name] = rule[name]
    return rules


def _plan_shards(parameters: list[tuple[str, nn.Parameter]], max_shard_bytes: int) -> list[_Shard]:
    """Consecutive parameters (model order) packed into shards of at most `max_shard_bytes` (one big tensor
    may exceed it alone)."""
    shards: list[_Shard] = []
    for name, param in parameters:
        num_bytes = param.numel() * DTYPE.itemsize
        if not shards or (shards[-1].num_bytes + num_bytes > max_shard_bytes and shards[-1].names):
            shards.append(_Shard([], 0))
        shards[-1].names.append(name)
        shards[-1].num_bytes += num_bytes
    return shards


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"clef-tiny/{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _draw(rule: _Init, shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    if rule.kind == "normal":
        return torch.empty(shape, dtype=DTYPE, device=device).normal_(0.0, rule.std, generator=generator)
    if rule.kind == "zeros":
        return torch.zeros(shape, dtype=DTYPE, device=device)
    if rule.kind == "ones":
        return torch.ones(shape, dtype=DTYPE, device=device)
    # The two per-head vectors of the Gated DeltaNet decay g = -exp(A_log) * softplus(a + dt_bias), drawn as in
    # Mamba-2: A in [1, 16] and a time step softplus(dt_bias) log-uniform in [1e-3, 1e-1], so every head starts
    # with a per-token decay between about exp(-1.6) and 1. Drawn in fp32 (a few numbers), stored in bf16.
    uniform = torch.empty(shape, dtype=torch.float32, device=device).uniform_(generator=generator)
    if rule.kind == "decay":
        return (1.0 + 15.0 * uniform).log().to(DTYPE)
    if rule.kind == "step":
        step = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * uniform)
        return (step + torch.log(-torch.expm1(-step))).to(DTYPE)  # the inverse of softplus
    raise ValueError(f"unknown init {rule.kind}")


def _shard_tensors(
    shard: _Shard, shapes: dict[str, torch.Size], rules: dict[str, _Init], seed: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    for name in shard.names:
        generator = torch.Generator(device=device).manual_seed(_tensor_seed(seed, name))
        yield name, _draw(rules[name], shapes[name], generator, device).cpu()


def _write_backbone(
    folder: Path, config: Qwen3_5Config, spec: Size, seed: int, device: torch.device, report: ProgressCallback
) -> None:
    model = _meta_model(config)
    parameters = list(model.named_parameters())
    if set(model.state_dict()) != {name for name, _ in parameters}:
        # A persistent buffer would have to be saved too; none exists in transformers 5.17's Qwen3.5.
        raise RuntimeError("the Qwen3.5 model has persistent buffers; update build.py")
    rules = _init_rules(model)
    shapes = {name: param.shape for name, param in parameters}
    shards = _plan_shards(parameters, spec.max_shard_bytes)
    total = sum(shard.num_bytes for shard in shards)
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    done = 0
    report("weights", done, total)
    for shard, file in zip(shards, files, strict=True):
        tensors = dict(_shard_tensors(shard, shapes, rules, seed, device))
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
        done += shard.num_bytes
        report("weights", done, total)
    # The index is written even for a single file: without one, vLLM loads every *.safetensors in the folder,
    # `joint_head.safetensors` included, and fails on the head's names. A real release is sharded, so it always
    # has an index and vLLM reads only the files named there.
    index = {
        "metadata": {"total_parameters": sum(p.numel() for _, p in parameters), "total_size": total},
        "weight_map": {name: file for shard, file in zip(shards, files, strict=True) for name in shard.names},
    }
    text = json.dumps(index, indent=2, sort_keys=True) + "\n"
    (folder / INDEX_FILE).write_text(text, encoding="utf-8")


# -------------------------------------------------------------------------------------------------- head


def _head_config(spec: Size) -> HeadConfig:
    shape = spec.head
    return HeadConfig(
        hidden_size=spec.text.hidden_size,
        width=shape.width,
        routing_layers=shape.routing_layers,
        layers=shape.layers,
        heads=shape.heads,
        feedforward=shape.feedforward,
    )


def _write_head(folder: Path, spec: Size, seed: int, device: torch.device) -> None:
    """The head's own `reset_parameters` draws its weights, in bf16 on the device, from a seeded RNG."""
    with torch.device("meta"):
        head = JointSchemaHead(_head_config(spec))
    head = head.to(dtype=DTYPE).to_empty(device=device)
    for param in head.parameters():
        param.data.fill_(math.nan)  # so a parameter that reset_parameters skipped cannot go unnoticed
    # Seed only the generator the head's tensors draw from, and give the caller's RNG state back afterwards.
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        forked, generator = [index], torch.cuda.default_generators[index]
    else:
        forked, generator = [], torch.default_generator
    with torch.random.fork_rng(devices=forked, device_type="cuda"):
        generator.manual_seed(_tensor_seed(seed, "joint_head"))
        head.reset_parameters()
    skipped = [name for name, param in head.named_parameters() if torch.isnan(param).any()]
    if skipped:
        raise RuntimeError(f"JointSchemaHead.reset_parameters left {', '.join(skipped)} unset")
    save_head(head, folder)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files directly in `folder` (a release folder is flat)."""
    return sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())
