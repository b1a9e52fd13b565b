"""`vllm serve`'s /v1/systemone strategy: logits from the pooler become probabilities in vLLM's option order."""

from __future__ import annotations

import pytest
import torch

from clef_vllm.format.request import parse_request

pytest.importorskip("vllm")


def test_logits_become_per_question_probabilities_in_request_order() -> None:
    from clef_vllm.engine.vllm_strategy import _model_order_to_vllm_order

    request = parse_request(
        {
            "model": "m",
            "state": "s",
            "questions": {
                "colour": {"type": "choice", "criteria": {"red": "Red.", "blue": "Blue.", "green": "Green."}},
                "ok": {"type": "noul"},
            },
        }
    )
    # The model scores a choice's options sorted by id (blue, green, red); vLLM lists them as the request did.
    assert [o.id for o in request.questions[0].options] == ["blue", "green", "red"]
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0, 3.0])
    colour, ok = _model_order_to_vllm_order(request, logits)
    by_model_order = torch.tensor([0.0, 1.0, 2.0]).softmax(-1).tolist()
    assert colour == pytest.approx([by_model_order[2], by_model_order[0], by_model_order[1]])
    assert ok == pytest.approx([0.5, 0.5])


def test_the_plugin_takes_the_architecture_over_a_class_and_strategy_vllm_registered_first(monkeypatch) -> None:
    # vLLM 0.33 and later ship their own class and strategy under the plugin's architecture name; an engine started
    # by the plugin must still build the plugin's class (its invariance hooks and graphs) and read through its
    # strategy, which expects that class's logits.
    from vllm import ModelRegistry

    from clef_vllm.engine import plugin
    from clef_vllm.engine.architecture import ARCHITECTURE, MODEL_CLASS
    from clef_vllm.engine.vllm_decisions import decisions_module
    from clef_vllm.engine.vllm_strategy import ClefFlashStrategy

    strategies = decisions_module("strategies")
    assert strategies is not None
    native_strategy = object()
    monkeypatch.setitem(strategies.READ_STRATEGIES, ARCHITECTURE, native_strategy)
    models = ModelRegistry.models
    monkeypatch.setitem(models, ARCHITECTURE, models["Qwen3_5ForConditionalGeneration"])

    plugin.register()

    registered = ModelRegistry.models[ARCHITECTURE]
    assert f"{registered.module_name}:{registered.class_name}" == MODEL_CLASS
    assert strategies.READ_STRATEGIES[ARCHITECTURE] is ClefFlashStrategy


def test_a_head_read_is_not_capped_at_its_types_labels() -> None:
    from dataclasses import dataclass

    from clef_vllm.engine.vllm_decisions import decision_limits

    @dataclass(frozen=True)
    class Limits032:
        max_questions: int
        max_options: int

    @dataclass(frozen=True)
    class Limits034:
        max_questions: int
        max_options: int
        labeled: bool = True

    assert decision_limits(Limits032, max_questions=64, max_options=256) == Limits032(64, 256)
    assert decision_limits(Limits034, max_questions=64, max_options=256) == Limits034(64, 256, labeled=False)
