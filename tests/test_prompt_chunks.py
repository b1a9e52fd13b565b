"""`--prompt-chunk N` (`prompt_chunk=N` in Python): long prompts in pieces of N tokens, one piece per engine step,
requests in flight taking turns. A short request is answered between the pieces of long ones instead of after them,
and every request still gets the same bits whatever else is in flight."""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from servers import systemone

from clef_quant.bench.workload import sentence
from clef_vllm.engine.pooling_contract import pooling_params
from clef_vllm.engine.prompt import engine_prompt
from clef_vllm.engine.settings import schedule_args
from clef_vllm.errors import SettingsError
from clef_vllm.format.answers import flat_probabilities

CHUNK = 256


def body(name: str, words: int, seed: int) -> dict[str, Any]:
    state = sentence(random.Random(seed), words)
    questions = {"kind": {"type": "choice", "criteria": {"a": "", "b": "", "c": ""}}, "yes": {"type": "noul"}}
    return {"model": "m", "id": name, "state": state, "questions": questions}


LONG_A, LONG_B = body("long-a", 350, 1), body("long-b", 450, 2)
SHORTS = [body(f"short-{i}", 6 + 3 * i, 10 + i) for i in range(3)]


@pytest.fixture(scope="module")
def chunked(clef_engine: Any, tiny_dir: Path) -> Any:
    return clef_engine(tiny_dir, prompt_chunk=CHUNK, language_model_only=True)


def test_a_long_prompt_gets_the_same_bits_alone_and_among_others(chunked: Any) -> None:
    encodings = {b["id"]: chunked.encode(b)[1] for b in [LONG_A, LONG_B, *SHORTS]}
    assert encodings["long-a"].num_tokens > 2 * CHUNK and encodings["long-b"].num_tokens > 3 * CHUNK
    alone = {name: chunked.logits([encoding])[0] for name, encoding in encodings.items()}
    order = ["short-0", "long-b", "short-1", "long-a", "short-2"]
    together = dict(zip(order, chunked.logits([encodings[n] for n in order]), strict=True))
    twice = chunked.logits([encodings["long-a"], encodings["long-a"], encodings["short-0"]])
    assert all(torch.equal(alone[name], together[name]) for name in order)
    assert torch.equal(twice[0], alone["long-a"]) and torch.equal(twice[1], alone["long-a"])


def test_pieces_answer_within_rounding_of_the_whole_prompt(chunked: Any, clef_engine: Any, tiny_dir: Path) -> None:
    whole = clef_engine(tiny_dir)  # the suite's engine: the vision tower it loads does not touch text prompts
    encoding = chunked.encode(LONG_B)[1]
    counts = [len(options) for options in encoding.option_spans]
    pieces = flat_probabilities(chunked.logits([encoding])[0], counts)
    at_once = flat_probabilities(whole.logits([whole.encode(LONG_B)[1]])[0], counts)
    assert (pieces - at_once).abs().max() < 0.01


def test_a_short_request_is_answered_between_the_pieces_of_long_ones(chunked: Any) -> None:
    engine = chunked.llm.llm_engine
    sizes = {}
    for request in [LONG_A, LONG_B, SHORTS[0]]:  # the short one arrives last
        encoding = chunked.encode(request)[1]
        sizes[request["id"]] = encoding.num_tokens
        engine.add_request(request["id"], engine_prompt(encoding), pooling_params(encoding))
    finished_at: dict[str, int] = {}
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        finished_at |= {output.request_id: step for output in engine.step() if output.finished}
    # One piece per step: one step for the short one, and ceil(tokens / CHUNK) for each long one.
    assert step == 1 + math.ceil(sizes["long-a"] / CHUNK) + math.ceil(sizes["long-b"] / CHUNK)
    # Turns: one piece of each long request, then the short one (one step at a time, it would have come last).
    assert finished_at["short-0"] == 3
    assert finished_at["long-a"] < finished_at["long-b"] == step


@pytest.mark.slow
def test_the_server_answers_in_pieces_with_the_offline_engines_bits(chunked: Any, tiny_dir: Path, tmp_path: Path):
    """`clef-systemone --prompt-chunk`: its engine core runs the scheduler in a process of its own, and two long
    requests and a short one sent at once get what the offline engine gives each of them."""
    bodies = [LONG_A, LONG_B, SHORTS[0]]
    flags = ["--prompt-chunk", str(CHUNK), "--language-model-only", "--max-model-len", "4096", "--enforce-eager"]
    with systemone(tiny_dir, tmp_path / "server.log", *flags) as (url, _), ThreadPoolExecutor(len(bodies)) as pool:
        served = list(pool.map(lambda body: httpx.post(f"{url}/v1/systemone", json=body, timeout=120), bodies))
    assert [response.status_code for response in served] == [200, 200, 200]
    assert [response.json() for response in served] == chunked.score(bodies)


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"batch_invariant": False}, "with batch invariance off vLLM already splits prompts"),
        ({"max_num_batched_tokens": 4096}, "leave max_num_batched_tokens out"),
        ({"method": "split-free kernels"}, "this GPU batches whole prompts"),
    ],
)
def test_pieces_are_refused_where_they_would_not_keep_answers_fixed_or_not_help(
    given: dict[str, Any], refused: str
) -> None:
    arguments = {"max_model_len": 4096, "prompt_chunk": 512, "method": "one prompt per step", **given}
    with pytest.raises(SettingsError, match=refused):
        schedule_args(**arguments)


def test_pieces_are_for_text_prompts_only(tiny_dir: Path) -> None:
    from clef_vllm.engine.engine_settings import EngineSettings

    refused = r"--prompt-chunk \(prompt_chunk\) cuts text prompts only: add --language-model-only"
    with pytest.raises(SettingsError, match=refused):
        EngineSettings(model=str(tiny_dir), prompt_chunk=1024).check()
    with pytest.raises(SettingsError, match=refused):
        EngineSettings(model=str(tiny_dir), prompt_chunk=1024).vllm_kwargs()
    EngineSettings(model=str(tiny_dir), prompt_chunk=1024, limit_images=0, limit_videos=0).check()
