"""The random backbone weights: every tensor drawn on the target device in bf16 from its own generator, seeded
by the build seed and the tensor's name, and written one shard at a time.

The same seed on the same kind of device gives the same bytes whatever the order, and the 9.4 B-parameter
flash size never exists in fp32, nor whole in host memory. (CPU and CUDA generators draw different numbers, so
a GPU build differs from a CPU build.)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import PretrainedConfig
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni

from clef_quant.checkpoint_names import disk_tensors
from clef_quant.progress import BYTES, Progress
from clef_quant.tiny.backbone_config import meta_model
from clef_quant.tiny.sizes import Size

DTYPE = torch.bfloat16
INDEX_FILE = "model.safetensors.index.json"
INIT_STD = 0.02


@dataclass(frozen=True)
class _Init:
    """How one tensor is drawn: `normal` (std), `zeros`, `ones`, `decay` (A_log) or `step` (dt_bias)."""

    kind: str
    std: float = 0.0


@dataclass
class Shard:
    """Consecutive parameters written to one safetensors file."""

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
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv3d, nn.Conv2d, omni.Qwen3OmniMoeThinkerTextTopKRouter)):
            rule = {"weight": _Init("normal", INIT_STD), "bias": _Init("zeros")}
        elif isinstance(module, omni.Qwen3OmniMoeThinkerTextExperts):
            rule = {"gate_up_proj": _Init("normal", INIT_STD), "down_proj": _Init("normal", INIT_STD)}
        elif isinstance(module, (omni.Qwen3OmniMoeThinkerTextRMSNorm, omni.Qwen3OmniMoeTextRMSNorm)):
            rule = {"weight": _Init("ones")}  # Qwen3-Omni's norms scale by weight itself
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
                raise RuntimeError(
                    f"no init rule for {prefix}{name} ({type(module).__name__}); update clef_quant/tiny/weights.py"
                )
            rules[prefix + name] = rule[name]
    return rules


def _disk_rules(rules: dict[str, _Init], tensors: list[tuple[str, torch.Size]]) -> dict[str, _Init]:
    """`rules` keyed by the stored names: a split expert draws like the fused parameter it came from."""
    out: dict[str, _Init] = {}
    for name, _ in tensors:
        if name in rules:
            out[name] = rules[name]
            continue
        base, _, rest = name.partition(".mlp.experts.")
        fused = "gate_up_proj" if rest.endswith(("gate_proj.weight", "up_proj.weight")) else "down_proj"
        out[name] = rules[f"{base}.mlp.experts.{fused}"]
    return out


def plan_shards(
    parameters: list[tuple[str, nn.Parameter]] | list[tuple[str, torch.Size]], max_shard_bytes: int
) -> list[Shard]:
    """Consecutive parameters (model order) packed into shards of at most `max_shard_bytes` (one big tensor
    may exceed it alone)."""
    shards: list[Shard] = []
    for name, shape in parameters:
        num_bytes = shape.numel() * DTYPE.itemsize
        if not shards or (shards[-1].num_bytes + num_bytes > max_shard_bytes and shards[-1].names):
            shards.append(Shard([], 0))
        shards[-1].names.append(name)
        shards[-1].num_bytes += num_bytes
    return shards


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of one named tensor: independent of build order, distinct per seed and name."""
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
    shard: Shard, shapes: dict[str, torch.Size], rules: dict[str, _Init], seed: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    for name in shard.names:
        generator = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
        yield name, _draw(rules[name], shapes[name], generator, device).cpu()


def write_backbone(
    folder: Path,
    config: PretrainedConfig,
    spec: Size,
    seed: int,
    device: torch.device,
    progress: Progress,
    task: str,
) -> None:
    """The backbone's safetensors shards of `spec` and their index, reported as `task` in bytes."""
    model = meta_model(config)
    if set(model.state_dict()) != {name for name, _ in model.named_parameters()}:
        # A persistent buffer would have to be saved too; none exists in transformers 5.17's Qwen3.5 or Omni thinker.
        raise RuntimeError("the backbone has persistent buffers; update clef_quant/tiny/weights.py")
    parameters = disk_tensors(model)
    rules = _disk_rules(_init_rules(model), parameters)
    shapes = dict(parameters)
    shards = plan_shards(parameters, spec.max_shard_bytes)
    total = sum(shard.num_bytes for shard in shards)
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    progress.start(task, total, unit=BYTES)
    for shard, file in zip(shards, files, strict=True):
        tensors = dict(_shard_tensors(shard, shapes, rules, seed, device))
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
        progress.advance(task, shard.num_bytes)
    progress.finish(task)
    # The index is written even for a single file: without one, vLLM loads every *.safetensors in the folder,
    # `joint_head.safetensors` included, and fails on the head's names. A real release is sharded, so it always
    # has an index and vLLM reads only the files named there.
    index = {
        "metadata": {"total_parameters": sum(shape.numel() for _, shape in parameters), "total_size": total},
        "weight_map": {name: file for shard, file in zip(shards, files, strict=True) for name in shard.names},
    }
    text = json.dumps(index, indent=2, sort_keys=True) + "\n"
    (folder / INDEX_FILE).write_text(text, encoding="utf-8")
