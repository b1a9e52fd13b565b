"""The plan of one quantize run, made after the input checks and before the output folder is claimed or any model
loads: which path the backbone takes (streaming, shard by shard, or the model loaded for `oneshot`) and what each
Linear module gets.

Both are decided on the model's definition built on the meta device (no weights, a second for clef-flash), so a
recipe `plan.plan_quantization` refuses (the keep-list, a split fused group, mixed experts, nothing quantized)
ends the run in seconds on either path: before calibration requests are encoded and before a 20 GB load. The
oneshot path's plan is made on the module tree the loaded model will have, experts linearized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clef_quant.quantize import registry
from clef_quant.quantize.compress import linearize_meta_experts
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.inputs import CheckedInputs
from clef_quant.quantize.measure import timed
from clef_quant.quantize.plan import QuantPlan, plan_quantization
from clef_quant.quantize.streaming import NotStreamable, StreamingPlan, meta_model, plan_streaming, streaming_problem


@dataclass
class RunPlan:
    plan: QuantPlan  # per Linear module, the scheme it gets; the same on both paths
    streaming: StreamingPlan | None  # None: the model is loaded and quantized by oneshot
    notes: list[str] = field(default_factory=list)  # why a run that could have streamed loads the model

    @property
    def path(self) -> str:
        return "streaming" if self.streaming is not None else "oneshot"


def plan_run(inputs: CheckedInputs, streaming: bool | None, timings: dict[str, float]) -> RunPlan:
    """The run's plan. `streaming`: asked for (True), refused (False), or None for the schemes where it is exact by
    default; `--streaming` on a recipe that cannot stream exactly is an error saying why. Times "setup" (importing
    llm-compressor, building the recipe's modifiers) and "plan" into `timings`."""
    recipe = inputs.recipe
    with timed(timings, "setup"):  # mostly importing torch, transformers and llm-compressor
        modifiers = recipe.compressor_recipe  # a bad modifier fails here
    with timed(timings, "plan"):
        candidate = streaming or (streaming is None and recipe.scheme in registry.schemes().streaming_default())
        model: Any = None
        plan: QuantPlan | None = None
        notes: list[str] = []
        if candidate:
            # Why it cannot stream comes before building anything, as plan_streaming's own first check does.
            problem = streaming_problem(modifiers)
            if problem is None:
                model = meta_model(inputs.source_dir, inputs.source_config)
                plan = plan_quantization(model, modifiers)
                try:
                    splan = plan_streaming(
                        inputs.source_dir, inputs.source_config, modifiers, inputs.shards, model=model, plan=plan
                    )
                    return RunPlan(plan, splan)
                except NotStreamable as exc:
                    problem = str(exc)
            if streaming:
                raise QuantizeError(f"--streaming: this cannot be quantized without loading the model: {problem}")
            notes.append(f"quantized with the model loaded ({problem})")
        if model is None:
            model = meta_model(inputs.source_dir, inputs.source_config)
        # A dense model's plan holds for the loaded model as it is; a MoE's experts are Linear modules only there.
        if linearize_meta_experts(model) or plan is None:
            plan = plan_quantization(model, modifiers)
        return RunPlan(plan, None, notes)
