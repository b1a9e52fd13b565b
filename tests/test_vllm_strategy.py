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
