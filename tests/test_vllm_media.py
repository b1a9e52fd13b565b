"""The vLLM plugin with images and videos on the tiny checkpoint (whose vision tower is real, random weights):
vLLM's own processor expands our placeholders into exactly our ids, the pooler is exact on vLLM's hidden
states, and the answers agree with the transformers reference as closely as text requests do."""

from __future__ import annotations

import pytest
import torch
from media_files import image_b64, video_b64
from plugins.engines import ENGINE_MAX_MODEL_LEN
from test_vllm_plugin import MAX_ABS_DP, MIN_TOP1_AGREEMENT, _reference_head_logits, agreement
from workloads import short_requests

from clef_quant.bench.workload import image_requests
from clef_quant.reference import ReferenceScorer
from clef_vllm.engine.prompt import engine_prompt
from clef_vllm.format.request import parse_request


def _short(body: dict) -> dict:
    """States cut to ~60 words: the transformers reference runs media records one at a time on two cores."""
    state = body["state"]
    if isinstance(state, dict):
        return dict(body, state=dict(state, text=state["text"][:400]))
    return dict(body, state=state[:400])


def media_bodies() -> list[dict]:
    """8 image requests (one image each, sizes 48-160 px), 2 with two images, 2 with a video or image+video."""
    bodies = image_requests(8, seed=3)
    for index, body in enumerate(image_requests(2, seed=4, images_per_request=2)):
        bodies.append(dict(body, id=f"two-{index}"))
    for index, body in enumerate(short_requests(2, seed=5)):
        body["videos"] = [video_b64(1.5 + index, 8 + 2 * index, 64 + 16 * index, 48)]
        if index % 2:
            body["images"] = [image_b64(72, 40)]
        bodies.append(body)
    return [_short(body) for body in bodies]


@pytest.fixture(scope="module")
def bodies() -> list[dict]:
    return media_bodies()


@pytest.mark.slow
def test_pooler_equals_head_on_vllm_hidden_states_of_media_requests(tiny_dir, clef_engine, bodies):
    from vllm.config import PoolerConfig

    classify = clef_engine(tiny_dir, max_num_batched_tokens=4096)
    embed = clef_engine(tiny_dir, max_num_batched_tokens=4096, pooler_config=PoolerConfig(task="token_embed"))
    chosen = [bodies[0], bodies[8], bodies[-1]]  # one image, two images, image + video
    encodings = [classify.encode(body)[1] for body in chosen]
    logits = classify.logits(encodings)
    hidden = embed.llm.encode([engine_prompt(e) for e in encodings], pooling_task="token_embed", use_tqdm=False)
    for encoding, pooled, states in zip(encodings, logits, hidden, strict=True):
        assert list(states.prompt_token_ids) == encoding.input_ids  # vLLM expanded the placeholders as we did
        assert states.outputs.data.shape[0] == encoding.num_tokens
        expected = _reference_head_logits(tiny_dir, states.outputs.data, encoding)
        assert (pooled - expected).abs().max().item() <= 1e-5


@pytest.fixture(scope="module")
def reference_media_scores(tiny_dir, bodies):
    scorer = ReferenceScorer(tiny_dir, dtype=torch.bfloat16, max_length=ENGINE_MAX_MODEL_LEN)
    return [record.response for record in scorer.score([parse_request(body) for body in bodies])]


@pytest.mark.slow
def test_bf16_plugin_agrees_with_transformers_on_media_requests(tiny_dir, clef_engine, bodies, reference_media_scores):
    """Same bounds as text requests (noise floor there: top-1 0.959, max |dp| 0.023; bounds 0.85 and 0.05): the
    vision tower in bf16 adds its own rounding on both sides but must not move answers further than the text
    model does. Measured here: top-1 1.000, max |dp| 0.019 (0.029 on a 24-request variant)."""
    engine = clef_engine(tiny_dir, max_num_batched_tokens=4096)
    responses = engine.score(bodies)
    for ref, cand in zip(reference_media_scores, responses, strict=True):
        assert cand["usage"] == ref["usage"]  # same expanded prompt length on both sides
        assert list(cand["answers"]) == list(ref["answers"])
    top1, max_dp = agreement(reference_media_scores, responses)
    print(f"bf16 plugin vs transformers bf16, media requests: top-1 agreement {top1:.3f}, max |dp| {max_dp:.4f}")
    assert top1 >= MIN_TOP1_AGREEMENT
    assert max_dp <= MAX_ABS_DP
    # the images reach the model: without them, answers move
    text_only = engine.score([{k: v for k, v in body.items() if k != "images"} for body in bodies[:8]])
    assert agreement(responses[:8], text_only)[1] > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4"])
def test_quantized_folders_answer_media_requests(quantized_dir, clef_engine, bodies, reference_media_scores, scheme):
    """The vision tower stays bf16 in quantized folders; the language model runs through the FP8 / NVFP4 kernels.
    Bounds as for text requests through the same folders (test_vllm_plugin: random tiny weights amplify the
    quantization error, so they say the folder answers like its source, not how good the scheme is)."""
    from test_vllm_plugin import QUANTIZED_MIN_TOP1

    engine = clef_engine(quantized_dir(scheme), max_num_batched_tokens=4096)
    responses = engine.score(bodies)
    for ref, cand in zip(reference_media_scores, responses, strict=True):
        assert cand["usage"] == ref["usage"]
        assert list(cand["answers"]) == list(ref["answers"])
    top1, max_dp = agreement(reference_media_scores, responses)
    print(f"{scheme} plugin vs transformers bf16, media requests: top-1 agreement {top1:.3f}, max |dp| {max_dp:.4f}")
    assert top1 >= QUANTIZED_MIN_TOP1[scheme]
