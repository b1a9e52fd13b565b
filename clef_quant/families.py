"""The Clef model family as data: which release each model is, which backbone architecture it has, which vLLM
class serves it, and which modules stay bf16 when it is quantized.

Everything that differs between clef-flash, clef (27B) and Clef-Omni is a field here; the code that builds,
quantizes, serves and describes a model reads the field instead of branching on the model's name.

- clef-flash: `Cloudflare/clef-flash`, a Qwen3.5 (Gated DeltaNet + full attention) backbone, served through the
  clef-vllm plugin's `ClefFlashForJointSchema` (vLLM 0.32 has no class for it).
- clef: `Cloudflare/clef`, the same Qwen3.5 architecture at 27B (hidden 5120), served the same way.
- clef-omni: `Cloudflare/clef-omni`, the Qwen3-Omni-30B-A3B thinker (MoE, audio and vision towers). vLLM 0.32
  serves it natively: `vllm/transformers_utils/model_arch_config_convertor.py` (Qwen3OmniMoeModelArchConfigConvertor)
  switches a `Qwen3OmniMoeForConditionalGeneration` folder holding `joint_head_config.json` to
  `ClefOmniForJointSchema` (`vllm/model_executor/models/clef_omni.py`), which reads the head from
  `joint_head.safetensors` under the prefix `pooler.head.` and builds it from `joint_head_config.json`'s keys
  (hidden_size, width, routing_layers, layers, heads, feedforward: the same keys as clef-flash's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clef_vllm.engine.architecture import ARCHITECTURE, NATIVE_ARCHITECTURES
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import ReleaseConfig, read_release_config, release_config

QWEN3_5 = "Qwen3_5ForConditionalGeneration"
QWEN3_OMNI = "Qwen3OmniMoeForConditionalGeneration"
PLUGIN = "clef-vllm"
VLLM = "vLLM"


@dataclass(frozen=True)
class Family:
    """One Clef model."""

    name: str
    release: str  # the Hub id of Cloudflare's bf16 release
    model_type: str  # config.json's model_type
    architecture: str  # config.json's architectures[0] (the transformers class)
    engine_architecture: str  # the vLLM class that serves it
    served_by: str  # PLUGIN (our vLLM plugin) or VLLM (vLLM's own class)
    hidden_size: int  # the text model's (and the head's) hidden size at full size
    # Where the text decoder's modules live in the transformers checkpoint.
    text_prefix: str
    # The keep-list: llm-compressor targets (`re:` = re.match from the start of the name) that stay bf16, with the
    # model card's reason per module kind. See clef_quant/quantize/recipes.py for how it is used.
    keep: tuple[tuple[str, dict[str, str]], ...]
    # Groups of sibling modules that must share one NVFP4 weight global scale because vLLM fuses them into one
    # GEMM (beyond llm-compressor's own q/k/v and gate/up groups).
    fused_scales: tuple[tuple[str, ...], ...] = ()
    # Whether the text decoder is a mixture of experts (calibration must then reach every expert).
    moe: bool = False


_QWEN3_5_KEEP: tuple[tuple[str, dict[str, str]], ...] = (
    ("lm_head", {"lm_head": "the joint schema head reads its rows as the lexical features of every option"}),
    (r"re:model\.visual\..*", {"vision": "the whole vision tower (images and videos) is kept as released"}),
    (
        r"re:.*linear_attn\.in_proj_[ab]$",
        {
            "linear_attn.in_proj_a": "Gated DeltaNet gate projection: very few outputs (32 in clef-flash), sets the "
            "decay",
            "linear_attn.in_proj_b": "Gated DeltaNet gate projection: very few outputs (32 in clef-flash), sets the "
            "write strength",
        },
    ),
)

# Module names of the Omni thinker checkpoint, from transformers' modeling_qwen3_omni_moe.py
# (Qwen3OmniMoeForConditionalGeneration.thinker: `audio_tower`, `visual`, `model`, `lm_head`; each decoder layer's
# `mlp.gate` is the router, `mlp.experts` the experts) and vLLM's qwen3_omni_moe_thinker.py hf_to_vllm_mapper
# (`thinker.` prefix; `talker.` and `code2wav.` are dropped on load).
_OMNI_KEEP: tuple[tuple[str, dict[str, str]], ...] = (
    # The optional `thinker.` prefix: llm-compressor calibrates the thinker alone (the whole Omni class has no
    # forward), where the names start below it; the saved checkpoint and `inspect` see the full names.
    (
        r"re:(?:thinker\.)?lm_head$",
        {"lm_head": "the joint schema head reads its rows as the lexical features of every option"},
    ),
    (r"re:(?:thinker\.)?visual\..*", {"vision": "the whole vision tower (images and videos) is kept as released"}),
    (
        r"re:(?:thinker\.)?audio_tower\..*",
        {"audio": "the whole audio tower (speech, sounds, soundtracks) is kept as released"},
    ),
    (
        r"re:.*mlp\.gate$",
        {"mlp.gate": "MoE router: picks the experts of every token; a rounding here changes which experts run"},
    ),
)

_CLEF_FLASH = Family(
    name="clef-flash",
    release="Cloudflare/clef-flash",
    model_type="qwen3_5",
    architecture=QWEN3_5,
    engine_architecture=ARCHITECTURE,
    served_by=PLUGIN,
    hidden_size=4096,
    text_prefix="model.language_model.",
    keep=_QWEN3_5_KEEP,
    fused_scales=(("in_proj_qkv", "in_proj_z"),),
)

FAMILIES: dict[str, Family] = {
    "clef-flash": _CLEF_FLASH,
    # The 27B has the flash text architecture, so it shares flash's keep-list, fused scales and serving class.
    "clef": replace(_CLEF_FLASH, name="clef", release="Cloudflare/clef", hidden_size=5120),
    "clef-omni": Family(
        name="clef-omni",
        release="Cloudflare/clef-omni",
        model_type="qwen3_omni_moe",
        architecture=QWEN3_OMNI,
        engine_architecture=NATIVE_ARCHITECTURES[QWEN3_OMNI],
        served_by=VLLM,
        hidden_size=2048,
        text_prefix="thinker.model.",
        keep=_OMNI_KEEP,
        moe=True,
    ),
}


def family_of_config(config: ReleaseConfig | Mapping[str, Any], head_hidden_size: int | None = None) -> Family | None:
    """The family a `config.json` (or a transformers config's `to_dict()`) belongs to, or None for another model.

    Qwen3.5 folders are told apart by the text hidden size (the head's when given, else the config's): 5120 is the
    27B, anything else the flash architecture (the tiny sizes included, which say their size in their card)."""
    config = release_config(config)
    if QWEN3_OMNI in config.architectures or config.model_type == "qwen3_omni_moe":
        return FAMILIES["clef-omni"]
    if QWEN3_5 in config.architectures or config.model_type == "qwen3_5":
        hidden = head_hidden_size or config.text.hidden_size
        return FAMILIES["clef"] if hidden == FAMILIES["clef"].hidden_size else FAMILIES["clef-flash"]
    return None


# The front-matter key of the card `make-tiny` writes: {"size", "seed", "model"} of the run (clef_quant/tiny/card.py).
# Kept here so that this module can read a tiny folder's model without importing the builder.
MAKE_TINY_MARK = "clef_quant_make_tiny"


def family_of_folder(folder: Path) -> Family | None:
    """The family of a release folder: the model its make-tiny card names when it has one (a tiny sibling has its
    model's architecture at other sizes), else what config.json says."""
    try:
        config = read_release_config(folder)
    except CheckpointError:
        return None
    named = _make_tiny_model(Path(folder))
    if named in FAMILIES:
        return FAMILIES[named]
    return family_of_config(config)


def _make_tiny_model(folder: Path) -> str | None:
    """The model named by a make-tiny card (README.md, or source_card.md in a quantized folder)."""
    import yaml

    for name in ("README.md", "source_card.md"):
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except OSError:
            continue
        parts = text.split("---", 2) if text.startswith("---") else []
        try:
            front = yaml.safe_load(parts[1]) if len(parts) > 2 else None
        except yaml.YAMLError:
            continue
        mark = front.get(MAKE_TINY_MARK) if isinstance(front, dict) else None
        if isinstance(mark, dict) and isinstance(mark.get("model"), str):
            return mark["model"]
    return None
